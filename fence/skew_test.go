package fence_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// What pgfence, reading SQL with PostgreSQL 17's grammar, does with texts
// the server reads otherwise (issue 27; see sqlrewrite/skew.go), on each
// version (make test-versions): system_user is a plain column name up to
// PostgreSQL 15 and a reserved word to pgfence's parser (and to the server
// from 16 on); JSON_TABLE and MERGE ... RETURNING are new in 17.
func TestGrammarSkew(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 10})
	plain := "plain_grammar_skew" // its name must not hold the guarded one
	db := pgtest.Direct(t)
	v := pgtest.Version(t)
	// Quoted, system_user is a column name on every version.
	pgtest.Exec(t, db, "ALTER TABLE "+tbl+` ADD COLUMN "system_user" text`)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS "+plain+"; CREATE TABLE "+plain+` (id int PRIMARY KEY, "system_user" text); INSERT INTO `+plain+" VALUES (1, NULL)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+plain) })
	p := pgtest.StartProxy(t, []string{tbl})

	// guarded reads the guarded row straight from Postgres.
	guarded := func(t *testing.T) (su *string, epoch int64) {
		t.Helper()
		if err := pgtest.Direct(t).QueryRow(ctx, `SELECT "system_user", fence_epoch FROM `+tbl+" WHERE id = 1").Scan(&su, &epoch); err != nil {
			t.Fatal(err)
		}
		return su, epoch
	}
	// unreadable is what pgfence answers a text that may write the guarded
	// table and that its parser cannot read (perr): 42601 up to the
	// parser's grammar (17), a version skew (0A000) on a newer server.
	unreadable := func(t *testing.T, err error, perr string) {
		t.Helper()
		pe := pgErr(t, err)
		skew := `(PostgreSQL 17's grammar): ` + perr + `; `
		switch {
		case v.Major() > 17:
			skew += fmt.Sprintf("the server runs %s, whose grammar is newer (a version skew)", v)
			if pe.Code != "0A000" || !strings.HasPrefix(pe.Message, "pgfence: cannot read this statement") || !strings.Contains(pe.Message, skew) ||
				!strings.HasPrefix(pe.Hint, "write the statement in syntax that PostgreSQL 17 reads too") {
				t.Errorf("%s %q (hint %q), want 0A000 with %q", pe.Code, pe.Message, pe.Hint, skew)
			}
		case pe.Code != "42601" || !strings.HasPrefix(pe.Message, "pgfence: cannot read this statement") || !strings.Contains(pe.Message, skew) || pe.Hint == "":
			t.Errorf("%s %q (hint %q), want 42601 with %q", pe.Code, pe.Message, pe.Hint, skew)
		}
	}
	const (
		message = `pgfence: cannot read this statement, which may write a guarded table, with pgfence's parser (PostgreSQL 17's grammar): ` +
			`syntax error at or near "system_user"; the server may read it differently (a word that became a keyword in PostgreSQL 16 or 17, ` +
			`such as system_user, is a plain name on older servers), but pgfence refuses what it cannot read rather than send it unfenced: ` +
			`write such a name in double quotes ("system_user")`
		hint = `if system_user is a name in this statement, write it in double quotes, "system_user", ` +
			`which every PostgreSQL version reads as a name; if the statement is wrong on your server too, correct it`
	)

	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"simple", simple}, {"extended", prepared}} {
		t.Run(m.name, func(t *testing.T) {
			pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+` SET "system_user" = NULL, fence_epoch = 10 WHERE id = 1`)
			c := p.Connect(t)
			exec(t, c, simple, "SET fence.token = '10'")

			// A guarded table's system_user column, unquoted: Postgres 15
			// would run it, pgfence cannot read it, so it is refused, and
			// says why. (From 16 on the server cannot read it either.)
			_, err := c.Exec(ctx, "UPDATE "+tbl+" SET system_user = 'x' WHERE id = 1", m.mode)
			if pe := pgErr(t, err); v.Major() <= 17 && (pe.Code != "42601" || pe.Message != message || pe.Hint != hint) {
				t.Errorf("unquoted system_user on a guarded table: %s %q (hint %q), want 42601\n%s\nhint %s", pe.Code, pe.Message, pe.Hint, message, hint)
			}
			unreadable(t, err, `syntax error at or near "system_user"`)
			if su, epoch := guarded(t); su != nil || epoch != 10 {
				t.Fatalf("after the refusal: (%v, %d), want (NULL, 10)", su, epoch)
			}

			// Quoted, it is read, fenced and written ...
			if tag := exec(t, c, m.mode, "UPDATE "+tbl+` SET "system_user" = 'y' WHERE id = 1`); tag != "UPDATE 1" {
				t.Fatalf(`quoted "system_user": %s, want UPDATE 1`, tag)
			}
			if su, epoch := guarded(t); su == nil || *su != "y" || epoch != 10 {
				t.Fatalf("after the quoted write: (%v, %d), want (y, 10)", su, epoch)
			}
			// ... and a stale token changes nothing.
			exec(t, c, simple, "SET fence.token = '9'")
			if tag := exec(t, c, m.mode, "UPDATE "+tbl+` SET "system_user" = 'z' WHERE id = 1`); tag != "UPDATE 0" {
				t.Fatalf(`quoted "system_user" with a stale token: %s, want UPDATE 0`, tag)
			}
			if su, epoch := guarded(t); su == nil || *su != "y" || epoch != 10 {
				t.Fatalf("after the stale write: (%v, %d), want (y, 10)", su, epoch)
			}
			exec(t, c, simple, "SET fence.token = '10'")

			// An unguarded table's is not pgfence's business: Postgres 15
			// runs it, 16 and later refuse it with their own error.
			sql := "UPDATE " + plain + " SET system_user = '" + m.name + "' WHERE id = 1"
			if v.Major() < 16 {
				if tag := exec(t, c, m.mode, sql); tag != "UPDATE 1" {
					t.Fatalf("unquoted system_user on an unguarded table: %s, want UPDATE 1", tag)
				}
				var su string
				if err := pgtest.Direct(t).QueryRow(ctx, `SELECT "system_user" FROM `+plain+" WHERE id = 1").Scan(&su); err != nil || su != m.name {
					t.Fatalf("unguarded row: %q, %v; want %q", su, err, m.name)
				}
			} else {
				_, err := c.Exec(ctx, sql, m.mode)
				if pe := pgErr(t, err); pe.Code != "42601" || pe.Message != `syntax error at or near "system_user"` || int(pe.Position) != strings.Index(sql, "system_user")+1 {
					t.Errorf("unquoted system_user on an unguarded table on %s: %s %q at %d, want Postgres's own 42601", v, pe.Code, pe.Message, pe.Position)
				}
			}

			// A genuine syntax error on a guarded table is refused by
			// pgfence, which says what the parser said ...
			_, err = c.Exec(ctx, "UPDATE "+tbl+" SET = 1", m.mode)
			unreadable(t, err, `syntax error at or near "="`)
			// ... and on another table Postgres says it, as without pgfence.
			sql = "UPDATE " + plain + " SET = 1"
			_, err = c.Exec(ctx, sql, m.mode)
			if pe := pgErr(t, err); pe.Code != "42601" || pe.Message != `syntax error at or near "="` || int(pe.Position) != strings.Index(sql, "=")+1 {
				t.Errorf("syntax error on an unguarded table: %s %q at %d, want Postgres's own", pe.Code, pe.Message, pe.Position)
			}

			// The reverse skew: pgfence reads what Postgres 16 and older
			// do not, rewrites it as it reads it, and the server refuses
			// it with its own error, at the place in the client's text;
			// from 17 on the server reads it too, and it runs, fenced.
			sql = "UPDATE " + tbl + " SET val = (SELECT x FROM JSON_TABLE('[\"jt\"]', '$[*]' COLUMNS (x text PATH '$')) jt) WHERE id = 1"
			if v.Major() < 17 {
				_, err = c.Exec(ctx, sql, m.mode)
				if pe := pgErr(t, err); pe.Code != "42601" || pe.Message != `syntax error at or near "COLUMNS"` || int(pe.Position) != strings.Index(sql, "COLUMNS")+1 {
					t.Errorf("JSON_TABLE in a fenced write: %s %q at %d, want 42601 at or near COLUMNS at %d", pe.Code, pe.Message, pe.Position, strings.Index(sql, "COLUMNS")+1)
				}
			} else {
				if tag := exec(t, c, m.mode, sql); tag != "UPDATE 1" {
					t.Fatalf("JSON_TABLE in a fenced write on %s: %s, want UPDATE 1", v, tag)
				}
				exec(t, c, simple, "SET fence.token = '9'")
				if tag := exec(t, c, m.mode, sql); tag != "UPDATE 0" {
					t.Fatalf("JSON_TABLE in a stale write on %s: %s, want UPDATE 0", v, tag)
				}
				exec(t, c, simple, "SET fence.token = '10'")
				exec(t, c, simple, "UPDATE "+tbl+" SET val = 'init' WHERE id = 1")
			}
			sql = "MERGE INTO " + plain + " p USING " + tbl + " g ON p.id = g.id WHEN MATCHED THEN UPDATE SET \"system_user\" = 'm' RETURNING *"
			_, err = c.Exec(ctx, sql, m.mode)
			switch {
			case v.Major() < 15: // no MERGE at all
				if pe := pgErr(t, err); pe.Code != "42601" || pe.Message != `syntax error at or near "MERGE"` || pe.Position != 1 {
					t.Errorf("MERGE on %s: %s %q at %d, want 42601 at or near MERGE", v, pe.Code, pe.Message, pe.Position)
				}
			case v.Major() < 17:
				if pe := pgErr(t, err); pe.Code != "42601" || pe.Message != `syntax error at or near "RETURNING"` || int(pe.Position) != strings.Index(sql, "RETURNING")+1 {
					t.Errorf("MERGE ... RETURNING into an unguarded table: %s %q at %d, want 42601 at or near RETURNING", pe.Code, pe.Message, pe.Position)
				}
			case err != nil:
				t.Errorf("MERGE ... RETURNING into an unguarded table on %s: %v", v, err)
			}
			// MERGE into a guarded table is pgfence's to refuse, RETURNING
			// or not.
			_, err = c.Exec(ctx, "MERGE INTO "+tbl+" g USING "+plain+" p ON p.id = g.id WHEN MATCHED THEN UPDATE SET val = 'm' RETURNING *", m.mode)
			if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "MERGE on guarded table") {
				t.Errorf("MERGE ... RETURNING into a guarded table: %s %q, want pgfence's 0A000", pe.Code, pe.Message)
			}
			if v, e := row(t, tbl, 1); v != "init" || e != 10 {
				t.Fatalf("guarded row after the refused statements: (%s, %d), want (init, 10)", v, e)
			}
			// The session goes on.
			if tag := exec(t, c, m.mode, "UPDATE "+tbl+" SET val = 'after' WHERE id = 1"); tag != "UPDATE 1" {
				t.Fatalf("a write after the errors: %s, want UPDATE 1", tag)
			}
			exec(t, c, simple, "UPDATE "+tbl+" SET val = 'init' WHERE id = 1")
		})
	}
}

// Behind a transaction pooler, a text pgfence cannot read that may change
// the token for the session is refused: Postgres 15 would run it, and
// pgfence would not follow the change.
func TestPooledGrammarSkew(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 0})
	plain := "plain_pooled_grammar_skew"
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS "+plain+"; CREATE TABLE "+plain+` (id int PRIMARY KEY, "system_user" text); INSERT INTO `+plain+" VALUES (1, NULL)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+plain) })
	p, _ := pooledProxy(t, 1, tbl)
	c := pooledConn(t, p)
	exec(t, c, simple, "SET fence.token = '10'")

	_, err := c.Exec(ctx, "UPDATE "+plain+" SET system_user = 'x' WHERE id = 1; SET fence.token = '99'", simple)
	if pe := pgErr(t, err); pe.Code != "42601" || !strings.Contains(pe.Message, `(PostgreSQL 17's grammar): syntax error at or near "system_user"; `) ||
		!strings.Contains(pe.Message, "transaction pooler") || pe.Hint == "" {
		t.Errorf("unreadable token change behind a pooler: %s %q (hint %q)", pe.Code, pe.Message, pe.Hint)
	}
	var su *string
	if err := pgtest.Direct(t).QueryRow(ctx, `SELECT "system_user" FROM `+plain+" WHERE id = 1").Scan(&su); err != nil || su != nil {
		t.Fatalf("unguarded row: %v, %v; want NULL", su, err)
	}
	if got := show(t, c); got != "10" {
		t.Fatalf("the token reads %q, want 10", got)
	}
	// Without a word that could change a setting, it goes to the server,
	// which runs it up to PostgreSQL 15 and refuses it from 16 on.
	sql := "UPDATE " + plain + " SET system_user = 'x' WHERE id = 1"
	if v := pgtest.Version(t); v.Major() >= 16 {
		_, err := c.Exec(ctx, sql, simple)
		if pe := pgErr(t, err); pe.Code != "42601" || pe.Message != `syntax error at or near "system_user"` {
			t.Fatalf("unquoted system_user on an unguarded table behind a pooler on %s: %s %q, want Postgres's own 42601", v, pe.Code, pe.Message)
		}
	} else if tag := exec(t, c, simple, sql); tag != "UPDATE 1" {
		t.Fatalf("unquoted system_user on an unguarded table behind a pooler: %s, want UPDATE 1", tag)
	}
}

// PostgreSQL 18's writes through pgfence: RETURNING old and new in UPDATE
// and DELETE (which 17's grammar reads as column references) are fenced,
// a table with a VIRTUAL generated column is fenced, and RETURNING WITH,
// which 17's grammar cannot read, is refused as a version skew. (MERGE ...
// RETURNING old and new runs where the backstop is in place, as any MERGE:
// backstop's TestWritePaths.)
func TestPostgres18Writes(t *testing.T) {
	pgtest.NeedVersion(t, 18, "RETURNING old and new, VIRTUAL generated columns")
	tbl := table(t, [3]any{1, "init", 10})
	pgtest.Exec(t, pgtest.Direct(t), "ALTER TABLE "+tbl+" ADD COLUMN twice int GENERATED ALWAYS AS (id * 2) VIRTUAL")
	p := pgtest.StartProxy(t, []string{tbl})
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"simple", simple}, {"extended", prepared}} {
		t.Run(m.name, func(t *testing.T) {
			pgtest.Exec(t, pgtest.Direct(t), "DELETE FROM "+tbl+" WHERE id <> 1; UPDATE "+tbl+" SET val = 'init', fence_epoch = 10 WHERE id = 1")
			c := p.Connect(t)
			before := rejects(t, p, tbl)
			// returning runs sql and reads its one row's old.val, new.val
			// and new.fence_epoch (n is how many rows it returned).
			returning := func(tok, sql string) (n int, old, new *string, epoch *int64) {
				t.Helper()
				exec(t, c, simple, "SET fence.token = '"+tok+"'")
				rows, err := c.Query(ctx, sql, m.mode)
				if err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
				for rows.Next() {
					n++
					if err := rows.Scan(&old, &new, &epoch); err != nil {
						t.Fatalf("%s: %v", sql, err)
					}
				}
				if err := rows.Err(); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
				return n, old, new, epoch
			}
			update := "UPDATE " + tbl + " SET val = 'a' WHERE id = 1 RETURNING old.val, new.val, new.fence_epoch"
			// A stale holder's UPDATE ... RETURNING old, new changes nothing.
			if n, _, _, _ := returning("9", update); n != 0 {
				t.Fatalf("stale UPDATE ... RETURNING old, new returned %d rows, want none", n)
			}
			if v, e := row(t, tbl, 1); v != "init" || e != 10 {
				t.Fatalf("after the stale UPDATE: (%s, %d), want (init, 10)", v, e)
			}
			// A newer one's lands, stamped, and old and new are the rows
			// before and after.
			if n, o, nw, e := returning("11", update); n != 1 || o == nil || *o != "init" || nw == nil || *nw != "a" || e == nil || *e != 11 {
				t.Fatalf("fresh UPDATE ... RETURNING old, new: %d rows (%v, %v, %v), want (init, a, 11)", n, o, nw, e)
			}
			// The VIRTUAL column, in a predicate: stale changes nothing,
			// fresh lands, stamped.
			byTwice := "UPDATE " + tbl + " SET val = 'v' WHERE twice = 2"
			exec(t, c, simple, "SET fence.token = '10'")
			if tag := exec(t, c, m.mode, byTwice); tag != "UPDATE 0" {
				t.Fatalf("stale UPDATE by a VIRTUAL column: %s, want UPDATE 0", tag)
			}
			exec(t, c, simple, "SET fence.token = '12'")
			if tag := exec(t, c, m.mode, byTwice); tag != "UPDATE 1" {
				t.Fatalf("fresh UPDATE by a VIRTUAL column: %s, want UPDATE 1", tag)
			}
			if v, e := row(t, tbl, 1); v != "v" || e != 12 {
				t.Fatalf("after the UPDATE by a VIRTUAL column: (%s, %d), want (v, 12)", v, e)
			}
			// An INSERT returning it is stamped.
			var twice int
			if err := c.QueryRow(ctx, "INSERT INTO "+tbl+" (id, val) VALUES (2, 'b') RETURNING twice", m.mode).Scan(&twice); err != nil || twice != 4 {
				t.Fatalf("INSERT ... RETURNING a VIRTUAL column: %d, %v; want 4", twice, err)
			}
			if v, e := row(t, tbl, 2); v != "b" || e != 12 {
				t.Fatalf("the inserted row: (%s, %d), want (b, 12)", v, e)
			}
			// A stale DELETE ... RETURNING old, new deletes nothing.
			del := "DELETE FROM " + tbl + " WHERE id = 1 RETURNING old.val, new.val, old.fence_epoch"
			if n, _, _, _ := returning("11", del); n != 0 {
				t.Fatalf("stale DELETE ... RETURNING old, new returned %d rows, want none", n)
			}
			if v, e := row(t, tbl, 1); v != "v" || e != 12 {
				t.Fatalf("after the stale DELETE: (%s, %d), want (v, 12)", v, e)
			}
			if got := rejects(t, p, tbl) - before; got != 3 {
				t.Errorf("fencing_reject_total rose by %v, want 3 (the stale UPDATEs and DELETE)", got)
			}
			// RETURNING WITH, which 17's grammar cannot read: refused, as
			// a version skew, and nothing written.
			exec(t, c, simple, "SET fence.token = '12'")
			_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1 RETURNING WITH (OLD AS o, NEW AS n) o.val, n.val", m.mode)
			if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "a version skew") || !strings.Contains(pe.Message, v18(t)) {
				t.Errorf("RETURNING WITH on a guarded table: %s %q, want 0A000 naming the version skew", pe.Code, pe.Message)
			}
			if v, _ := row(t, tbl, 1); v != "v" {
				t.Fatalf("after the refused RETURNING WITH: %s, want v", v)
			}
		})
	}
}

// v18 names the test server's version as pgfence's refusals do.
func v18(t *testing.T) string { return "the server runs " + pgtest.Version(t).String() }
