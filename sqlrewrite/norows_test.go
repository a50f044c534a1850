package sqlrewrite

import (
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

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

// A text without a write keyword outside its literals, identifiers and
// comments is passed without a parse; one with any goes to the parser.
func TestHasWriteKeyword(t *testing.T) {
	mayWrite := func(sql string) bool {
		scan, err := pg_query.Scan(sql)
		return err != nil || hasWriteKeyword(scan.Tokens)
	}
	for _, c := range []struct {
		sql  string
		want bool
	}{
		{"SELECT * FROM accounts WHERE id = 1", false},
		{"SELECT 'UPDATE accounts SET x = 1' FROM accounts", false},
		{`SELECT "update" FROM accounts -- DELETE FROM accounts`, false},
		{"SELECT $$INSERT INTO accounts VALUES (1)$$, /* COPY accounts FROM stdin */ 1", false},
		{"PREPARE q AS SELECT * FROM accounts", false},
		{"SELECT * FROM accounts FOR UPDATE", true}, // conservative
		{"UPDATE accounts SET x = 1", true},
		{"WITH d AS (DELETE FROM accounts RETURNING *) SELECT * FROM d", true},
		{"insert into accounts (id) values (1)", true},
		{"MERGE INTO accounts USING s ON true WHEN MATCHED THEN DELETE", true},
		{"TRUNCATE accounts", true},
		{"COPY accounts FROM stdin", true},
		{"EXECUTE pay(1)", true},
		{"EXPLAIN ANALYZE UPDATE accounts SET x = 1", true},
		{"SELECT 'unterminated FROM accounts", true}, // does not scan: the parser judges
	} {
		if got := mayWrite(c.sql); got != c.want {
			t.Errorf("mayWrite(%q) = %v, want %v", c.sql, got, c.want)
		}
	}
	// Passed texts are the input itself, with nothing fenced or probed.
	r := mustNew(t, "fence.token", "accounts")
	res, err := r.Rewrite("SELECT * FROM accounts WHERE id = 1", Simple, nil)
	if err != nil || res.SQL != "SELECT * FROM accounts WHERE id = 1" || len(res.Fenced)+len(res.Probes) > 0 || res.Refusal != nil {
		t.Errorf("read-only text: %+v, %v", res, err)
	}
}
