package fence_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// A strict guard (Enforce, token required) checks the token once per
// statement, before any row is read, outside and inside a lock domain: a
// missing, empty or non-integer token fails every fenced write form with
// pgfence's own error even when the write matches no row; a token made of
// integer characters that is still no bigint fails with Postgres's cast
// error; a valid one (white space around it allowed) fences by epoch.
func TestStrictTokenCheck(t *testing.T) {
	for _, domain := range []string{"", "strict_check"} {
		name := "row only"
		if domain != "" {
			name = "lock domain"
		}
		t.Run(name, func(t *testing.T) {
			tbl := table(t, [3]any{1, "v", 10})
			// An index on the epoch gives the planner one more way to use
			// the token while it plans.
			pgtest.Exec(t, pgtest.Direct(t), "CREATE INDEX ON "+tbl+" (fence_epoch)")
			pgtest.Exec(t, pgtest.Direct(t), "ANALYZE "+tbl)
			var opts []func(*proxy.Config, *fence.Config)
			if domain != "" {
				opts = append(opts, inDomain(t, domain))
			}
			p := pgtest.StartProxy(t, []string{tbl}, opts...)
			writes := []string{
				"UPDATE " + tbl + " SET val = 'w' WHERE id = 1",
				"UPDATE " + tbl + " SET val = 'w' WHERE id = 999", // matches nothing
				"UPDATE " + tbl + " SET val = 'w'",
				"DELETE FROM " + tbl + " WHERE id = 1",
				"DELETE FROM " + tbl + " WHERE id = 999",
				"INSERT INTO " + tbl + " AS t (id, val) VALUES (1, 'w') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val",
				"INSERT INTO " + tbl + " AS t (id, val) VALUES (1, 'w') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val WHERE t.val = 'no such'",
			}
			const unset = "<unset>"
			for _, c := range []struct {
				token, code string // code "": any error
			}{
				{unset, "55000"}, {"", "55000"},
				{"abc", "22023"}, {"12x", "22023"}, {"0x10", "22023"}, {"1.5", "22023"},
				{"1-2", ""}, {"+", ""}, {"  ", ""}, {"99999999999999999999", ""},
			} {
				for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
					conn := p.Connect(t)
					if c.token != unset {
						pgtest.Exec(t, conn, "SELECT pg_catalog.set_config('fence.token', $1, false)", c.token)
					}
					for _, sql := range writes {
						tag, err := conn.Exec(ctx, sql, mode)
						if err == nil {
							t.Fatalf("token %q, %v: %s succeeded (%s)", c.token, mode, sql, tag)
						}
						pe := pgErr(t, err)
						// Upserts in a lock domain first read the token in the
						// domain's check, whose error names the domain.
						named := strings.Contains(pe.Message, tbl) || domain != "" && strings.Contains(pe.Message, `lock domain "`+domain+`"`)
						if c.code != "" && (pe.Code != c.code || !named) {
							t.Errorf("token %q, %v: %s: %s %q, want %s naming the table", c.token, mode, sql, pe.Code, pe.Message, c.code)
						}
					}
					conn.Close(ctx)
				}
			}
			if v, e := row(t, tbl, 1); v != "v" || e != 10 {
				t.Fatalf("a write with a bad token changed the row: (%s, %d)", v, e)
			}
			if domain != "" {
				var n int
				pgtest.Direct(t).QueryRow(ctx, "SELECT count(*) FROM pgfence.domains WHERE domain = $1 AND token = -9223372036854775808", domain).Scan(&n)
				if n != 1 {
					t.Fatal("a write with a bad token claimed the lock domain")
				}
			}

			// Valid tokens, rising (a lower one after a higher one would be
			// stale for the whole lock domain).
			pgtest.Exec(t, pgtest.Direct(t), "INSERT INTO "+tbl+" VALUES (2, 'two', 50)")
			conn := p.Connect(t)
			step := func(token, sql, wantTag string, id int, wantVal string, wantEpoch int64) {
				t.Helper()
				pgtest.Exec(t, conn, "SELECT pg_catalog.set_config('fence.token', $1, false)", token)
				if tag := pgtest.Exec(t, conn, sql); tag != wantTag {
					t.Fatalf("token %q: %s: %s, want %s", token, sql, tag, wantTag)
				}
				if v, e := row(t, tbl, id); v != wantVal || e != wantEpoch {
					t.Fatalf("token %q: %s: row %d is (%s, %d), want (%s, %d)", token, sql, id, v, e, wantVal, wantEpoch)
				}
			}
			step("5", "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1", "UPDATE 0", 1, "v", 10)
			step(" 10\t", "UPDATE "+tbl+" SET val = 'equal' WHERE id = 1", "UPDATE 1", 1, "equal", 10)
			step("+12", "UPDATE "+tbl+" SET val = 'fresh' WHERE id = 1", "UPDATE 1", 1, "fresh", 12)
			step("12", "DELETE FROM "+tbl+" WHERE id = 2", "DELETE 0", 2, "two", 50)
			upsert := "INSERT INTO " + tbl + " AS t (id, val) VALUES (2, 'up') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val"
			step("13", upsert, "INSERT 0 0", 2, "two", 50)
			step("50", upsert, "INSERT 0 1", 2, "up", 50)
			step("60", upsert, "INSERT 0 1", 2, "up", 60)
			step("60", "UPDATE "+tbl+" SET val = 'all'", "UPDATE 2", 1, "all", 60)
			rowRejects, domRejects := p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=row"), p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=domain")
			if rowRejects != 3 || domRejects != 0 {
				t.Fatalf("fencing_reject_total kind=row %v, kind=domain %v; want 3 (stale UPDATE, DELETE and upsert) and 0", rowRejects, domRejects)
			}
		})
	}
}
