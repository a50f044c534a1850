package fence_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// answersSets reports whether the proxies of this test run answer a plain
// SET of the token themselves: the event loop relays them (see
// proxy.Config.ForwardSettings).
func answersSets() bool { return os.Getenv("PGFENCE_TEST_RELAY") != "goroutines" }

var (
	simple   = pgx.QueryExecModeSimpleProtocol
	prepared = pgx.QueryExecModeCacheStatement
)

func exec(t *testing.T, c *pgx.Conn, mode pgx.QueryExecMode, sql string, args ...any) string {
	t.Helper()
	tag, err := c.Exec(ctx, sql, append([]any{mode}, args...)...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.String()
}

func show(t *testing.T, c *pgx.Conn) string {
	t.Helper()
	var v string
	if err := c.QueryRow(ctx, "SELECT coalesce(current_setting('fence.token', true), '<unset>')", simple).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// lastQuery is what Postgres says the backend pid ran last.
func lastQuery(t *testing.T, pid uint32) string {
	t.Helper()
	var q string
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q); err != nil {
		t.Fatal(err)
	}
	return q
}

// forgetSet creates pg_temp.forget(), which deallocates pgfence's own
// set_config statement (pgfence.set.<session>) out of pgfence's sight; the
// goroutine relay has none.
const forgetSet = `CREATE FUNCTION pg_temp.forget() RETURNS void LANGUAGE plpgsql AS $$
	DECLARE r record;
	BEGIN
		FOR r IN SELECT name FROM pg_prepared_statements WHERE name LIKE 'pgfence.set.%' LOOP
			EXECUTE 'DEALLOCATE ' || quote_ident(r.name);
		END LOOP;
	END$$`

// setWays are the ways drivers send a SET: name and a function that sends
// sql on c that way, returning its command tag.
var setWays = []struct {
	name string
	send func(t *testing.T, c *pgx.Conn, sql string) string
}{
	{"simple Query", func(t *testing.T, c *pgx.Conn, sql string) string { return exec(t, c, simple, sql) }},
	// Bind, Describe, Execute and Sync of a statement prepared before (pgx's
	// statement cache, pgbench -M prepared).
	{"named statement", func(t *testing.T, c *pgx.Conn, sql string) string {
		t.Helper()
		tokset++
		name := fmt.Sprint("tokset", tokset)
		if _, err := c.PgConn().Prepare(ctx, name, sql, nil); err != nil {
			t.Fatal(err)
		}
		// Postgres sees the Parse; reset what it says the backend ran last.
		exec(t, c, simple, "SELECT 1")
		return execPrepared(t, c, name)
	}},
	// Parse of the unnamed statement, then Bind, Describe, Execute and Sync
	// (libpq's PQexecParams, pgbench -M extended, JDBC).
	{"unnamed statement", func(t *testing.T, c *pgx.Conn, sql string) string {
		t.Helper()
		res := c.PgConn().ExecParams(ctx, sql, nil, nil, nil, nil).Read()
		if res.Err != nil {
			t.Fatalf("%s: %v", sql, res.Err)
		}
		return res.CommandTag.String()
	}},
}

// tokset numbers the statements setWays prepares.
var tokset int

// execPrepared binds and runs the prepared statement name with no values.
func execPrepared(t *testing.T, c *pgx.Conn, name string) string {
	t.Helper()
	res := c.PgConn().ExecPrepared(ctx, name, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatalf("statement %q: %v", name, res.Err)
	}
	return res.CommandTag.String()
}

func answered(t *testing.T, p *pgtest.Proxy) float64 {
	return p.Counter(t, "pgfence_token_sets_answered_total")
}

// A plain SET of the token is answered by pgfence without Postgres, and
// set on the server ahead of the next statement: the write carries it,
// whichever way the SET and the write were sent.
func TestTokenSetAnsweredByProxy(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	for i, way := range setWays {
		for j, mode := range []pgx.QueryExecMode{simple, pgx.QueryExecModeExec, prepared} {
			c := p.Connect(t)
			pid := c.PgConn().PID()
			token := fmt.Sprint(7 + 3*i + j)
			set := "SET fence.token = '" + token + "'"
			before := answered(t, p)
			if tag := way.send(t, c, set); tag != "SET" {
				t.Fatalf("%s: %s answered %q", way.name, set, tag)
			}
			if last := lastQuery(t, pid); answersSets() == strings.Contains(last, "fence.token") {
				t.Fatalf("%s: after %s Postgres's backend last ran %q (pgfence answers sets: %v)", way.name, set, last, answersSets())
			}
			if got, want := answered(t, p)-before, map[bool]float64{true: 1, false: 0}[answersSets()]; got != want {
				t.Fatalf("%s: pgfence_token_sets_answered_total rose by %v, want %v", way.name, got, want)
			}
			// An argument keeps pgx from sending the write as a simple Query.
			if tag := exec(t, c, mode, "UPDATE "+tbl+" SET val = 'w"+token+"' WHERE id = $1", 1); tag != "UPDATE 1" {
				t.Fatalf("%s, write in %v: %s, want UPDATE 1", way.name, mode, tag)
			}
			if v, e := row(t, tbl, 1); v != "w"+token || fmt.Sprint(e) != token {
				t.Fatalf("%s, write in %v: row is (%s, %d), want (w%s, %s): the write must carry the token set", way.name, mode, v, e, token, token)
			}
			if got := show(t, c); got != token {
				t.Fatalf("%s: the session's token is %q, want %q", way.name, got, token)
			}
		}
	}
	// A stale token set the same way is fenced and counted.
	c := p.Connect(t)
	exec(t, c, simple, "SET fence.token = '3'")
	if tag := exec(t, c, simple, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale write: %s, want UPDATE 0", tag)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("fencing_reject_total = %v, want 1", got)
	}
}

// An unnamed SET statement pgfence answered stays the client's unnamed
// statement: bound again where pgfence forwards it, it is prepared on the
// server first and sets the token there, not runs the server's unnamed
// statement from before.
func TestAnsweredUnnamedSetBoundAgain(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	pc := c.PgConn()
	for name, sql := range map[string]string{"b": "BEGIN", "s": "SET fence.token = '32'", "z": "SELECT 1/0"} {
		if _, err := pc.Prepare(ctx, name, sql, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The server's unnamed statement: what a Bind would run if pgfence
	// forgot it had answered the one after.
	if res := pc.ExecParams(ctx, "SELECT 1", nil, nil, nil, nil).Read(); res.Err != nil {
		t.Fatal(res.Err)
	}
	setWays[2].send(t, c, "SET fence.token = '31'")
	before := answered(t, p)
	if tag := execPrepared(t, c, ""); tag != "SET" { // idle: answered again
		t.Fatalf("the unnamed SET bound again: %q", tag)
	}
	if got, want := answered(t, p)-before, map[bool]float64{true: 1, false: 0}[answersSets()]; got != want {
		t.Fatalf("pgfence_token_sets_answered_total rose by %v, want %v", got, want)
	}
	execPrepared(t, c, "b")
	execPrepared(t, c, "s")
	if tag := execPrepared(t, c, ""); tag != "SET" { // in a block: forwarded
		t.Fatalf("the unnamed SET bound in a block: %q", tag)
	}
	if got := show(t, c); got != "31" {
		t.Fatalf("after the unnamed SET ran again in the block the token is %q, want 31", got)
	}
	exec(t, c, simple, "COMMIT")

	// In a failed block Postgres refuses the Bind as it would the client's.
	setWays[2].send(t, c, "SET fence.token = '33'")
	execPrepared(t, c, "b")
	// Not a simple Query: that would drop the unnamed statement.
	if res := pc.ExecPrepared(ctx, "z", nil, nil, nil).Read(); res.Err == nil {
		t.Fatal("SELECT 1/0 succeeded")
	}
	res := pc.ExecPrepared(ctx, "", nil, nil, nil).Read()
	if pe := pgErr(t, res.Err); pe.Code != "25P02" {
		t.Fatalf("the unnamed SET in a failed block: %s %q, want 25P02", pe.Code, pe.Message)
	}
	exec(t, c, simple, "ROLLBACK")
	if got := show(t, c); got != "33" {
		t.Fatalf("after the failed block the token is %q, want 33", got)
	}
}

// If setting a deferred token fails on the server, nothing runs without
// it: a write it was sent ahead of is skipped and the client gets the
// error; anything else waits for it while it is tried once more (a second
// failure ends the session: see TestDeferredTokenFailsInBlock). A function
// that deallocates pgfence's own set_config statement, out of pgfence's
// sight, makes it fail.
func TestDeferredTokenFailsClosed(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	exec(t, c, simple, forgetSet)
	exec(t, c, simple, "SET fence.token = '6'")
	exec(t, c, simple, "UPDATE "+tbl+" SET val = 'six' WHERE id = 1") // pgfence prepares set_config here
	if v, e := row(t, tbl, 1); v != "six" || e != 6 {
		t.Fatalf("row is (%s, %d), want (six, 6)", v, e)
	}

	exec(t, c, simple, "SELECT pg_temp.forget()")
	exec(t, c, simple, "SET fence.token = '7'")
	// Under the old token, 6, this write would land.
	_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'seven' WHERE id = 1", simple)
	if answersSets() {
		if pe := pgErr(t, err); pe.Code != "26000" || !strings.Contains(pe.Message, "pgfence.set") {
			t.Fatalf("the write behind a failed deferred SET: %s %q, want 26000 naming pgfence.set", pe.Code, pe.Message)
		}
		if v, e := row(t, tbl, 1); v != "six" || e != 6 {
			t.Fatalf("a write ran without the token the client set: row is (%s, %d)", v, e)
		}
		// The token is set again ahead of the next write, which lands.
		exec(t, c, simple, "UPDATE "+tbl+" SET val = 'seven' WHERE id = 1")
	} else if err != nil {
		t.Fatal(err)
	}
	if v, e := row(t, tbl, 1); v != "seven" || e != 7 {
		t.Fatalf("row is (%s, %d), want (seven, 7)", v, e)
	}

	exec(t, c, simple, "SELECT pg_temp.forget()")
	exec(t, c, simple, "SET fence.token = '8'")
	// Tried again (and prepared again) ahead of the statement.
	if got := show(t, c); got != "8" {
		t.Fatalf("behind a deferred SET that failed once, the token is %q, want 8", got)
	}
	if logs := p.Logs.String(); answersSets() != strings.Contains(logs, "trying it again") {
		t.Fatalf("pgfence answers sets: %v; its log:\n%s", answersSets(), logs)
	}
	if tag := exec(t, c, prepared, "UPDATE "+tbl+" SET val = 'eight' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("a write after the retry: %s", tag)
	}
	if v, e := row(t, tbl, 1); v != "eight" || e != 8 {
		t.Fatalf("row is (%s, %d), want (eight, 8)", v, e)
	}
	// The same with a pipeline of several statements waiting behind it.
	exec(t, c, simple, "SELECT pg_temp.forget()")
	exec(t, c, simple, "SET fence.token = '9'")
	b := &pgx.Batch{}
	b.Queue("SELECT current_setting('fence.token')")
	b.Queue("UPDATE "+tbl+" SET val = 'nine' WHERE id = $1", 1)
	b.Queue("SELECT current_setting('fence.token')")
	br := c.SendBatch(ctx, b)
	for i, want := range []string{"9", "UPDATE 1", "9"} {
		var got string
		if i == 1 {
			tag, err := br.Exec()
			if err != nil {
				t.Fatal(err)
			}
			got = tag.String()
		} else if err := br.QueryRow().Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("statement %d of the batch behind a retried SET: %q, want %q", i, got, want)
		}
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if v, e := row(t, tbl, 1); v != "nine" || e != 9 {
		t.Fatalf("row is (%s, %d), want (nine, 9)", v, e)
	}
	// Other sessions go on.
	d := p.Connect(t)
	exec(t, d, simple, "SET fence.token = '10'")
	if tag := exec(t, d, prepared, "UPDATE "+tbl+" SET val = 'ten' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("another session's write: %s", tag)
	}
}

// A deferred token sent in the transaction of a write that fails is rolled
// back with it, and set again ahead of the next statement.
func TestDeferredTokenRolledBackWithWrite(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	for i, mode := range []pgx.QueryExecMode{simple, prepared} {
		c := p.Connect(t)
		token := fmt.Sprint(5 + i)
		exec(t, c, mode, "SET fence.token = '"+token+"'")
		_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = (1 / 0)::text WHERE id = 1", mode)
		if pe := pgErr(t, err); pe.Code != "22012" {
			t.Fatalf("%v: %s %q, want division by zero", mode, pe.Code, pe.Message)
		}
		if got := show(t, c); got != token {
			t.Fatalf("%v: after the failed write the token is %q, want %q", mode, got, token)
		}
		// Twice in a row: each failure rolls it back again.
		exec(t, c, mode, "SET fence.token = '"+token+"'")
		for range 2 {
			if _, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = (1 / 0)::text WHERE id = 1", mode); err == nil {
				t.Fatalf("%v: a division by zero succeeded", mode)
			}
		}
		if tag := exec(t, c, mode, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("%v: %s", mode, tag)
		}
		if _, e := row(t, tbl, 1); fmt.Sprint(e) != token {
			t.Fatalf("%v: epoch %d, want %s", mode, e, token)
		}
	}
}

// A SET inside a transaction block that has not failed is answered by
// pgfence too, and so is a SET LOCAL there, whichever way they are sent;
// both mean what Postgres says they mean: a SET is undone with the block
// or with a savepoint rolled back, a SET LOCAL lasts until the block ends.
// In a failed block Postgres refuses them, and outside a block a SET LOCAL
// is Postgres's to warn about.
func TestTokenSetInBlock(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	for _, way := range setWays {
		c := p.Connect(t)
		pid := c.PgConn().PID()
		is := func(want string) {
			t.Helper()
			if got := show(t, c); got != want {
				t.Fatalf("%s: the token is %q, want %q", way.name, got, want)
			}
		}
		set := func(sql string, answer bool) {
			t.Helper()
			before := answered(t, p)
			if tag := way.send(t, c, sql); tag != "SET" {
				t.Fatalf("%s: %s answered %q", way.name, sql, tag)
			}
			answer = answer && answersSets()
			if got, want := answered(t, p)-before, map[bool]float64{true: 1, false: 0}[answer]; got != want {
				t.Fatalf("%s: %s: pgfence_token_sets_answered_total rose by %v, want %v", way.name, sql, got, want)
			}
			if last := lastQuery(t, pid); answer == strings.HasPrefix(last, "SET ") {
				t.Fatalf("%s: after %s Postgres's backend last ran %q (answered by pgfence: %v)", way.name, sql, last, answer)
			}
		}
		exec(t, c, simple, "SET fence.token = '5'")

		exec(t, c, simple, "BEGIN")
		set("SET fence.token = '9'", true)
		is("9")
		exec(t, c, simple, "ROLLBACK")
		is("5")

		exec(t, c, simple, "BEGIN")
		set("SET LOCAL fence.token = '8'", true)
		is("8")
		exec(t, c, simple, "COMMIT")
		is("5")

		exec(t, c, simple, "BEGIN")
		exec(t, c, simple, "SAVEPOINT s")
		set("SET fence.token = '7'", true)
		exec(t, c, simple, "ROLLBACK TO SAVEPOINT s")
		is("5")
		set("SET fence.token = '6'", true)
		exec(t, c, simple, "COMMIT")
		is("6")

		// Answered one after the other, each means what it says.
		exec(t, c, simple, "BEGIN")
		set("SET fence.token = '20'", true)
		set("SET LOCAL fence.token = '21'", true)
		is("21")
		exec(t, c, simple, "COMMIT")
		is("20")
		exec(t, c, simple, "BEGIN")
		set("SET LOCAL fence.token = '22'", true)
		set("SET fence.token = '23'", true)
		set("SET LOCAL fence.token = '24'", true)
		exec(t, c, simple, "COMMIT")
		is("23")

		// A fenced write right after it carries it; one that fails leaves
		// the block to roll back, with nothing more to set.
		exec(t, c, simple, "BEGIN")
		set("SET LOCAL fence.token = '30'", true)
		if tag := exec(t, c, prepared, "UPDATE "+tbl+" SET val = $1 WHERE id = 1", way.name); tag != "UPDATE 1" {
			t.Fatalf("%s: the write in the block: %s", way.name, tag)
		}
		exec(t, c, simple, "COMMIT")
		if v, e := row(t, tbl, 1); v != way.name || e != 30 {
			t.Fatalf("%s: row is (%s, %d), want (%s, 30)", way.name, v, e, way.name)
		}
		is("23")
		exec(t, c, simple, "BEGIN")
		set("SET LOCAL fence.token = '31'", true)
		if _, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = (1 / 0)::text WHERE id = 1", prepared); pgErr(t, err).Code != "22012" {
			t.Fatalf("%s: the failing write in the block: %v", way.name, err)
		}
		exec(t, c, simple, "ROLLBACK")
		is("23")

		// Outside a block Postgres warns of a SET LOCAL and does nothing.
		set("SET LOCAL fence.token = '40'", false)
		is("23")

		exec(t, c, simple, "BEGIN")
		c.Exec(ctx, "SELECT 1/0", simple)
		before := answered(t, p)
		_, err := c.Exec(ctx, "SET fence.token = '10'", simple)
		if pe := pgErr(t, err); pe.Code != "25P02" {
			t.Fatalf("%s: SET in a failed block: %s %q, want 25P02", way.name, pe.Code, pe.Message)
		}
		if answered(t, p) != before {
			t.Fatalf("%s: pgfence answered a SET in a failed block", way.name)
		}
		exec(t, c, simple, "ROLLBACK")
		is("23")
		c.Close(ctx)
	}
}

// If a token answered in a block fails to be set on the server ahead of a
// write, the write is skipped with the error, and the block, failed, rolls
// back as the client asks; ahead of anything else the session ends, as
// outside a block (TestDeferredTokenFailsClosed).
func TestDeferredTokenFailsInBlock(t *testing.T) {
	if !answersSets() {
		t.Skip("the goroutine relay answers no SET: nothing is deferred")
	}
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	exec(t, c, simple, forgetSet)
	exec(t, c, simple, "SET fence.token = '5'")
	exec(t, c, simple, "SELECT 1") // pgfence prepares set_config here

	exec(t, c, simple, "BEGIN")
	exec(t, c, simple, "SELECT pg_temp.forget()")
	exec(t, c, simple, "SET fence.token = '6'")
	_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'six' WHERE id = 1", prepared)
	if pe := pgErr(t, err); pe.Code != "26000" || !strings.Contains(pe.Message, "pgfence.set") {
		t.Fatalf("the write behind a failed deferred SET: %s %q, want 26000 naming pgfence.set", pe.Code, pe.Message)
	}
	exec(t, c, simple, "ROLLBACK")
	if got := show(t, c); got != "5" {
		t.Fatalf("after the block the token is %q, want 5", got)
	}
	if v, e := row(t, tbl, 1); v != "v" || e != 0 {
		t.Fatalf("row is (%s, %d), want (v, 0)", v, e)
	}

	exec(t, c, simple, "SET fence.token = '5'")
	exec(t, c, simple, "SELECT 1") // pgfence prepares set_config again
	exec(t, c, simple, "BEGIN")
	exec(t, c, simple, "SELECT pg_temp.forget()")
	exec(t, c, simple, "SET LOCAL fence.token = '7'")
	_, err = c.Exec(ctx, "SELECT 1", simple)
	if pe := pgErr(t, err); pe.Severity != "FATAL" || pe.Code != "26000" {
		t.Fatalf("a statement behind a failed deferred SET: %s %s %q, want FATAL 26000", pe.Severity, pe.Code, pe.Message)
	}
}

// Pipelined with a write, a SET is not answered alone; a batch of several
// statements after an answered SET gets the token ahead of all of them.
func TestDeferredTokenPipelined(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0}, [3]any{2, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	b := &pgx.Batch{}
	b.Queue("SET fence.token = '11'")
	b.Queue("UPDATE " + tbl + " SET val = 'b' WHERE id = 1")
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if _, e := row(t, tbl, 1); e != 11 {
		t.Fatalf("epoch %d, want 11", e)
	}
	exec(t, c, prepared, "SET fence.token = '12'")
	b = &pgx.Batch{}
	b.Queue("UPDATE " + tbl + " SET val = 'c' WHERE id = 1")
	b.Queue("UPDATE " + tbl + " SET val = 'c' WHERE id = 2")
	b.Queue("SELECT current_setting('fence.token')")
	br := c.SendBatch(ctx, b)
	for i := range 2 {
		if tag, err := br.Exec(); err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("write %d of the batch: %s, %v", i+1, tag, err)
		}
	}
	var got string
	if err := br.QueryRow().Scan(&got); err != nil || got != "12" {
		t.Fatalf("the batch's token: %q, %v", got, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 2; id++ {
		if v, e := row(t, tbl, id); v != "c" || e != 12 {
			t.Fatalf("row %d is (%s, %d), want (c, 12)", id, v, e)
		}
	}
}

// What the proxy holds back while a deferred token is set on its own
// includes a message too large to hold whole, which streams through.
func TestDeferredTokenBeforeLargeMessage(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	big := strings.Repeat("x", 200_000)
	// The second prepared run binds a statement pgx has already prepared:
	// its batch starts with the large Bind.
	for i, mode := range []pgx.QueryExecMode{simple, prepared, prepared} {
		token := fmt.Sprint(20 + i)
		exec(t, c, simple, "SET fence.token = '"+token+"'")
		var n int
		var got string
		if err := c.QueryRow(ctx, "SELECT length($1::text), current_setting('fence.token')", mode, big).Scan(&n, &got); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if n != len(big) || got != token {
			t.Fatalf("%v: length %d and token %q, want %d and %q", mode, n, got, len(big), token)
		}
	}
}

// A SET prepared with a parameter type declared is not answered: bound
// with no value, Postgres refuses it, and so must the client see it.
func TestTokenSetDeclaringParamsIsForwarded(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	pc := c.PgConn()
	if _, err := pc.Prepare(ctx, "p", "SET fence.token = '40'", []uint32{23}); err != nil {
		t.Fatal(err)
	}
	errs := []error{
		pc.ExecPrepared(ctx, "p", nil, nil, nil).Read().Err,
		pc.ExecParams(ctx, "SET fence.token = '41'", nil, []uint32{23}, nil, nil).Read().Err,
	}
	for i, err := range errs {
		if pe := pgErr(t, err); pe.Code != "08P01" || !strings.Contains(pe.Message, "requires 1") {
			t.Fatalf("SET %d declaring a parameter, bound without one: %s %q, want 08P01", i+1, pe.Code, pe.Message)
		}
	}
	if got := show(t, c); got != "<unset>" {
		t.Fatalf("the token is %q, want it unset", got)
	}
}

// A text that deallocates every statement, sent right behind an answered
// SET (so pgfence prepares its own statement ahead of it, and Postgres
// confirms that after pgfence planned the text), makes pgfence prepare it
// again before the next deferred SET.
func TestDeferredTokenAfterDeallocateAll(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	exec(t, c, simple, "SET fence.token = '5'")
	exec(t, c, simple, "DEALLOCATE ALL")
	exec(t, c, simple, "SET fence.token = '6'")
	if got := show(t, c); got != "6" {
		t.Fatalf("the token is %q, want 6", got)
	}
}

// The same for a probe: prepared in a pipeline ahead of DEALLOCATE ALL,
// it is prepared again before the next fenced write binds it, rather than
// fail that write with 26000.
func TestProbeAfterPipelinedDeallocateAll(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	conn, fe := pgtest.RawSession(t, p.Addr)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	write := "UPDATE " + tbl + " SET val = val || 'x' WHERE id = 1"
	for _, m := range []pgproto3.FrontendMessage{
		&pgproto3.Query{String: "SET fence.token = '5'; SET lock_timeout = '5s'"},
		&pgproto3.Parse{Name: "w", Query: write}, &pgproto3.Bind{PreparedStatement: "w"}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.Query{String: "DEALLOCATE ALL"},
		&pgproto3.Parse{Name: "w2", Query: write}, &pgproto3.Sync{},
	} {
		fe.Send(m)
	}
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 4 {
		got = append(got, receiveUntilReady(t, fe)...)
	}
	fe.Send(&pgproto3.Bind{PreparedStatement: "w2"})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	got = append(got, receiveUntilReady(t, fe)...)
	if s := strings.Join(got, "\n"); strings.Contains(s, "Error") || strings.Count(s, "UPDATE 1") != 2 {
		t.Fatalf("replies:\n%s\nwant two UPDATE 1 and no error", s)
	}
	if v, _ := row(t, tbl, 1); v != "vxx" {
		t.Fatalf("row is %q, want vxx", v)
	}
}
