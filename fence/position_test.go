package fence_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Postgres says where in a statement an error is (psql's LINE 1: ... ^). For
// a fenced statement it says where in pgfence's rewrite; the client must
// see where in its own text, exactly as Postgres would have said.

// positionModes are the ways a driver sends a statement: a Query with the
// values in the text, the unnamed statement, a named one.
var positionModes = []string{"simple_protocol", "exec", "cache_statement"}

func TestErrorPositions(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	statements := []string{
		"UPDATE %[1]s SET nosuch = 0 WHERE id = 1",
		"UPDATE %[1]s SET val = 'é' WHERE nosuch = 12345678901",
		"INSERT INTO %[1]s (id, val) VALUES (7, 'ü'), (8, 'x'::int)",
		"DELETE FROM %[1]s /* ä */ WHERE id = 1.5 AND nosuch",
		"WITH d AS (DELETE FROM %[1]s WHERE id = 9 RETURNING id) UPDATE %[1]s SET val = 'c' WHERE nosuch IN (SELECT id FROM d)",
		"UPDATE %[1]s SET val = 'a' WHERE id = 1; UPDATE %[1]s SET val = 'b' WHERE nosuch = 2", // simple protocol only
		// Values Postgres cannot read: a string bound as a parameter fails
		// at its literal, and with no word of a parameter.
		"UPDATE %[1]s SET val = 'é''s', id = 'x1' WHERE val = 'ü'",
		"DELETE FROM %[1]s WHERE val = 'a' AND id = '1.5'::int",
		"UPDATE %[1]s SET val = 'b' WHERE id = 1 AND val::jsonb = '{\"a\": x}'",
	}
	comparePositions(t, "postgres", tbl, statements)
}

// Postgres counts positions in characters, but in a SQL_ASCII database in
// bytes. They differ where pgfence's text has a non-ASCII table name
// before the error.
func TestErrorPositionsNonASCII(t *testing.T) {
	pgtest.Need(t)
	statements := []string{
		"UPDATE %[1]s SET val = 'héhé' WHERE nosuch = 1",
		"UPDATE %[1]s SET val = 'é' WHERE id = 1; DELETE FROM %[1]s WHERE nosuch",
		"INSERT INTO %[1]s (id, val) VALUES (1, 'ü'); UPDATE %[1]s SET val = 'é' WHERE nosuch = 'ä'",
	}
	for _, db := range []string{"postgres", "pos_ascii"} {
		t.Run(db, func(t *testing.T) {
			if db != "postgres" {
				direct := pgtest.Direct(t)
				pgtest.Exec(t, direct, "DROP DATABASE IF EXISTS "+db)
				pgtest.Exec(t, direct, "CREATE DATABASE "+db+" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
				t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
			}
			c := pgtest.Connect(t, pgtest.Server().URL(db))
			pgtest.Exec(t, c, `DROP TABLE IF EXISTS tëst; CREATE TABLE tëst (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)`)
			t.Cleanup(func() { pgtest.Exec(t, pgtest.Connect(t, pgtest.Server().URL(db)), "DROP TABLE IF EXISTS tëst") })
			comparePositions(t, db, "tëst", statements)
		})
	}
}

// comparePositions runs each statement (a format of the table's name) on
// a guarded table of database db through pgfence and straight to
// Postgres, in each positionMode, and fails unless both fail alike, at the
// same position.
func comparePositions(t *testing.T, db, tbl string, statements []string) {
	t.Helper()
	p := pgtest.StartProxy(t, []string{tbl})
	for _, mode := range positionModes {
		direct := pgtest.Connect(t, pgtest.Server().URL(db)+"&default_query_exec_mode="+mode)
		proxied, _ := url.Parse(p.URL("default_query_exec_mode=" + mode))
		proxied.Path = "/" + db
		fenced := pgtest.Connect(t, proxied.String())
		pgtest.Exec(t, fenced, "SET fence.token = '5'")
		for _, f := range statements {
			sql := fmt.Sprintf(f, tbl)
			if mode != "simple_protocol" && strings.Count(sql, ";") > 0 {
				continue // one statement per Parse
			}
			want, got := pgError(t, direct, sql), pgError(t, fenced, sql)
			if want.Position == 0 {
				t.Fatalf("%s, %s: Postgres gives no position: the test needs one (%v)", mode, sql, want)
			}
			if got.Code != want.Code || got.Message != want.Message || got.Position != want.Position ||
				got.Detail != want.Detail || got.Where != want.Where {
				t.Errorf("%s, %s:\n through pgfence %s %q at %d (%q, %q)\n straight to Postgres %s %q at %d (%q, %q)",
					mode, sql, got.Code, got.Message, got.Position, got.Detail, got.Where,
					want.Code, want.Message, want.Position, want.Detail, want.Where)
			}
		}
	}
}

// An error in text pgfence added has no place in the client's: it comes
// without a position, rather than with one pointing at the wrong thing.
func TestErrorPositionInPgfenceText(t *testing.T) {
	tbl := "no_epoch_" + fmt.Sprint(time.Now().UnixNano()%1e9)
	pgtest.Exec(t, pgtest.Direct(t), "CREATE TABLE "+tbl+" (id int PRIMARY KEY, v int)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE "+tbl) })
	p := pgtest.StartProxy(t, []string{tbl}) // guarded, but it has no fence_epoch column
	for _, mode := range positionModes {
		c := p.Connect(t, "default_query_exec_mode="+mode)
		pgtest.Exec(t, c, "SET fence.token = '5'")
		e := pgError(t, c, "UPDATE "+tbl+" SET v = 2 WHERE id = 1")
		if e.Code != "42703" || !strings.Contains(e.Message, "fence_epoch") || e.Position != 0 {
			t.Errorf("%s: %s %q at %d, want 42703 naming fence_epoch, at no position", mode, e.Code, e.Message, e.Position)
		}
	}
}

func pgError(t *testing.T, c *pgx.Conn, sql string) *pgconn.PgError {
	t.Helper()
	_, err := c.Exec(context.Background(), sql)
	var e *pgconn.PgError
	if !errors.As(err, &e) {
		t.Fatalf("%s: %v, want a Postgres error", sql, err)
	}
	return e
}
