package sqlrewrite

import "testing"

// NoRows tells the proxy which rewritten texts a server-side prepared
// statement may hold without its result ever changing shape.
func TestNoRows(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	for _, c := range []struct {
		sql  string
		want bool
	}{
		{"UPDATE accounts SET balance = $1 WHERE id = $2", true},
		{"DELETE FROM accounts WHERE id = $1", true},
		{"INSERT INTO accounts (id, balance) VALUES ($1, $2)", true},
		{"INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance", true},
		{"WITH x AS (SELECT 1) UPDATE accounts SET balance = 1", true},
		{"UPDATE accounts SET balance = $1 WHERE id = $2 RETURNING balance", false},
		{"DELETE FROM accounts WHERE id = $1 RETURNING *", false},
		{"WITH u AS (UPDATE accounts SET balance = 1 RETURNING id) SELECT * FROM u", false},
		{"SELECT * FROM accounts", false}, // not rewritten
		{"UPDATE other SET x = 1", false}, // not rewritten
		{"EXPLAIN ANALYZE UPDATE accounts SET balance = 1", false},
	} {
		res, err := r.Rewrite(c.sql, Prepared, nil)
		if err != nil || res.Refusal != nil {
			t.Fatalf("Rewrite(%q) = %+v, %v", c.sql, res, err)
		}
		if res.NoRows != c.want {
			t.Errorf("Rewrite(%q).NoRows = %v, want %v", c.sql, res.NoRows, c.want)
		}
	}
	// Simple Query texts with several statements are never prepared.
	if res, _ := r.Rewrite("UPDATE accounts SET balance = 1; UPDATE accounts SET balance = 2", Simple, nil); res.NoRows {
		t.Error("two statements: NoRows")
	}
}
