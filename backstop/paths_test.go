package backstop_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// baseName is a name of the test's own, short enough that Postgres keeps
// it whole (63 bytes) with a suffix.
func baseName(t *testing.T) string {
	n := tableName(t, "")
	if len(n) > 40 {
		sum := sha256.Sum256([]byte(n))
		n = n[:31] + "_" + hex.EncodeToString(sum[:4])
	}
	return n
}

// helperSchema creates a schema for the test's own objects (views,
// functions, other tables), dropped with everything in it when the test
// ends.
func helperSchema(t *testing.T, s string) {
	t.Helper()
	pgtest.Exec(t, pgtest.Direct(t), "DROP SCHEMA IF EXISTS "+s+" CASCADE; CREATE SCHEMA "+s)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP SCHEMA IF EXISTS "+s+" CASCADE") })
}

// guardOf is the guard of table schema.table (epoch column fence_epoch).
func guardOf(schema, table string) sqlrewrite.Guard {
	return sqlrewrite.Guard{Schema: schema, Table: table, Column: "fence_epoch"}
}

// roleURL connects straight to Postgres as role (trust auth on loopback).
func roleURL(role string) string {
	u, _ := url.Parse(pgtest.DirectURL())
	u.User = url.User(role)
	return u.String()
}

// newRole creates a login role of the test's own (plus attrs), dropped with
// what it owns when the test ends.
func newRole(t *testing.T, name, attrs string) string {
	t.Helper()
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP ROLE IF EXISTS "+name)
	pgtest.Exec(t, db, "CREATE ROLE "+name+" LOGIN "+attrs)
	t.Cleanup(func() {
		db := pgtest.Direct(t)
		pgtest.Exec(t, db, "DROP OWNED BY "+name)
		pgtest.Exec(t, db, "DROP ROLE "+name)
	})
	return name
}

// connectNoticed connects to url with token tok set ("" for none),
// collecting its notices.
func connectNoticed(t *testing.T, u, tok string) (*pgx.Conn, *pgtest.Notices) {
	t.Helper()
	c, ns := pgtest.ConnectNoticed(t, u)
	if tok != "" {
		pgtest.Exec(t, c, "SET fence.token = '"+tok+"'")
	}
	return c, ns
}

// rejects is the backstop's reject count of public.tb in the database.
func rejects(t *testing.T, tb string) int64 {
	t.Helper()
	c, err := backstop.ReadCounts(ctx, pgtest.Direct(t))
	if err != nil {
		t.Fatal(err)
	}
	return c.Rejects["public."+tb]
}

// backstopProxy starts a proxy guarding gs, each with Backstop set, after
// which edit may change the configuration further.
func backstopProxy(t *testing.T, gs []sqlrewrite.Guard, edit ...func(*fence.Config)) *pgtest.Proxy {
	t.Helper()
	var specs []string
	for _, g := range gs {
		specs = append(specs, g.Name())
	}
	key, err := backstop.ReadNoticeKey(ctx, pgtest.Direct(t))
	if err != nil {
		t.Fatal(err)
	}
	return pgtest.StartProxy(t, specs, func(_ *proxy.Config, fc *fence.Config) {
		fc.NoticeKey = key // as serve reads it: the backstop's notices count
		for i := range fc.Guards {
			for _, g := range gs {
				if fc.Guards[i].Schema == g.Schema && fc.Guards[i].Table == g.Table {
					fc.Guards[i].Rollout = g.Rollout
					fc.Guards[i].AllowMissingToken = g.AllowMissingToken
					fc.Guards[i].Domain = g.Domain
				}
			}
			fc.Guards[i].Backstop = true
		}
		for _, e := range edit {
			e(fc)
		}
	})
}

// expand fills a path's SQL template: {t} the guarded table (in public),
// {s} the schema of the test's own objects, {v} the value written, {id}
// the id of a row an INSERT creates.
func expand(tmpl, tb, s, v string, id int) string {
	return strings.NewReplacer("{t}", tb, "{s}", s, "{v}", v, "{id}", fmt.Sprint(id)).Replace(tmpl)
}

// writePath is one way a write reaches a guarded table. The guarded table
// public.{t} has row (1, 'a', epoch 5); a stale write runs with token 3
// and value 'stale', a fresh one with token 7 and value 'fresh'.
type writePath struct {
	name  string
	setup string   // run on a direct superuser connection before the backstop is installed
	extra []string // other guarded tables in {s}, created by setup
	write string   // the write (a template; see expand)
	// run replaces write when a path takes more than one statement; it
	// returns the rows the write reports, -1 for none.
	run func(t *testing.T, c *pgx.Conn, tb, s, v string, id int) (int64, error)
	// count: the write is a SELECT or CALL whose one value is the number
	// of rows written; noCount: the write reports no number of its own
	// rows (DO, a rule's DO ALSO); otherwise the command tag's.
	count, noCount bool
	// cascade: a stale write fails with PF002 (a stale row written by
	// another write's trigger), and parent (a query) reads the same
	// before and after it: no orphan, no half-done write.
	cascade bool
	parent  string
	// insert: the write INSERTs row {id} with a forged epoch (999); it is
	// stamped with the token, stale (3) or fresh (7), and row 1 is left
	// alone.
	insert bool
	// gone: the fresh write deletes row 1; else fresh (default: val is
	// 'fresh') is true of row 1 after it, and its epoch is 7.
	gone  bool
	fresh string
	// direct: only run on a direct connection; through pgfence the
	// rewriter fences (or refuses) the write itself.
	direct bool
	// since is the first major version of Postgres the write runs on (0:
	// every supported one), and feature what it needs of that version:
	// on an older server the path is skipped, saying so.
	since   int
	feature string
}

const viewSetup = `CREATE VIEW {s}.v AS SELECT * FROM public.{t}`

var writePaths = []writePath{
	// Sessions straight to Postgres.
	{name: "plain_update", direct: true, write: `UPDATE public.{t} SET val = '{v}' WHERE id = 1`},
	{name: "plain_delete", direct: true, write: `DELETE FROM public.{t} WHERE id = 1`, gone: true},
	{name: "plain_forged_epoch", direct: true, write: `UPDATE public.{t} SET val = '{v}', fence_epoch = 999 WHERE id = 1`},
	{name: "plain_upsert", direct: true, write: `INSERT INTO public.{t} (id, val) VALUES (1, '{v}') ON CONFLICT (id) DO UPDATE SET val = excluded.val`},
	{name: "plain_insert_forged", direct: true, write: `INSERT INTO public.{t} (id, val, fence_epoch) VALUES ({id}, '{v}', 999)`, insert: true},
	// PostgreSQL 18's RETURNING of the old and new rows (through pgfence
	// the rewriter fences RETURNING old.v, new.v itself, and its parser,
	// of 17's grammar, cannot read RETURNING WITH, which it refuses).
	{name: "plain_update_returning_with", direct: true, since: 18, feature: "RETURNING WITH (OLD AS o, NEW AS n)",
		write: `UPDATE public.{t} SET val = '{v}' WHERE id = 1 RETURNING WITH (OLD AS o, NEW AS n) o.val, n.val, n.fence_epoch`},
	{name: "update_returning_old_new", direct: true, since: 18, feature: "RETURNING old and new",
		write: `UPDATE public.{t} SET val = '{v}' WHERE id = 1 RETURNING old.val, new.val, old.fence_epoch, new.fence_epoch`},
	{name: "delete_returning_old_new", direct: true, since: 18, feature: "RETURNING old and new", gone: true,
		write: `DELETE FROM public.{t} WHERE id = 1 RETURNING old.val, new.val`},
	// A table with a VIRTUAL generated column (new in 18: computed when
	// read, never stored).
	{name: "virtual_generated_column", direct: true, since: 18, feature: "VIRTUAL generated columns",
		setup: `ALTER TABLE public.{t} ADD COLUMN twice int GENERATED ALWAYS AS (id * 2) VIRTUAL`,
		write: `UPDATE public.{t} SET val = '{v}' WHERE id = 1 AND twice = 2`},
	{name: "virtual_generated_column_insert", since: 18, feature: "VIRTUAL generated columns", insert: true,
		setup: `ALTER TABLE public.{t} ADD COLUMN twice int GENERATED ALWAYS AS (id * 2) VIRTUAL`,
		write: `INSERT INTO public.{t} (id, val) VALUES ({id}, '{v}') RETURNING twice`},

	// An auto-updatable view.
	{name: "view_update", setup: viewSetup, write: `UPDATE {s}.v SET val = '{v}' WHERE id = 1`},
	{name: "view_forged_epoch", setup: viewSetup, write: `UPDATE {s}.v SET val = '{v}', fence_epoch = 999 WHERE id = 1`},
	{name: "view_delete", setup: viewSetup, write: `DELETE FROM {s}.v WHERE id = 1`, gone: true},
	{name: "view_upsert", setup: viewSetup, write: `INSERT INTO {s}.v (id, val, fence_epoch) VALUES (1, '{v}', 999)
		ON CONFLICT (id) DO UPDATE SET val = excluded.val, fence_epoch = excluded.fence_epoch`},
	{name: "view_insert_forged", setup: viewSetup, write: `INSERT INTO {s}.v (id, val, fence_epoch) VALUES ({id}, '{v}', 999)`, insert: true},

	// Functions, procedures, DO blocks, dynamic SQL.
	{name: "sql_function", count: true, setup: `CREATE FUNCTION {s}.f(i int, v text) RETURNS bigint LANGUAGE sql AS
		$$ WITH u AS (UPDATE public.{t} SET val = v WHERE id = i RETURNING 1) SELECT count(*) FROM u $$`,
		write: `SELECT {s}.f(1, '{v}')`},
	{name: "sql_function_atomic", since: 14, feature: "BEGIN ATOMIC", noCount: true, setup: `CREATE FUNCTION {s}.f(i int, v text) RETURNS void LANGUAGE sql
		BEGIN ATOMIC UPDATE public.{t} SET val = v WHERE id = i; END`,
		write: `SELECT {s}.f(1, '{v}')`},
	{name: "plpgsql_function", count: true, setup: `CREATE FUNCTION {s}.f(i int, v text) RETURNS bigint LANGUAGE plpgsql AS
		$$ DECLARE n bigint; BEGIN UPDATE public.{t} SET val = v WHERE id = i; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END $$`,
		write: `SELECT {s}.f(1, '{v}')`},
	{name: "plpgsql_function_delete", count: true, gone: true, setup: `CREATE FUNCTION {s}.f(i int) RETURNS bigint LANGUAGE plpgsql AS
		$$ DECLARE n bigint; BEGIN DELETE FROM public.{t} WHERE id = i; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END $$`,
		write: `SELECT {s}.f(1)`},
	{name: "procedure", count: true, setup: `CREATE PROCEDURE {s}.p(i int, v text, INOUT n bigint DEFAULT NULL) LANGUAGE plpgsql AS
		$$ BEGIN UPDATE public.{t} SET val = v WHERE id = i; GET DIAGNOSTICS n = ROW_COUNT; END $$`,
		write: `CALL {s}.p(1, '{v}')`},
	{name: "procedure_commit", noCount: true, setup: `CREATE PROCEDURE {s}.p(i int, v text) LANGUAGE plpgsql AS
		$$ BEGIN UPDATE public.{t} SET val = v WHERE id = i; COMMIT; END $$`,
		write: `CALL {s}.p(1, '{v}')`},
	{name: "do_block", noCount: true, write: `DO $$ BEGIN UPDATE public.{t} SET val = '{v}' WHERE id = 1; END $$`},
	{name: "do_dynamic_execute", noCount: true,
		write: `DO $$ BEGIN EXECUTE format('UPDATE %I.%I SET val = %L WHERE id = 1', 'public', '{t}', '{v}'); END $$`},
	{name: "function_dynamic_execute", count: true, setup: `CREATE FUNCTION {s}.f(i int, v text) RETURNS bigint LANGUAGE plpgsql AS
		$$ DECLARE n bigint; BEGIN EXECUTE format('UPDATE %I.%I SET val = $1 WHERE id = $2', 'public', '{t}') USING v, i;
		GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END $$`,
		write: `SELECT {s}.f(1, '{v}')`},

	// Triggers of other tables and rules.
	{name: "trigger_of_unguarded_table", cascade: true, parent: `SELECT count(*) FROM {s}.log`,
		setup: `CREATE TABLE {s}.log (id int, val text);
		CREATE FUNCTION {s}.tf() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN UPDATE public.{t} SET val = NEW.val WHERE id = NEW.id; RETURN NEW; END $$;
		CREATE TRIGGER tr AFTER INSERT ON {s}.log FOR EACH ROW EXECUTE FUNCTION {s}.tf()`,
		write: `INSERT INTO {s}.log VALUES (1, '{v}')`},
	{name: "rule_instead", setup: `CREATE TABLE {s}.r (id int, val text); INSERT INTO {s}.r VALUES (1, 'r');
		CREATE RULE r AS ON UPDATE TO {s}.r DO INSTEAD UPDATE public.{t} SET val = NEW.val WHERE id = OLD.id`,
		write: `UPDATE {s}.r SET val = '{v}' WHERE id = 1`},
	{name: "rule_also", noCount: true, gone: true, setup: `CREATE TABLE {s}.q (id int, val text);
		CREATE RULE q AS ON INSERT TO {s}.q DO ALSO DELETE FROM public.{t} WHERE id = NEW.id`,
		write: `INSERT INTO {s}.q VALUES (1, '{v}')`},

	// Foreign-key cascades into the guarded table (the child).
	{name: "fk_delete_cascade", cascade: true, gone: true, parent: `SELECT count(*) FROM {s}.p`,
		setup: `CREATE TABLE {s}.p (id int PRIMARY KEY); INSERT INTO {s}.p VALUES (1);
		ALTER TABLE public.{t} ADD COLUMN pid int REFERENCES {s}.p ON DELETE CASCADE ON UPDATE CASCADE;
		UPDATE public.{t} SET pid = 1`,
		write: `DELETE FROM {s}.p WHERE id = 1`},
	{name: "fk_update_cascade", cascade: true, parent: `SELECT string_agg(id::text, ',') FROM {s}.p`,
		fresh: `SELECT pid = 2 FROM public.{t} WHERE id = 1`,
		setup: `CREATE TABLE {s}.p (id int PRIMARY KEY); INSERT INTO {s}.p VALUES (1);
		ALTER TABLE public.{t} ADD COLUMN pid int REFERENCES {s}.p ON DELETE CASCADE ON UPDATE CASCADE;
		UPDATE public.{t} SET pid = 1`,
		write: `UPDATE {s}.p SET id = 2 WHERE id = 1`},
	{name: "fk_set_null", cascade: true, parent: `SELECT count(*) FROM {s}.p`,
		fresh: `SELECT pid IS NULL FROM public.{t} WHERE id = 1`,
		setup: `CREATE TABLE {s}.p (id int PRIMARY KEY); INSERT INTO {s}.p VALUES (1);
		ALTER TABLE public.{t} ADD COLUMN pid int REFERENCES {s}.p ON DELETE SET NULL;
		UPDATE public.{t} SET pid = 1`,
		write: `DELETE FROM {s}.p WHERE id = 1`},
	{name: "fk_cascade_from_guarded_parent", cascade: true, gone: true, extra: []string{"gp"},
		parent: `SELECT string_agg(id || ':' || val || ':' || fence_epoch, ',') FROM {s}.gp`,
		setup: `CREATE TABLE {s}.gp (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO {s}.gp VALUES (1, 'p', 1);
		ALTER TABLE public.{t} ADD COLUMN pid int REFERENCES {s}.gp ON DELETE CASCADE ON UPDATE CASCADE;
		UPDATE public.{t} SET pid = 1`,
		write: `DELETE FROM {s}.gp WHERE id = 1`},
	{name: "fk_update_cascade_from_guarded_parent", cascade: true, extra: []string{"gp"},
		parent: `SELECT string_agg(id || ':' || val || ':' || fence_epoch, ',') FROM {s}.gp`,
		fresh:  `SELECT t.pid = 2 AND gp.fence_epoch = 7 FROM public.{t} t JOIN {s}.gp ON gp.id = t.pid WHERE t.id = 1`,
		setup: `CREATE TABLE {s}.gp (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO {s}.gp VALUES (1, 'p', 1);
		ALTER TABLE public.{t} ADD COLUMN pid int REFERENCES {s}.gp ON DELETE CASCADE ON UPDATE CASCADE;
		UPDATE public.{t} SET pid = 1`,
		write: `UPDATE {s}.gp SET id = 2 WHERE id = 1`},

	// An inheritance parent without the epoch column.
	{name: "inheritance_parent_update", setup: `CREATE TABLE {s}.ip (id int, val text); ALTER TABLE public.{t} INHERIT {s}.ip`,
		write: `UPDATE {s}.ip SET val = '{v}' WHERE id = 1`},
	{name: "inheritance_parent_delete", gone: true, setup: `CREATE TABLE {s}.ip (id int, val text); ALTER TABLE public.{t} INHERIT {s}.ip`,
		write: `DELETE FROM {s}.ip WHERE id = 1`},

	// The forms the rewriter passes to the backstop (Guard.Backstop).
	{name: "merge_update", since: 15, feature: "MERGE", write: `MERGE INTO public.{t} g USING (VALUES (1, '{v}')) AS s(id, val) ON g.id = s.id
		WHEN MATCHED THEN UPDATE SET val = s.val`},
	{name: "merge_delete", since: 15, feature: "MERGE", gone: true, write: `MERGE INTO public.{t} g USING (VALUES (1)) AS s(id) ON g.id = s.id WHEN MATCHED THEN DELETE`},
	{name: "merge_insert", since: 15, feature: "MERGE", insert: true, write: `MERGE INTO public.{t} g USING (VALUES ({id}, '{v}')) AS s(id, val) ON g.id = s.id
		WHEN NOT MATCHED THEN INSERT (id, val) VALUES (s.id, s.val)`},
	// Through pgfence the rewriter refuses a MERGE that assigns the epoch (42501).
	{name: "merge_insert_forged", since: 15, feature: "MERGE", direct: true, insert: true, write: `MERGE INTO public.{t} g USING (VALUES ({id}, '{v}')) AS s(id, val) ON g.id = s.id
		WHEN NOT MATCHED THEN INSERT (id, val, fence_epoch) VALUES (s.id, s.val, 999)`},
	{name: "merge_returning_old_new", since: 18, feature: "MERGE ... RETURNING old and new", write: `MERGE INTO public.{t} g USING (VALUES (1, '{v}')) AS s(id, val) ON g.id = s.id
		WHEN MATCHED THEN UPDATE SET val = s.val RETURNING merge_action(), old.val, new.val, new.fence_epoch`},
	{name: "merge_delete_returning_old", since: 18, feature: "MERGE ... RETURNING old and new", gone: true,
		write: `MERGE INTO public.{t} g USING (VALUES (1)) AS s(id) ON g.id = s.id WHEN MATCHED THEN DELETE RETURNING old.val, new.val`},
	{name: "copy_from", insert: true, run: func(t *testing.T, c *pgx.Conn, tb, _, v string, id int) (int64, error) {
		return c.CopyFrom(ctx, pgx.Identifier{"public", tb}, []string{"id", "val", "fence_epoch"},
			pgx.CopyFromRows([][]any{{int32(id), v, int64(999)}}))
	}},
	{name: "current_of_update", run: currentOf("UPDATE public.{t} SET val = '{v}' WHERE CURRENT OF c")},
	{name: "current_of_delete", gone: true, run: currentOf("DELETE FROM public.{t} WHERE CURRENT OF c")},
}

// currentOf runs write (a template) positioned on row 1 by a cursor.
func currentOf(write string) func(t *testing.T, c *pgx.Conn, tb, s, v string, id int) (int64, error) {
	return func(t *testing.T, c *pgx.Conn, tb, s, v string, id int) (int64, error) {
		tx, err := c.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "DECLARE c CURSOR FOR SELECT * FROM public."+tb+" WHERE id = 1 FOR UPDATE"); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, "FETCH c"); err != nil {
			return 0, err
		}
		tag, err := tx.Exec(ctx, expand(write, tb, s, v, id))
		if err != nil {
			return 0, err
		}
		return tag.RowsAffected(), tx.Commit(ctx)
	}
}

// do runs the path's write on c, returning the rows it reports (-1 for
// none).
func (p writePath) do(t *testing.T, c *pgx.Conn, tb, s, v string, id int) (int64, error) {
	if p.run != nil {
		return p.run(t, c, tb, s, v, id)
	}
	sql := expand(p.write, tb, s, v, id)
	if p.count {
		var n int64
		err := c.QueryRow(ctx, sql).Scan(&n)
		return n, err
	}
	tag, err := c.Exec(ctx, sql)
	if p.noCount {
		return -1, err
	}
	return tag.RowsAffected(), err
}

// query reads one value, as text, on a direct connection.
func query(t *testing.T, sql string) string {
	t.Helper()
	var s *string
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT ("+sql+")::text").Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if s == nil {
		return "<null>"
	}
	return *s
}

func exists(t *testing.T, tb string, id int) bool {
	t.Helper()
	return query(t, fmt.Sprintf("SELECT count(*) FROM public.%s WHERE id = %d", tb, id)) == "1"
}

// TestWritePaths proves the backstop on every write path the issue names,
// on a direct connection and through pgfence with the backstop: a stale
// write (token 3 against a row at epoch 5) changes nothing, reporting 0
// rows or, inside a cascade, failing with PF002 and leaving the parent
// unchanged; the reject is counted (in the database; through pgfence in
// fencing_reject_total{via="backstop"}, without the client seeing the
// backstop's notice); a fresh write (token 7) through the same path lands
// and is stamped with its token, a forged epoch included.
func TestWritePaths(t *testing.T) {
	pgtest.Need(t)
	for _, via := range []string{"direct", "proxy"} {
		t.Run(via, func(t *testing.T) {
			for _, p := range writePaths {
				if p.direct && via == "proxy" {
					continue
				}
				t.Run(p.name, func(t *testing.T) {
					if p.since != 0 {
						pgtest.NeedVersion(t, p.since, p.feature)
					}
					testPath(t, p, via == "proxy")
				})
			}
		})
	}
}

func testPath(t *testing.T, p writePath, viaProxy bool) {
	base := baseName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 5}), base+"_s"
	helperSchema(t, s)
	if p.setup != "" {
		pgtest.Exec(t, pgtest.Direct(t), expand(p.setup, tb, s, "", 0))
	}
	gs := []sqlrewrite.Guard{guardOf("public", tb)}
	for _, e := range p.extra {
		gs = append(gs, guardOf(s, e))
	}
	installGuards(t, backstop.Options{}, gs...)

	url := pgtest.DirectURL()
	var px *pgtest.Proxy
	if viaProxy {
		px = backstopProxy(t, gs)
		url = px.URL()
	}
	proxyRejects := func() float64 {
		return px.Counter(t, "fencing_reject_total", "table=public."+tb, "via=backstop")
	}
	var parent string
	if p.parent != "" {
		parent = query(t, expand(p.parent, tb, s, "", 0))
	}
	dbBefore := rejects(t, tb)
	var pxBefore float64
	if viaProxy {
		pxBefore = proxyRejects()
	}

	// Stale.
	stale, ns := connectNoticed(t, url, "3")
	n, err := p.do(t, stale, tb, s, "stale", 2)
	switch {
	case p.cascade:
		if code(err) != backstop.CodeStaleCascade {
			t.Fatalf("stale write in a cascade: %v (rows %d), want SQLSTATE %s", err, n, backstop.CodeStaleCascade)
		}
		if got := query(t, expand(p.parent, tb, s, "", 0)); got != parent {
			t.Fatalf("the stale cascade's parent changed: %q, was %q", got, parent)
		}
	case err != nil:
		t.Fatalf("stale write: %v", err)
	case p.insert:
		if n >= 0 && n != 1 {
			t.Fatalf("stale INSERT reported %d rows", n)
		}
		if v, e := rowOf(t, tb, 2); v != "stale" || e != 3 {
			t.Fatalf("stale INSERT with a forged epoch: row = %q, epoch %d; want epoch 3 (the token)", v, e)
		}
	case n > 0:
		t.Fatalf("stale write reported %d rows, want 0", n)
	}
	if !exists(t, tb, 1) {
		t.Fatal("the stale write deleted row 1")
	}
	if v, e := rowOf(t, tb, 1); v != "a" || e != 5 {
		t.Fatalf("the stale write changed row 1: %q, epoch %d", v, e)
	}
	wantRejects := 1
	if p.insert {
		wantRejects = 0
	}
	if got := rejects(t, tb) - dbBefore; got != int64(wantRejects) {
		t.Errorf("backstop.ReadCounts: %d rejects counted for public.%s, want %d", got, tb, wantRejects)
	}
	if viaProxy {
		if got := proxyRejects() - pxBefore; got != float64(wantRejects) {
			t.Errorf(`fencing_reject_total{table="public.%s",via="backstop"} grew by %v, want %d`, tb, got, wantRejects)
		}
		if got := ns.Codes(backstop.CodeStaleNotice); got != 0 {
			t.Errorf("a client of pgfence received %d %s notices", got, backstop.CodeStaleNotice)
		}
	} else if got := ns.Codes(backstop.CodeStaleNotice); got != wantRejects {
		t.Errorf("a direct client received %d %s notices, want %d", got, backstop.CodeStaleNotice, wantRejects)
	}

	// Fresh.
	fresh, _ := connectNoticed(t, url, "7")
	n, err = p.do(t, fresh, tb, s, "fresh", 3)
	if err != nil {
		t.Fatalf("fresh write: %v", err)
	}
	if n >= 0 && n != 1 {
		t.Errorf("fresh write reported %d rows, want 1", n)
	}
	switch {
	case p.insert:
		if v, e := rowOf(t, tb, 3); v != "fresh" || e != 7 {
			t.Fatalf("fresh INSERT with a forged epoch: row = %q, epoch %d; want epoch 7", v, e)
		}
		if v, e := rowOf(t, tb, 1); v != "a" || e != 5 {
			t.Fatalf("row 1 changed: %q, epoch %d", v, e)
		}
	case p.gone:
		if exists(t, tb, 1) {
			t.Fatal("the fresh write did not delete row 1")
		}
	default:
		check := p.fresh
		if check == "" {
			check = `SELECT val = 'fresh' FROM public.{t} WHERE id = 1`
		}
		if got := query(t, expand(check, tb, s, "", 0)); got != "true" {
			v, e := rowOf(t, tb, 1)
			t.Fatalf("fresh write: %s is %s; row 1 = %q, epoch %d", check, got, v, e)
		}
		if _, e := rowOf(t, tb, 1); e != 7 {
			t.Fatalf("fresh write: row 1's epoch is %d, want 7 (the token)", e)
		}
	}
}

// TestTruncatePaths: TRUNCATE fires no row trigger; the backstop refuses
// it (0A000) on the guarded table however it is reached (directly, as a
// CASCADE from a parent's, as a child of an inheritance parent), straight
// to Postgres and through pgfence, whatever the token; unless TRUNCATE is
// allowed.
func TestTruncatePaths(t *testing.T) {
	pgtest.Need(t)
	cases := []struct {
		name, setup, sql string
		rewriter         bool // pgfence's rewriter refuses it itself
	}{
		{name: "table", sql: `TRUNCATE public.{t}`, rewriter: true},
		{name: "fk_parent_cascade", setup: `CREATE TABLE {s}.p (id int PRIMARY KEY); INSERT INTO {s}.p VALUES (1);
			ALTER TABLE public.{t} ADD COLUMN pid int REFERENCES {s}.p; UPDATE public.{t} SET pid = 1`,
			sql: `TRUNCATE {s}.p CASCADE`},
		{name: "inheritance_parent", setup: `CREATE TABLE {s}.ip (id int, val text); ALTER TABLE public.{t} INHERIT {s}.ip`,
			sql: `TRUNCATE {s}.ip`},
	}
	for _, via := range []string{"direct", "proxy"} {
		for _, allow := range []bool{false, true} {
			for _, c := range cases {
				name := via + "/" + c.name
				if allow {
					name = via + "/allowed_" + c.name
				}
				t.Run(name, func(t *testing.T) {
					base := baseName(t)
					tb, s := guarded(t, base, [3]any{1, "a", 5}), base+"_s"
					helperSchema(t, s)
					if c.setup != "" {
						pgtest.Exec(t, pgtest.Direct(t), expand(c.setup, tb, s, "", 0))
					}
					installGuards(t, backstop.Options{AllowTruncate: allow}, guardOf("public", tb))
					url := pgtest.DirectURL()
					if via == "proxy" {
						px := backstopProxy(t, []sqlrewrite.Guard{guardOf("public", tb)}, func(fc *fence.Config) { fc.Allow.Truncate = allow })
						url = px.URL()
					}
					conn, _ := connectNoticed(t, url, "7")
					_, err := conn.Exec(ctx, expand(c.sql, tb, s, "", 0))
					if allow {
						if err != nil {
							t.Fatalf("allowed TRUNCATE: %v", err)
						}
						if exists(t, tb, 1) {
							t.Fatal("allowed TRUNCATE left the row")
						}
						return
					}
					var pe *pgconn.PgError
					if !errors.As(err, &pe) || pe.Code != "0A000" {
						t.Fatalf("TRUNCATE: %v, want 0A000", err)
					}
					if !c.rewriter || via == "direct" {
						if !strings.Contains(pe.Message, tb) || pe.Hint == "" {
							t.Errorf("the backstop's refusal does not name the table or has no hint: %s (hint %q)", pe.Message, pe.Hint)
						}
					}
					if v, e := rowOf(t, tb, 1); v != "a" || e != 5 {
						t.Fatalf("row changed: %q, %d", v, e)
					}
				})
			}
		}
	}
}
