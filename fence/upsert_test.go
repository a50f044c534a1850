package fence_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Simple-protocol upserts run bound to their literals, as other writes do,
// but for those of the ON CONFLICT target, which stay in the text: the
// arbiter is the partial unique index whose predicate the target repeats
// (a parameter there would match none). Fresh ones land stamped with the
// token, stale ones change nothing and count.
func TestBoundUpserts(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, fmt.Sprintf("ALTER TABLE %[1]s ADD COLUMN kind text NOT NULL DEFAULT 'x', ADD COLUMN k int; CREATE UNIQUE INDEX ON %[1]s (k) WHERE kind = 'x'", tbl))
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	simple := func(sql string) string {
		t.Helper()
		tag, err := c.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return tag.String()
	}
	bound := p.Counter(t, "pgfence_bound_queries_total")
	simple("SET fence.token = '10'")
	for i := 2; i <= 4; i++ {
		upsert := fmt.Sprintf("INSERT INTO %s (id, val, k) VALUES (%d, 'new %d', %d) ON CONFLICT (k) WHERE kind = 'x' DO UPDATE SET val = EXCLUDED.val || ' again'", tbl, i, i, i)
		if tag := simple(upsert); tag != "INSERT 0 1" {
			t.Fatalf("fresh upsert %d: %s", i, tag)
		}
		if tag := simple(upsert); tag != "INSERT 0 1" {
			t.Fatalf("fresh upsert %d again (DO UPDATE): %s", i, tag)
		}
		if v, e := row(t, tbl, i); v != fmt.Sprintf("new %d again", i) || e != 10 {
			t.Fatalf("row %d: (%s, %d), want (new %d again, 10)", i, v, e, i)
		}
	}
	if got := p.Counter(t, "pgfence_bound_queries_total") - bound; got != 6 {
		t.Fatalf("%v upserts ran bound, want 6", got)
	}
	simple("SET fence.token = '5'")
	if tag := simple(fmt.Sprintf("INSERT INTO %s (id, val, k) VALUES (9, 'stale', 3) ON CONFLICT (k) WHERE kind = 'x' DO UPDATE SET val = 'stale'", tbl)); tag != "INSERT 0 0" {
		t.Fatalf("stale upsert: %s, want INSERT 0 0", tag)
	}
	if v, e := row(t, tbl, 3); v != "new 3 again" || e != 10 {
		t.Fatalf("row 3 after the stale upsert: (%s, %d)", v, e)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("fencing_reject_total = %v, want 1", got)
	}
}

// A multi-row INSERT reads and checks the token at its first row and casts
// it at the others: a missing or malformed token still fails the statement
// with pgfence's own error, whatever the protocol and plan, and a good one
// stamps every row alike.
func TestMultiRowInsertToken(t *testing.T) {
	tbl := table(t)
	p := pgtest.StartProxy(t, []string{tbl})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			c := p.Connect(t)
			pgtest.Exec(t, c, "SET plan_cache_mode = force_generic_plan")
			insert := "INSERT INTO " + tbl + " (id, val) VALUES ($1, 'a'), ($2, 'b'), ($3, 'c')"
			base := 10 * (int(mode) + 1)
			for _, tc := range []struct{ set, code string }{{"RESET fence.token", "55000"}, {"SET fence.token = '5x'", "22023"}, {"SET fence.token = ''", "55000"}} {
				pgtest.Exec(t, c, tc.set)
				_, err := c.Exec(ctx, insert, mode, base, base+1, base+2)
				if pe := pgErr(t, err); pe.Code != tc.code {
					t.Fatalf("%s: %s %s, want %s", tc.set, pe.Code, pe.Message, tc.code)
				}
			}
			pgtest.Exec(t, c, "SET fence.token = ' 7 '")
			if tag, err := c.Exec(ctx, insert, mode, base, base+1, base+2); err != nil || tag.String() != "INSERT 0 3" {
				t.Fatalf("good token: %v %v", tag, err)
			}
			for id := base; id < base+3; id++ {
				if _, e := row(t, tbl, id); e != 7 {
					t.Fatalf("row %d stamped %d, want 7", id, e)
				}
			}
		})
	}
}
