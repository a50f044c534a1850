package sqlrewrite

import (
	"strings"
	"testing"
)

// TestUnfenceable: every write to a guarded table that cannot be fenced
// (Guard.Unfenceable) is refused with CodeUnfenceable and a message that
// says why and what to do, whichever form it takes and wherever it is
// nested; reads and DDL (the fix itself) pass; an unqualified name that
// may stand for such a table is refused (fail closed), a qualified name of
// another table is not; an Observe table fences nothing and passes.
func TestUnfenceable(t *testing.T) {
	const why = `it has no epoch column "fence_epoch"; add it: ALTER TABLE b.accounts ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0`
	r, err := New(Config{TokenSetting: "fence.token", Guards: []Guard{
		{Table: "accounts", Column: "fence_epoch"},
		{Schema: "b", Table: "accounts", Column: "fence_epoch", Unfenceable: why},
		{Schema: "public", Table: "watched", Column: "fence_epoch", Rollout: Observe, Unfenceable: why},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql     string
		refused bool
	}{
		{"UPDATE b.accounts SET v = 1 WHERE id = 1", true},
		{"UPDATE accounts SET v = 1 WHERE id = 1", true}, // may be b.accounts
		{"DELETE FROM b.accounts", true},
		{"INSERT INTO b.accounts (id) VALUES (1)", true},
		{"INSERT INTO b.accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET v = 2", true},
		{"MERGE INTO b.accounts t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", true},
		{"COPY b.accounts FROM STDIN", true},
		{"TRUNCATE b.accounts", true},
		{"WITH d AS (DELETE FROM b.accounts RETURNING id) SELECT * FROM d", true},
		{"SELECT 1; UPDATE b.accounts SET v = 1", true},
		{"PREPARE p AS UPDATE b.accounts SET v = $1", true},
		{"EXPLAIN ANALYZE UPDATE b.accounts SET v = 1", true},
		{"UPDATE a.accounts SET v = 1 WHERE id = 1", false}, // another schema's: fenced
		{"SELECT * FROM b.accounts", false},
		{"ALTER TABLE b.accounts ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0", false},
		{"UPDATE watched SET v = 1", false}, // observe: nothing fenced, nothing refused
	} {
		res, err := r.Rewrite(c.sql, Simple, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.refused && (res.Refusal == nil || res.Refusal.Code != CodeUnfenceable):
			t.Errorf("%s: %+v, want refused with %s", c.sql, res.Refusal, CodeUnfenceable)
		case c.refused && (!strings.Contains(res.Refusal.Message, `guarded table "b.accounts"`) || !strings.Contains(res.Refusal.Message, why) || res.Refusal.Hint != hintUnfenceable):
			t.Errorf("%s: message %q hint %q: want the table, why and the fix", c.sql, res.Refusal.Message, res.Refusal.Hint)
		case !c.refused && res.Refusal != nil:
			t.Errorf("%s: refused: %+v", c.sql, res.Refusal)
		}
		if c.refused && res.Refusal != nil {
			// As the server raises it, and as pgfence restates it.
			raised := "pgfence " + res.Refusal.Code + ": " + strings.TrimPrefix(res.Refusal.Message, "pgfence: ")
			if !strings.Contains(res.SQL, raised) {
				t.Errorf("%s: sent %q, which does not raise %q", c.sql, res.SQL, raised)
			}
			back, ok := ParseErrorMarker("22P02", `invalid input syntax for type bigint: "`+raised+`"`)
			if !ok || back.Code != CodeUnfenceable || back.Message != res.Refusal.Message || back.Hint != hintUnfenceable {
				t.Errorf("%s: the marker reads back as %+v (%v)", c.sql, back, ok)
			}
		}
	}
	if a := r.guardNamed("accounts"); a == nil || r.guards[0].Unfenceable != "" {
		t.Fatal("the unqualified guard took the qualified one's state")
	}
}
