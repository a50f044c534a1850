package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

// table creates a guarded-shaped table named after the test, with rows
// (id, val, epoch), and returns its name.
func table(t *testing.T, rows ...[3]any) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "_", " ", "_", "-", "_").Replace(t.Name()))
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)", name))
	for _, r := range rows {
		pgtest.Exec(t, db, fmt.Sprintf("INSERT INTO %s VALUES ($1, $2, $3)", name), r[0], r[1], r[2])
	}
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+name) })
	return name
}

// row reads (val, epoch) of a row straight from Postgres.
func row(t *testing.T, tbl string, id int) (string, int64) {
	t.Helper()
	var val string
	var epoch int64
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT val, fence_epoch FROM "+tbl+" WHERE id = $1", id).Scan(&val, &epoch); err != nil {
		t.Fatalf("reading row %d of %s: %v", id, tbl, err)
	}
	return val, epoch
}

func pgErr(t *testing.T, err error) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("want a Postgres error, got %v", err)
	}
	return pe
}

func rejects(t *testing.T, p *pgtest.Proxy, tbl string) float64 {
	return p.Counter(t, "fencing_reject_total", "table="+tbl)
}

// The core story: a newer holder writes, the paused older one then writes
// the same row and changes nothing, and the reject is counted and logged.
func TestStaleUpdateIsFenced(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	a := p.Connect(t, "application_name=writer-a")
	b := p.Connect(t, "application_name=writer-b")
	pgtest.Exec(t, a, "SET fence.token = '42'")
	pgtest.Exec(t, b, "SET fence.token = '43'")

	if tag := pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("fresh writer: %s, want UPDATE 1", tag)
	}
	if v, e := row(t, tbl, 1); v != "B" || e != 43 {
		t.Fatalf("after B: (%s, %d), want (B, 43): the epoch must carry the writer's token", v, e)
	}
	if tag := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'A' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale writer: %s, want UPDATE 0", tag)
	}
	if v, e := row(t, tbl, 1); v != "B" || e != 43 {
		t.Fatalf("after stale A: (%s, %d), want (B, 43)", v, e)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("fencing_reject_total = %v, want 1", got)
	}
	logs := p.Logs.String()
	for _, want := range []string{"stale write fenced", "table=" + tbl, "token=42", "application_name=writer-a", "client=127.0.0.1:"} {
		if !strings.Contains(logs, want) {
			t.Errorf("reject log lacks %q:\n%s", want, logs)
		}
	}
	// The same holder writes again under one grant: equal tokens pass.
	if tag := pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B2' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("equal token: %s, want UPDATE 1", tag)
	}
}

// In a storm of stale writes, each table gets a log line for its first,
// then at most one per --stale-log-interval, which says how many more it
// stands for; the metric counts every one.
func TestStaleLogLines(t *testing.T) {
	tbl, other := table(t, [3]any{1, "x", 50}), table2(t)
	pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+other+" SET fence_epoch = 50")
	// Long enough for four writes on a busy machine: the test needs them
	// within one interval of the first's log line.
	const interval = 5 * time.Second
	p := pgtest.StartProxy(t, []string{tbl, other}, func(_ *proxy.Config, fc *fence.Config) { fc.StaleLogInterval = interval })
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '42'")
	start := time.Now()  // before the first line's time
	var logged time.Time // after it
	for range 3 {
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'z' WHERE id = 1"); tag != "UPDATE 0" {
			t.Fatalf("stale UPDATE: %s", tag)
		}
		if logged.IsZero() {
			logged = time.Now()
		}
	}
	if tag := pgtest.Exec(t, c, "UPDATE "+other+" SET val = 'z' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale UPDATE of %s: %s", other, tag)
	}
	lines := func(table string) []string {
		var out []string
		for _, l := range strings.Split(p.Logs.String(), "\n") {
			if strings.Contains(l, `msg="stale write fenced"`) && strings.Contains(l, "table="+table+" ") {
				out = append(out, l)
			}
		}
		return out
	}
	if took := time.Since(start); took >= interval {
		t.Fatalf("four writes took %v, more than the interval", took)
	}
	if l := lines(tbl); len(l) != 1 || strings.Contains(l[0], "unlogged=") {
		t.Fatalf("three stale writes within the interval logged %d lines, want the first alone:\n%s", len(l), strings.Join(l, "\n"))
	}
	if l := lines(other); len(l) != 1 {
		t.Fatalf("a stale write to another table logged %d lines, want 1", len(l))
	}
	if got := rejects(t, p, tbl); got != 3 {
		t.Fatalf("fencing_reject_total = %v, want 3: every stale write is counted", got)
	}
	// The rate limit is of time itself: wait until an interval has passed
	// since the first line, surely.
	time.Sleep(time.Until(logged.Add(interval)))
	pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'z' WHERE id = 1")
	if l := lines(tbl); len(l) != 2 || !strings.Contains(l[1], "unlogged=2") {
		t.Fatalf("after the interval: %d lines, want a second one with unlogged=2:\n%s", len(l), strings.Join(l, "\n"))
	}
}

func TestStaleDeleteIsFenced(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 50}, [3]any{2, "y", 10})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '20'")
	if tag := pgtest.Exec(t, c, "DELETE FROM "+tbl+" WHERE id = 1"); tag != "DELETE 0" {
		t.Fatalf("stale delete: %s, want DELETE 0", tag)
	}
	row(t, tbl, 1) // still there
	if tag := pgtest.Exec(t, c, "DELETE FROM "+tbl+" WHERE id = 2"); tag != "DELETE 1" {
		t.Fatalf("fresh delete: %s, want DELETE 1", tag)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("fencing_reject_total = %v, want 1", got)
	}
}

// Rejects are counted from what the statement matched, not guessed from the
// row count: a partial reject counts, a statement matching nothing does not.
func TestRejectCounting(t *testing.T) {
	tbl := table(t, [3]any{1, "old", 5}, [3]any{2, "new", 50}, [3]any{3, "other", 99})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '10'")

	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'w' WHERE id IN (1, 2)"); tag != "UPDATE 1" {
		t.Fatalf("partial: %s, want UPDATE 1", tag)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("after partial reject: %v, want 1", got)
	}
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1000"); tag != "UPDATE 0" {
		t.Fatalf("no match: %s", tag)
	}
	// Row 3 is stale for this writer but not matched by its predicate.
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("fresh: %s", tag)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("UPDATE 0 without a stale match, or a fresh write, was counted: %v, want 1", got)
	}
	// Extended protocol, in a pipeline with other work.
	batch := &pgx.Batch{}
	batch.Queue("UPDATE "+tbl+" SET val = $1 WHERE id = $2", "x", 2)
	batch.Queue("SELECT count(*) FROM " + tbl)
	batch.Queue("UPDATE "+tbl+" SET val = $1 WHERE id = $2", "x", 1)
	br := c.SendBatch(ctx, batch)
	if tag, err := br.Exec(); err != nil || tag.String() != "UPDATE 0" {
		t.Fatalf("batched stale update: %v %v", tag, err)
	}
	var n int
	if err := br.QueryRow().Scan(&n); err != nil || n != 3 {
		t.Fatalf("batched select: %d %v", n, err)
	}
	if tag, err := br.Exec(); err != nil || tag.String() != "UPDATE 1" {
		t.Fatalf("batched fresh update: %v %v", tag, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if got := rejects(t, p, tbl); got != 2 {
		t.Fatalf("after batch: %v, want 2", got)
	}
}

// The token in force is whatever Postgres's own setting holds when the
// statement runs, however it was set.
func TestTokenSources(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 10})
	p := pgtest.StartProxy(t, []string{tbl})
	update := "UPDATE " + tbl + " SET val = 'w' WHERE id = 1"

	t.Run("options", func(t *testing.T) {
		c := p.Connect(t, "options=-c fence.token=9")
		if tag := pgtest.Exec(t, c, update); tag != "UPDATE 0" {
			t.Fatalf("token 9 from options: %s, want UPDATE 0", tag)
		}
		c2 := p.Connect(t, "options=-c fence.token=10")
		if tag := pgtest.Exec(t, c2, update); tag != "UPDATE 1" {
			t.Fatalf("token 10 from options: %s, want UPDATE 1", tag)
		}
	})
	t.Run("set_config", func(t *testing.T) {
		c := p.Connect(t)
		pgtest.Exec(t, c, "SELECT set_config('fence.token', '11', false)")
		if tag := pgtest.Exec(t, c, update); tag != "UPDATE 1" {
			t.Fatalf("%s", tag)
		}
		if _, e := row(t, tbl, 1); e != 11 {
			t.Fatalf("epoch %d, want 11", e)
		}
	})
	t.Run("set local and rollback", func(t *testing.T) {
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token = '5'")
		// SET LOCAL lasts for the transaction only.
		pgtest.Exec(t, c, "BEGIN")
		pgtest.Exec(t, c, "SET LOCAL fence.token = '12'")
		if tag := pgtest.Exec(t, c, update); tag != "UPDATE 1" {
			t.Fatalf("SET LOCAL 12: %s", tag)
		}
		pgtest.Exec(t, c, "COMMIT")
		if tag := pgtest.Exec(t, c, update); tag != "UPDATE 0" {
			t.Fatalf("after commit the session token 5 is back: %s, want UPDATE 0", tag)
		}
		// A SET in a rolled-back transaction is undone.
		pgtest.Exec(t, c, "BEGIN")
		pgtest.Exec(t, c, "SET fence.token = '100'")
		pgtest.Exec(t, c, "ROLLBACK")
		if tag := pgtest.Exec(t, c, update); tag != "UPDATE 0" {
			t.Fatalf("after rollback: %s, want UPDATE 0 with token 5", tag)
		}
	})
	t.Run("reset", func(t *testing.T) {
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token = '50'")
		pgtest.Exec(t, c, "RESET fence.token")
		_, err := c.Exec(ctx, update)
		if pe := pgErr(t, err); pe.Code != "55000" {
			t.Fatalf("after RESET: %v, want 55000", pe)
		}
	})
	// The trap: a statement prepared once and executed again after the
	// token changed must use the new token.
	t.Run("prepared statement after token change", func(t *testing.T) {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(mode.String(), func(t *testing.T) {
				pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+" SET fence_epoch = 20 WHERE id = 1")
				c := p.Connect(t)
				upd := "UPDATE " + tbl + " SET val = $1 WHERE id = $2"
				pgtest.Exec(t, c, "SET fence.token = '25'")
				if tag, err := c.Exec(ctx, upd, mode, "p1", 1); err != nil || tag.String() != "UPDATE 1" {
					t.Fatalf("token 25: %v %v", tag, err)
				}
				pgtest.Exec(t, c, "SET fence.token = '21'")
				if tag, err := c.Exec(ctx, upd, mode, "p2", 1); err != nil || tag.String() != "UPDATE 0" {
					t.Fatalf("same statement after token went stale (21 < 25): %v %v", tag, err)
				}
				if v, e := row(t, tbl, 1); v != "p1" || e != 25 {
					t.Fatalf("row (%s, %d), want (p1, 25)", v, e)
				}
			})
		}
	})
	t.Run("explicit prepare", func(t *testing.T) {
		pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+" SET fence_epoch = 30 WHERE id = 1")
		c := p.Connect(t)
		if _, err := c.Prepare(ctx, "upd", "UPDATE "+tbl+" SET val = $1 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, c, "SET fence.token = '31'")
		if tag := pgtest.Exec(t, c, "upd", "q1"); tag != "UPDATE 1" {
			t.Fatal(tag)
		}
		pgtest.Exec(t, c, "SET fence.token = '30'")
		if tag := pgtest.Exec(t, c, "upd", "q2"); tag != "UPDATE 0" {
			t.Fatalf("prepared after token change: %s, want UPDATE 0", tag)
		}
	})
}

func TestMissingOrBadToken(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	for _, sql := range []string{
		"UPDATE " + tbl + " SET val = 'w' WHERE id = 1",
		"UPDATE " + tbl + " SET val = 'w' WHERE id = 12345", // matches nothing: still refused
		"DELETE FROM " + tbl + " WHERE id = 1",
	} {
		_, err := c.Exec(ctx, sql)
		pe := pgErr(t, err)
		if pe.Code != "55000" || !strings.Contains(pe.Message, tbl) || !strings.Contains(pe.Hint, "SET fence.token") {
			t.Fatalf("%s: got %s %q hint %q; want 55000 naming the table and the setting", sql, pe.Code, pe.Message, pe.Hint)
		}
	}
	if v, _ := row(t, tbl, 1); v != "v" {
		t.Fatalf("a write without token changed the row: %s", v)
	}
	if got := p.Counter(t, "critical_write_without_token_total", "table="+tbl); got != 3 {
		t.Fatalf("critical_write_without_token_total = %v, want 3", got)
	}
	pgtest.Exec(t, c, "SET fence.token = 'soon'")
	_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1")
	if pe := pgErr(t, err); pe.Code != "22023" || !strings.Contains(pe.Message, "soon") {
		t.Fatalf("non-integer token: %s %q, want 22023 quoting the value", pe.Code, pe.Message)
	}
	// The session is still usable.
	pgtest.Exec(t, c, "SET fence.token = '1'")
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatal(tag)
	}
}

// No client may forge or lower an epoch: the refusal is raised by the
// server, so a transaction is aborted exactly as Postgres would abort it.
func TestForgedEpochRefused(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 7})
	p := pgtest.StartProxy(t, []string{tbl})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token = '8'")
		for _, sql := range []string{
			"UPDATE " + tbl + " SET val = 'x', fence_epoch = 1 WHERE id = 1",
			"INSERT INTO " + tbl + " (id, val, fence_epoch) VALUES (2, 'x', 999)",
		} {
			_, err := c.Exec(ctx, sql, mode)
			if pe := pgErr(t, err); pe.Code != "42501" || !strings.Contains(pe.Message, "fence_epoch") {
				t.Fatalf("%v %s: %s %q, want 42501 naming the column", mode, sql, pe.Code, pe.Message)
			}
		}
		pgtest.Exec(t, c, "BEGIN")
		_, err := c.Exec(ctx, "UPDATE "+tbl+" SET fence_epoch = 1", mode)
		pgErr(t, err)
		_, err = c.Exec(ctx, "SELECT 1", mode)
		if pe := pgErr(t, err); pe.Code != "25P02" {
			t.Fatalf("the transaction must be aborted after a refusal, got %v", pe)
		}
		pgtest.Exec(t, c, "ROLLBACK")
	}
	if v, e := row(t, tbl, 1); v != "v" || e != 7 {
		t.Fatalf("row changed: (%s, %d)", v, e)
	}
}

// Statement forms keep their meaning once fenced.
func TestStatementForms(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 1}, [3]any{2, "b", 100}, [3]any{3, "c", 1}, [3]any{4, "d", 1})
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS forms_src; CREATE TABLE forms_src (id int, nv text); INSERT INTO forms_src VALUES (3, 'from-join')")
	pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS "Odd Schema" CASCADE; CREATE SCHEMA "Odd Schema"; CREATE TABLE "Odd Schema"."Mixed Case" (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO "Odd Schema"."Mixed Case" VALUES (1, 'q', 3)`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), `DROP TABLE forms_src; DROP SCHEMA "Odd Schema" CASCADE`)
	})
	p := pgtest.StartProxy(t, []string{tbl, `"Odd Schema"."Mixed Case"`})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '50'")

	var got []string
	rows, err := c.Query(ctx, "UPDATE "+tbl+" AS t SET val = upper(t.val) WHERE t.id = 1 OR t.id = 2 RETURNING t.id, t.val, t.fence_epoch")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		var v string
		var e int64
		rows.Scan(&id, &v, &e)
		got = append(got, fmt.Sprintf("%d:%s:%d", id, v, e))
	}
	if rows.Err() != nil || rows.CommandTag().String() != "UPDATE 1" || strings.Join(got, ",") != "1:A:50" {
		t.Fatalf("alias+OR+RETURNING: %v %v %v (row 2 is stale and must stay out)", got, rows.CommandTag(), rows.Err())
	}
	if tag := pgtest.Exec(t, c, "UPDATE ONLY "+tbl+" t SET val = s.nv FROM forms_src s WHERE s.id = t.id"); tag != "UPDATE 1" {
		t.Fatalf("UPDATE FROM: %s", tag)
	}
	if v, _ := row(t, tbl, 3); v != "from-join" {
		t.Fatalf("UPDATE FROM wrote %q", v)
	}
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = (SELECT max(nv) FROM forms_src) WHERE id IN (SELECT id + 1 FROM forms_src) AND val <> $1", "zzz"); tag != "UPDATE 1" {
		t.Fatalf("subqueries+params: %s", tag)
	}
	if tag := pgtest.Exec(t, c, "DELETE FROM public."+tbl+" USING forms_src WHERE forms_src.id = 99"); tag != "DELETE 0" {
		t.Fatalf("DELETE USING: %s", tag)
	}
	if tag := pgtest.Exec(t, c, `UPDATE "Odd Schema" . /* spaced */ "Mixed Case" SET val = 'r'`); tag != "UPDATE 1" {
		t.Fatalf("quoted schema-qualified: %s", tag)
	}
	var e int64
	db.QueryRow(ctx, `SELECT fence_epoch FROM "Odd Schema"."Mixed Case"`).Scan(&e)
	if e != 50 {
		t.Fatalf("quoted table epoch %d, want 50", e)
	}
	// A whole-table UPDATE with no WHERE skips only the stale row.
	if tag := pgtest.Exec(t, c, "UPDATE "+strings.ToUpper(tbl)+" SET val = 'all' -- trailing comment"); tag != "UPDATE 3" {
		t.Fatalf("no WHERE: %s, want UPDATE 3", tag)
	}
}

// Reads and writes of other tables pass through byte for byte: the server
// sees exactly the client's text.
func TestPassthroughIsVerbatim(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	for _, sql := range []string{
		"SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid() /* a comment */  ",
		"select   query from pg_stat_activity where pid = pg_backend_pid() and 'mentions " + tbl + "' <> ''",
	} {
		var seen string
		if err := c.QueryRow(ctx, sql, pgx.QueryExecModeSimpleProtocol).Scan(&seen); err != nil {
			t.Fatal(err)
		}
		if seen != sql {
			t.Fatalf("server saw %q, client sent %q", seen, sql)
		}
	}
	if got := p.Counter(t, "pgfence_queries_total", "action=fenced"); got != 0 {
		t.Fatalf("reads were fenced: %v", got)
	}
}

// Several statements in one simple Query: each fenced one is probed, and
// the client sees only its own results.
func TestMultiStatementQuery(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 1}, [3]any{2, "b", 100})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	results, err := c.PgConn().Exec(ctx, "SET fence.token = '50'; UPDATE "+tbl+" SET val = 'x' WHERE id = 1; SELECT 'between'; UPDATE "+tbl+" SET val = 'y' WHERE id = 2; SELECT count(*) FROM "+tbl).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, r := range results {
		tags = append(tags, r.CommandTag.String())
	}
	if want := "SET,UPDATE 1,SELECT 1,UPDATE 0,SELECT 1"; strings.Join(tags, ",") != want {
		t.Fatalf("results %v, want %s", tags, want)
	}
	if string(results[2].Rows[0][0]) != "between" || string(results[4].Rows[0][0]) != "2" {
		t.Fatalf("rows: %q %q", results[2].Rows, results[4].Rows)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("rejects %v, want 1", got)
	}
}

// When the session reads SQL text differently from the parser pgfence uses,
// statements on guarded tables are refused rather than guessed at.
func TestUnreadableSessionsFailClosed(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '5'")
	pgtest.Exec(t, c, "SET standard_conforming_strings = off")
	_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'x' WHERE id = 1", pgx.QueryExecModeSimpleProtocol)
	if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "standard_conforming_strings") {
		t.Fatalf("scs off: %s %q", pe.Code, pe.Message)
	}
	// A text that spells no write keyword cannot write, however it is read.
	rs, err := c.PgConn().Exec(ctx, "SELECT val FROM "+tbl+" WHERE id = 1").ReadAll()
	if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "v" {
		t.Fatalf("scs off, a query: %v %v", rs, err)
	}
	_, err = c.PgConn().Exec(ctx, "SELECT val FROM "+tbl+" WHERE val = 'no update'").ReadAll()
	if pe := pgErr(t, err); pe.Code != "0A000" {
		t.Fatalf("scs off, a query spelling a write keyword: %s %q", pe.Code, pe.Message)
	}
	pgtest.Exec(t, c, "SET standard_conforming_strings = on")
	pgtest.Exec(t, c, "SET client_encoding = 'LATIN1'")
	_, err = c.PgConn().Exec(ctx, "UPDATE "+tbl+" SET val = 'caf\xe9' WHERE id = 1").ReadAll()
	if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "LATIN1") {
		t.Fatalf("LATIN1 with non-ASCII: %s %q", pe.Code, pe.Message)
	}
	// ASCII text means the same in every encoding.
	if _, err := c.PgConn().Exec(ctx, "UPDATE "+tbl+" SET val = 'cafe' WHERE id = 1").ReadAll(); err != nil {
		t.Fatalf("LATIN1 with ASCII text: %v", err)
	}
	if v, _ := row(t, tbl, 1); v != "cafe" {
		t.Fatalf("row = %q", v)
	}
}

// A statement prepared before a reload that guards its table is fenced at
// its next execution: the proxy re-prepares it under the new configuration.
func TestReloadReachesPreparedStatements(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 50})
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '10'")
	upd := "UPDATE " + tbl + " SET val = $1 WHERE id = 1"
	if tag := pgtest.Exec(t, c, upd, "unguarded"); tag != "UPDATE 1" { // prepared and cached by pgx
		t.Fatalf("before reload: %s", tag)
	}
	cfg := p.Policy.Config()
	g, _ := sqlrewrite.ParseGuard(tbl)
	cfg.Guards = append(cfg.Guards, g)
	if err := p.Policy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if tag := pgtest.Exec(t, c, upd, "stale"); tag != "UPDATE 0" {
		t.Fatalf("the statement prepared before the reload was not fenced after it: %s", tag)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("rejects %v, want 1", got)
	}
	// And back: unguarding re-prepares the plain statement.
	cfg.Guards = nil
	p.Policy.Reload(cfg)
	if tag := pgtest.Exec(t, c, upd, "plain again"); tag != "UPDATE 1" {
		t.Fatalf("after unguarding: %s", tag)
	}
	if v, _ := row(t, tbl, 1); v != "plain again" {
		t.Fatalf("row %q", v)
	}
}

// A reload in the middle of a failed transaction block reaches a named
// statement at its first Bind after the block, not in it: pgfence sends no
// named Parse in a failed block (see TestNoNamedParseInFailedBlock).
func TestReloadDuringFailedBlock(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 50})
	p := pgtest.StartProxy(t, nil)
	conn, fe := pgtest.RawSession(t, p.Addr)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	exchange(t, fe, 1, &pgproto3.Query{String: "SET fence.token = '10'"})
	exchange(t, fe, 1, &pgproto3.Parse{Name: "n", Query: "UPDATE " + tbl + " SET val = val || 'x' WHERE id = 1"}, &pgproto3.Sync{})
	exchange(t, fe, 1, &pgproto3.Query{String: "BEGIN"})
	exchange(t, fe, 1, &pgproto3.Query{String: "DISCARD ALL"}) // fails: the block is failed
	cfg := p.Policy.Config()
	g, _ := sqlrewrite.ParseGuard(tbl)
	cfg.Guards = append(cfg.Guards, g)
	if err := p.Policy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	before := checkpointerPID(t)
	refused := "ErrorResponse 25P02 current transaction is aborted, commands ignored until end of transaction block, ReadyForQuery E"
	if got := exchange(t, fe, 1, &pgproto3.Bind{PreparedStatement: "n"}, &pgproto3.Execute{}, &pgproto3.Sync{}); got != refused {
		t.Errorf("Bind in the failed block: %s, want %s", got, refused)
	}
	exchange(t, fe, 1, &pgproto3.Execute{}, &pgproto3.Sync{})
	if checkpointerPID(t) != before {
		t.Fatal("Postgres restarted (it crashed)")
	}
	exchange(t, fe, 1, &pgproto3.Query{String: "ROLLBACK"})
	// The stale token 10 against the row's epoch 50: fenced now.
	if got, want := exchange(t, fe, 1, &pgproto3.Bind{PreparedStatement: "n"}, &pgproto3.Execute{}, &pgproto3.Sync{}), "BindComplete, CommandComplete, ReadyForQuery I"; got != want {
		t.Fatalf("Bind after the block: %s, want %s", got, want)
	}
	if v, _ := row(t, tbl, 1); v != "v" {
		t.Fatalf("the statement prepared before the reload wrote %q after it with a stale token", v)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("rejects %v, want 1", got)
	}
}

// The probe's statement is prepared once per session, and prepared again
// after the client deallocates statements or a probe could not run.
func TestProbeStatementLifecycle(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 50})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	stale := func(want float64) {
		t.Helper()
		pgtest.Exec(t, c, "SET fence.token = '10'")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = $1 WHERE id = 1", "stale"); tag != "UPDATE 0" {
			t.Fatalf("stale update: %s", tag)
		}
		if got := rejects(t, p, tbl); got != want {
			t.Fatalf("rejects %v, want %v", got, want)
		}
	}
	probes := func() int {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgfence.probe.%'", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	stale(1)
	stale(2)
	stale(3)
	if n := probes(); n != 1 {
		t.Fatalf("%d probe statements prepared in the session, want 1", n)
	}
	// (pgx's DeallocateAll sends DEALLOCATE ALL and empties pgx's own
	// statement cache, which DEALLOCATE behind its back would break.)
	if err := c.DeallocateAll(ctx); err != nil {
		t.Fatal(err)
	}
	stale(4)
	if _, err := c.PgConn().Exec(ctx, "DISCARD ALL").ReadAll(); err != nil {
		t.Fatal(err)
	}
	c.DeallocateAll(ctx)
	stale(5)
	// A fenced Execute that the server skips (aborted transaction) leaves
	// the session working.
	pgtest.Exec(t, c, "BEGIN")
	if _, err := c.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 succeeded")
	}
	if _, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id = 1", "in failed tx"); err == nil {
		t.Fatal("a statement ran in an aborted transaction")
	}
	pgtest.Exec(t, c, "ROLLBACK")
	stale(6)
}
