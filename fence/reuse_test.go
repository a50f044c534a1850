package fence_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Sessions that parse a fenced write as the unnamed statement before every
// execution get one server-side statement of its rewrite, prepared once.

// reused counts the statements the proxy prepared for reuse in c's session,
// and returns the text of one.
func reused(t *testing.T, c *pgx.Conn) (int, string) {
	t.Helper()
	var n int
	var text string
	err := c.QueryRow(ctx, "SELECT count(*), coalesce(max(statement), '') FROM pg_prepared_statements WHERE name LIKE 'pgfence.s.%'",
		pgx.QueryExecModeSimpleProtocol).Scan(&n, &text)
	if err != nil {
		t.Fatal(err)
	}
	return n, text
}

// execMode connects with pgx parsing every statement as the unnamed one.
func execMode(t *testing.T, p *pgtest.Proxy) *pgx.Conn {
	return p.Connect(t, "default_query_exec_mode=exec")
}

func TestReusedUnnamedStatement(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 5}, [3]any{2, "w", 5})
	plain := tbl + "_plain" // not guarded
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "CREATE TABLE "+plain+" (id int PRIMARY KEY, val text)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE "+plain) })
	p := pgtest.StartProxy(t, []string{tbl})
	c := execMode(t, p)
	pgtest.Exec(t, c, "SET fence.token = '10'")
	upd := "UPDATE " + tbl + " SET val = $1 WHERE id = $2"
	for i := range 5 {
		v := fmt.Sprint("v", i)
		if tag := pgtest.Exec(t, c, upd, v, 1); tag != "UPDATE 1" {
			t.Fatalf("write %d: %s", i, tag)
		}
		if got, epoch := row(t, tbl, 1); got != v || epoch != 10 {
			t.Fatalf("write %d: row is %q at epoch %d", i, got, epoch)
		}
	}
	n, text := reused(t, c)
	if n != 1 || !strings.Contains(text, "fence_epoch") || !strings.Contains(text, "set_config") {
		t.Fatalf("%d statements prepared for reuse (want 1, holding the fenced rewrite): %q", n, text)
	}
	// Stale writes through the reused statement are fenced and counted.
	pgtest.Exec(t, c, "SET fence.token = '3'")
	for i := range 2 {
		if tag := pgtest.Exec(t, c, upd, "stale", 2); tag != "UPDATE 0" {
			t.Fatalf("stale write %d: %s", i, tag)
		}
		if got := rejects(t, p, tbl); got != float64(i+1) {
			t.Fatalf("rejects %v after stale write %d", got, i)
		}
	}
	if got, epoch := row(t, tbl, 2); got != "w" || epoch != 5 {
		t.Fatalf("stale writes changed row 2: %q at epoch %d", got, epoch)
	}
	// Describing the statement first (pgx asks Postgres for its parameter
	// types) reaches the reused statement too.
	pgtest.Exec(t, c, "SET fence.token = '11'")
	if tag, err := c.Exec(ctx, upd, pgx.QueryExecModeDescribeExec, "described", 1); err != nil || tag.String() != "UPDATE 1" {
		t.Fatalf("described write: %v, %v", tag, err)
	}
	if got, epoch := row(t, tbl, 1); got != "described" || epoch != 11 {
		t.Fatalf("described write: row is %q at epoch %d", got, epoch)
	}
	// Writes that return rows, and statements pgfence does not rewrite,
	// are parsed as sent.
	before, _ := reused(t, c)
	for range 3 {
		var v string
		if err := c.QueryRow(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id = 1 RETURNING val", "ret").Scan(&v); err != nil || v != "ret" {
			t.Fatalf("UPDATE ... RETURNING: %q, %v", v, err)
		}
		pgtest.Exec(t, c, "UPDATE "+plain+" SET val = $1 WHERE id = 1", "plain")
		// A text that may deallocate statements (so pgfence forgets its
		// own) is not one to keep.
		pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = $1 WHERE id = 1 AND val <> 'discard'", "kept")
	}
	if after, _ := reused(t, c); after != before {
		t.Fatalf("%d statements prepared for reuse after RETURNING and unguarded writes, want %d", after, before)
	}
}

// Deallocating, a failed Parse, an aborted transaction and a changed table
// leave every later write correct.
func TestReusedStatementLifecycle(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	c := execMode(t, p)
	upd := "UPDATE " + tbl + " SET val = $1 WHERE id = 1"
	write := func(step, v string) {
		t.Helper()
		if tag, err := c.Exec(ctx, upd, v); err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("%s: %v, %v", step, tag, err)
		}
		if got, _ := row(t, tbl, 1); got != v {
			t.Fatalf("%s: row is %q, want %q", step, got, v)
		}
	}
	pgtest.Exec(t, c, "SET fence.token = '10'")
	write("first", "a")
	write("reused", "b")
	pgtest.Exec(t, c, "DEALLOCATE ALL")
	write("after DEALLOCATE ALL", "c")
	write("reused after DEALLOCATE ALL", "d")
	pgtest.Exec(t, c, "DISCARD ALL")
	pgtest.Exec(t, c, "SET fence.token = '10'") // DISCARD ALL reset it
	write("after DISCARD ALL", "e")
	if n, _ := reused(t, c); n != 1 {
		t.Fatalf("%d statements prepared for reuse after deallocating, want 1", n)
	}

	// A Parse in an aborted transaction fails, the same as the client's.
	pgtest.Exec(t, c, "BEGIN")
	if _, err := c.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 succeeded")
	}
	if _, err := c.Exec(ctx, upd, "aborted"); pgErr(t, err).Code != "25P02" {
		t.Fatalf("write in an aborted transaction: %v", err)
	}
	pgtest.Exec(t, c, "ROLLBACK")
	write("after the aborted transaction", "f")

	// A text that does not analyse fails every time with Postgres's own
	// error, never with one about pgfence's statement.
	bad := "UPDATE " + tbl + " SET nosuch = $1 WHERE id = 1"
	for i := range 2 {
		if _, err := c.Exec(ctx, bad, "x"); pgErr(t, err).Code != "42703" {
			t.Fatalf("bad column, try %d: %v", i, err)
		}
	}

	// The reused statement follows the table: Postgres analyses it again
	// after a change, as it would a fresh Parse.
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "ALTER TABLE "+tbl+" ADD COLUMN extra int")
	write("after adding a column", "g")
	pgtest.Exec(t, db, "ALTER TABLE "+tbl+" DROP COLUMN val")
	if _, err := c.Exec(ctx, upd, "gone"); pgErr(t, err).Code != "42703" {
		t.Fatalf("write to a dropped column: %v", err)
	}
	pgtest.Exec(t, db, "ALTER TABLE "+tbl+" ADD COLUMN val text")
	write("after adding the column back", "h")
	if _, epoch := row(t, tbl, 1); epoch != 10 {
		t.Fatalf("epoch %d, want 10", epoch)
	}

	// The reused statement follows search_path, as a fresh Parse would:
	// the same text writes the table the session's path finds now.
	for _, schema := range []string{"reuse_a", "reuse_b"} {
		pgtest.Exec(t, db, fmt.Sprintf("DROP SCHEMA IF EXISTS %[1]s CASCADE; CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.%[2]s (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO %[1]s.%[2]s VALUES (1, 'v', 0)", schema, tbl))
		t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP SCHEMA "+schema+" CASCADE") })
	}
	for _, schema := range []string{"reuse_a", "reuse_b", "reuse_a"} {
		pgtest.Exec(t, c, "SET search_path = "+schema)
		if tag, err := c.Exec(ctx, upd, "in "+schema); err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("write under search_path %s: %v, %v", schema, tag, err)
		}
		var val string
		if err := db.QueryRow(ctx, "SELECT val FROM "+schema+"."+tbl+" WHERE id = 1").Scan(&val); err != nil || val != "in "+schema {
			t.Fatalf("under search_path %s the row of %s.%s is %q (%v)", schema, schema, tbl, val, err)
		}
	}
	pgtest.Exec(t, c, "RESET search_path")

	// Pipelined: the same write three times in one batch, in a session
	// that has not prepared it yet.
	c2 := execMode(t, p)
	pgtest.Exec(t, c2, "SET fence.token = '12'")
	b := &pgx.Batch{}
	for _, v := range []string{"p1", "p2", "p3"} {
		b.Queue(upd, v)
	}
	br := c2.SendBatch(ctx, b)
	for i := range 3 {
		if tag, err := br.Exec(); err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("batched write %d: %v, %v", i, tag, err)
		}
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if got, epoch := row(t, tbl, 1); got != "p3" || epoch != 12 {
		t.Fatalf("after the batch: %q at epoch %d", got, epoch)
	}
}

// The protocol edges of standing in for the unnamed statement, message by
// message: a Flush instead of a Sync, Describe, a simple Query or Close
// destroying the unnamed statement, and a reload between Parse and Bind.
func TestReusedStatementProtocol(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	conn, fe := pgtest.RawSession(t, p.Addr)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	// until reads messages up to one of type want and returns their types
	// and any error's code.
	until := func(want string) (types []string, codes []string) {
		t.Helper()
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("after %v: %v", types, err)
			}
			typ := strings.TrimPrefix(fmt.Sprintf("%T", m), "*pgproto3.")
			types = append(types, typ)
			if e, ok := m.(*pgproto3.ErrorResponse); ok {
				codes = append(codes, e.Code)
			}
			if typ == want {
				return types, codes
			}
		}
	}
	expect := func(step string, want []string, got []string, codes []string) {
		t.Helper()
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("%s: got %v (errors %v), want %v", step, got, codes, want)
		}
	}
	fe.Send(&pgproto3.Query{String: "SET fence.token = '20'"})
	until("ReadyForQuery")

	upd := "UPDATE " + tbl + " SET val = $1 WHERE id = 1"
	run := func(step, v string) {
		t.Helper()
		fe.Send(&pgproto3.Parse{Query: upd})
		fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte(v)}})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Sync{})
		got, codes := until("ReadyForQuery")
		expect(step, []string{"ParseComplete", "BindComplete", "CommandComplete", "ReadyForQuery"}, got, codes)
		if val, _ := row(t, tbl, 1); val != v {
			t.Fatalf("%s: row is %q, want %q", step, val, v)
		}
	}
	run("first", "a")
	run("reused", "b")

	// A client that flushes and waits for ParseComplete before binding.
	fe.Send(&pgproto3.Parse{Query: upd})
	fe.Send(&pgproto3.Flush{})
	got, codes := until("ParseComplete")
	expect("Parse and Flush", []string{"ParseComplete"}, got, codes)
	fe.Send(&pgproto3.Describe{ObjectType: 'S'})
	fe.Send(&pgproto3.Flush{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := fe.Receive(); err != nil {
		t.Fatal(err)
	} else if pd, ok := m.(*pgproto3.ParameterDescription); !ok || len(pd.ParameterOIDs) != 1 {
		t.Fatalf("Describe of the unnamed statement: %#v, want the UPDATE's one parameter", m)
	}
	got, codes = until("NoData")
	expect("Describe the unnamed statement", []string{"NoData"}, got, codes)
	fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte("c")}})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	got, codes = until("ReadyForQuery")
	expect("Bind after Flush", []string{"BindComplete", "CommandComplete", "ReadyForQuery"}, got, codes)

	// A simple Query destroys the unnamed statement, and so does Close: a
	// Bind after either fails as it would straight to Postgres.
	for _, destroy := range []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Close{ObjectType: 'S'}} {
		fe.Send(&pgproto3.Parse{Query: upd})
		fe.Send(&pgproto3.Sync{})
		until("ReadyForQuery")
		fe.Send(destroy)
		if _, ok := destroy.(*pgproto3.Close); ok {
			fe.Send(&pgproto3.Sync{})
		}
		until("ReadyForQuery")
		fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte("nope")}})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Sync{})
		got, codes = until("ReadyForQuery")
		expect(fmt.Sprintf("Bind after %T", destroy), []string{"ErrorResponse", "ReadyForQuery"}, got, codes)
		if codes[0] != "26000" {
			t.Fatalf("Bind after %T: error %s, want 26000", destroy, codes[0])
		}
	}
	run("after the unnamed statement was destroyed", "d")

	// A reload between Parse and Bind: the Bind runs what the new
	// configuration makes of the text (here: unguarded, so not fenced).
	fe.Send(&pgproto3.Parse{Query: upd})
	fe.Send(&pgproto3.Sync{})
	until("ReadyForQuery")
	cfg := p.Policy.Config()
	guarded := cfg.Guards
	cfg.Guards = nil
	if err := p.Policy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+" SET fence_epoch = 99")
	fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte("unfenced")}})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	got, codes = until("ReadyForQuery")
	expect("Bind after reload", []string{"BindComplete", "CommandComplete", "ReadyForQuery"}, got, codes)
	if val, epoch := row(t, tbl, 1); val != "unfenced" || epoch != 99 {
		t.Fatalf("after unguarding: row is %q at epoch %d, want the plain write", val, epoch)
	}
	// And guarded again: token 20 is below the row's 99 now.
	cfg.Guards = guarded
	if err := p.Policy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	fe.Send(&pgproto3.Parse{Query: upd})
	fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte("stale")}})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	got, codes = until("ReadyForQuery")
	expect("stale after guarding again", []string{"ParseComplete", "BindComplete", "CommandComplete", "ReadyForQuery"}, got, codes)
	if val, _ := row(t, tbl, 1); val != "unfenced" {
		t.Fatalf("stale write landed: %q", val)
	}
}

// A DEALLOCATE pgfence cannot see (run by a function) drops the statements
// it prepared too. The write that finds its statement gone fails with
// 26000, as a client's own statement would; the session then prepares its
// statements again, so the writes after it work, in both protocols.
func TestHiddenDeallocate(t *testing.T) {
	// The table is named testhiddendeallocate: inside a longer name the
	// word is not the keyword, so writes to it are reused as any others.
	tbl := table(t, [3]any{1, "v", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	forget := `CREATE FUNCTION pg_temp.forget() RETURNS void LANGUAGE plpgsql AS $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$`
	for _, c := range []struct {
		name string
		conn *pgx.Conn
		mode pgx.QueryExecMode
	}{
		{"extended", execMode(t, p), pgx.QueryExecModeExec},
		{"simple", p.Connect(t), pgx.QueryExecModeSimpleProtocol},
	} {
		t.Run(c.name, func(t *testing.T) {
			pgtest.Exec(t, c.conn, forget)
			pgtest.Exec(t, c.conn, "SET fence.token = '10'")
			// The same statement each time: in simple protocol the number
			// is in the text, and pgfence takes it out.
			write := func(v int) error {
				var err error
				if c.mode == pgx.QueryExecModeSimpleProtocol {
					_, err = c.conn.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = 'w' || %d WHERE id = 1", tbl, v), c.mode)
				} else {
					_, err = c.conn.Exec(ctx, "UPDATE "+tbl+" SET val = 'w' || $1::int WHERE id = 1", c.mode, v)
				}
				return err
			}
			for v := range 2 {
				if err := write(v); err != nil {
					t.Fatalf("write %d: %v", v, err)
				}
			}
			if n, _ := reused(t, c.conn); n != 1 {
				t.Fatalf("%d statements prepared for reuse, want 1", n)
			}
			if _, err := c.conn.Exec(ctx, "SELECT pg_temp.forget()", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			if err := write(2); pgErr(t, err).Code != "26000" {
				t.Fatalf("write after a hidden DEALLOCATE: %v, want 26000", err)
			}
			for v := 3; v < 5; v++ {
				if err := write(v); err != nil {
					t.Fatalf("write %d after a hidden DEALLOCATE: %v", v, err)
				}
				if got, epoch := row(t, tbl, 1); got != fmt.Sprint("w", v) || epoch != 10 {
					t.Fatalf("row is %q at epoch %d, want w%d at 10", got, epoch, v)
				}
			}
			if n, _ := reused(t, c.conn); n != 1 {
				t.Fatalf("%d statements prepared for reuse after preparing again, want 1", n)
			}
		})
	}
}
