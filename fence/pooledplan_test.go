package fence_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgbouncer"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// startBouncer runs PgBouncer in pool_mode (poolSize server connections)
// in front of the test Postgres, stopped when the test ends.
func startBouncer(t *testing.T, poolMode string, poolSize int) *pgbouncer.PgBouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: pgtest.Server().Addr(), PoolMode: poolMode, PoolSize: poolSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("PgBouncer's log:\n%s", b.Log())
		}
		b.Stop()
	})
	return b
}

// pooledProxy starts pgfence with --upstream-pooling=transaction in front
// of a transaction-pooling PgBouncer with poolSize server connections.
func pooledProxy(t *testing.T, poolSize int, guards ...string) (*pgtest.Proxy, *pgbouncer.PgBouncer) {
	t.Helper()
	b := startBouncer(t, "transaction", poolSize)
	p := pgtest.StartProxy(t, guards, func(pc *proxy.Config, fc *fence.Config) {
		pc.Upstream, pc.UpstreamTLS = b.Addr(), nil
		pc.GoroutineRelay = false // transaction pooling needs the event loop
		pc.TransactionPooling, pc.TokenSetting = true, "fence.token"
		fc.TransactionPooling = true
	})
	return p, b
}

// bouncerConn connects to PgBouncer itself, bypassing pgfence, in the
// exec mode PgBouncer supports.
func bouncerConn(t *testing.T, b *pgbouncer.PgBouncer) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// pooledConn connects through p in pgx's exec mode (no named statements,
// which PgBouncer 1.18 cannot pool).
func pooledConn(t *testing.T, p *pgtest.Proxy) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Behind a transaction pooler with fewer server connections than clients,
// every client's writes carry its own token and no other: each client
// writes its own row in every form the proxy handles differently, and
// each write must stamp the client's token. A stale client's writes
// change nothing, and a client that never set a token is refused, even
// though other clients' tokens were on the same server connections a
// moment before.
func TestPooledTokensStayWithTheirClient(t *testing.T) {
	const writers, rounds = 6, 15
	var rows [][3]any
	for i := 0; i <= writers; i++ {
		rows = append(rows, [3]any{i, "init", 0})
	}
	rows[0][2] = 1000 // written by a newer holder than the stale client
	tbl := table(t, rows...)
	p, b := pooledProxy(t, 2, tbl)

	forms := []struct {
		name string
		// write updates row id to val and returns the rows it changed and
		// the epoch it stamped (-1 when the form does not return it).
		write func(c *pgx.Conn, id int, val string) (int64, int64, error)
	}{
		{"simple Query (bound)", func(c *pgx.Conn, id int, val string) (int64, int64, error) {
			tag, err := c.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = '%s' WHERE id = %d", tbl, val, id), simple)
			return tag.RowsAffected(), -1, err
		}},
		{"extended, unnamed", func(c *pgx.Conn, id int, val string) (int64, int64, error) {
			tag, err := c.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", tbl), val, id)
			return tag.RowsAffected(), -1, err
		}},
		{"simple Query with RETURNING", func(c *pgx.Conn, id int, val string) (int64, int64, error) {
			var n, epoch int64 = 0, -1
			rows, err := c.Query(ctx, fmt.Sprintf("UPDATE %s SET val = '%s' WHERE id = %d RETURNING fence_epoch", tbl, val, id), simple)
			if err != nil {
				return 0, -1, err
			}
			for rows.Next() {
				n++
				if err := rows.Scan(&epoch); err != nil {
					return 0, -1, err
				}
			}
			return n, epoch, rows.Err()
		}},
		{"two statements in one Query", func(c *pgx.Conn, id int, val string) (int64, int64, error) {
			tag, err := c.Exec(ctx, fmt.Sprintf("SELECT 1; UPDATE %s SET val = '%s' WHERE id = %d", tbl, val, id), simple)
			return tag.RowsAffected(), -1, err
		}},
		{"transaction block", func(c *pgx.Conn, id int, val string) (int64, int64, error) {
			tx, err := c.Begin(ctx)
			if err != nil {
				return 0, -1, err
			}
			defer tx.Rollback(ctx)
			tag, err := tx.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", tbl), val, id)
			if err != nil {
				return 0, -1, err
			}
			return tag.RowsAffected(), -1, tx.Commit(ctx)
		}},
	}

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	report := func(format string, args ...any) {
		select {
		case errs <- fmt.Errorf(format, args...):
		default:
		}
	}
	epochOf := func(c *pgx.Conn, id int) int64 {
		var e int64
		if err := c.QueryRow(ctx, fmt.Sprintf("SELECT fence_epoch FROM %s WHERE id = %d", tbl, id)).Scan(&e); err != nil {
			report("reading row %d: %v", id, err)
		}
		return e
	}
	for w := 1; w <= writers; w++ {
		c := pooledConn(t, p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				token := int64(100*w + r) // grows, as a lease's token does
				if _, err := c.Exec(ctx, "SET fence.token = '"+strconv.FormatInt(token, 10)+"'", simple); err != nil {
					report("writer %d: SET: %v", w, err)
					return
				}
				f := forms[(w+r)%len(forms)]
				n, epoch, err := f.write(c, w, fmt.Sprintf("w%d-%d", w, r))
				if err != nil {
					report("writer %d, %s: %v", w, f.name, err)
					return
				}
				if epoch < 0 {
					epoch = epochOf(c, w)
				}
				if n != 1 || epoch != token {
					report("writer %d, %s: %d rows, epoch %d; want 1 row stamped with its token %d", w, f.name, n, epoch, token)
				}
			}
		}()
	}
	stale := pooledConn(t, p)
	exec(t, stale, simple, "SET fence.token = '1'")
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r := range rounds {
			f := forms[r%len(forms)]
			n, _, err := f.write(stale, 0, fmt.Sprint("stale-", r))
			if err != nil || n != 0 {
				report("stale writer, %s: %d rows, %v; want 0 rows", f.name, n, err)
			}
		}
	}()
	none := pooledConn(t, p)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r := range rounds {
			f := forms[r%len(forms)]
			n, _, err := f.write(none, 0, fmt.Sprint("none-", r))
			if err == nil {
				report("writer without a token, %s: %d rows and no error; want 55000", f.name, n)
				continue
			}
			if pe := pgErr(t, err); pe.Code != "55000" {
				report("writer without a token, %s: %s %s; want 55000", f.name, pe.Code, pe.Message)
			}
		}
	}()
	// The clients run on two event loops at least, which share the
	// pooler's server connections.
	if p.Server.EventLoops() >= 2 {
		busy := 0
		for _, n := range p.Server.LoopSessions() {
			busy += min(n, 1)
		}
		if busy < 2 {
			t.Errorf("the %d clients are on %d event loop: %v", writers+2, busy, p.Server.LoopSessions())
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if val, epoch := row(t, tbl, 0); val != "init" || epoch != 1000 {
		t.Errorf("row 0 = %q, epoch %d; want it untouched (init, 1000)", val, epoch)
	}
	if got := rejects(t, p, tbl); got != rounds {
		t.Errorf("fencing_reject_total = %v, want %d (each stale write)", got, rounds)
	}

	// Nothing of pgfence's stays on the server connections: no token set
	// for the session, no statement, no marker.
	direct := bouncerConn(t, b)
	for range 8 {
		var token, marker string
		var stmts int
		err := direct.QueryRow(ctx, `SELECT coalesce(current_setting('fence.token', true), ''), coalesce(current_setting('pgfence.tx.fence.token', true), ''),
			(SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgfence%')`).Scan(&token, &marker, &stmts)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" || marker != "" || stmts != 0 {
			t.Fatalf("a pooled server connection keeps fence.token %q, marker %q and %d statements of pgfence's; want none", token, marker, stmts)
		}
	}
}

// SET LOCAL in a block wins over the session's token for that block only;
// RESET drops the session's token; the ways that would change the token
// for the session where pgfence cannot follow are refused, saying how to
// set it instead.
func TestPooledSettingForms(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 0})
	p, _ := pooledProxy(t, 1, tbl)
	c := pooledConn(t, p)
	exec(t, c, simple, "SET fence.token = '10'")

	exec(t, c, simple, "BEGIN")
	exec(t, c, simple, "SET LOCAL fence.token = '20'")
	exec(t, c, pgx.QueryExecModeExec, "UPDATE "+tbl+" SET val = 'b' WHERE id = 1")
	exec(t, c, simple, "COMMIT")
	if _, epoch := row(t, tbl, 1); epoch != 20 {
		t.Fatalf("after SET LOCAL 20 in a block: epoch %d, want 20", epoch)
	}
	if got := show(t, c); got != "10" {
		t.Fatalf("after the block, the session's token reads %q, want 10", got)
	}
	// set_config(..., true) in a block, the pooled way the README shows.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('fence.token', $1, true)", "30"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE "+tbl+" SET val = 'c' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, epoch := row(t, tbl, 1); epoch != 30 {
		t.Fatalf("after set_config(..., true) in a block: epoch %d, want 30", epoch)
	}
	// The session's token of 10 is now stale.
	if tag := exec(t, c, simple, "UPDATE "+tbl+" SET val = 'd' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("a write with the session's token 10 after 30: %s, want UPDATE 0", tag)
	}
	if tag := exec(t, c, simple, "RESET fence.token"); tag != "RESET" {
		t.Fatalf("RESET fence.token: %s", tag)
	}
	if got := show(t, c); got != "" {
		t.Fatalf("after RESET, the token reads %q, want it unset", got)
	}
	_, err = c.Exec(ctx, "UPDATE "+tbl+" SET val = 'e' WHERE id = 1", simple)
	if pe := pgErr(t, err); pe.Code != "55000" {
		t.Fatalf("a write after RESET: %s %s, want 55000", pe.Code, pe.Message)
	}

	for _, sql := range []string{
		"SELECT set_config('fence.token', '40', false)",
		"SET fence.token = '40'; SELECT 1",
		"RESET ALL",
		"DISCARD ALL",
	} {
		_, err := c.Exec(ctx, sql, simple)
		if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "transaction pooler") {
			t.Errorf("%s: %s %q, want 0A000 naming the transaction pooler", sql, pe.Code, pe.Message)
		}
	}
	// A plain SET or RESET in a block is refused, naming what it is (the
	// statement that refuses it is made once per configuration).
	for _, sql := range []string{"SET fence.token = '40'", "RESET fence.token", "set Fence.Token to 41"} {
		exec(t, c, simple, "BEGIN")
		_, err = c.Exec(ctx, sql, simple)
		form := "SET fence.token"
		if strings.HasPrefix(sql, "RESET") {
			form = "RESET fence.token"
		}
		if pe := pgErr(t, err); pe.Code != "0A000" || !strings.HasPrefix(pe.Message, "pgfence: "+form+", pipelined behind another statement or inside a transaction block, would change") ||
			!strings.Contains(pe.Hint, "SET LOCAL") {
			t.Errorf("%s in a block: %s %q (hint %q), want 0A000 naming %s with a hint saying how to set it", sql, pe.Code, pe.Message, pe.Hint, form)
		}
		exec(t, c, simple, "ROLLBACK")
	}
	if got := show(t, c); got != "" {
		t.Fatalf("after the refused SETs, the token reads %q, want it still unset", got)
	}
	// What cannot run in a transaction block still runs.
	exec(t, c, simple, "SET fence.token = '50'")
	exec(t, c, simple, "VACUUM "+tbl)
	exec(t, c, simple, "CREATE INDEX CONCURRENTLY ON "+tbl+" (val)")
}

// PgBouncer in session mode in front of pgfence: each client's session
// gets a pgfence session of its own for as long as it lasts, so tokens
// stay with their clients; when a client leaves, PgBouncer's DISCARD ALL
// resets the session for the next one, which must not inherit the token.
func TestBouncerInFrontSessionMode(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	ctx2, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	host, _, _ := strings.Cut(p.Addr, ":")
	if host != "127.0.0.1" {
		t.Fatalf("proxy address %s", p.Addr)
	}
	b, err := pgbouncer.Start(ctx2, pgbouncer.Options{Upstream: p.Addr, PoolMode: "session", PoolSize: 1,
		Extra: []string{"server_tls_sslmode = " + map[bool]string{true: "require", false: "disable"}[pgtest.TLS()]}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", b.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := connect()
	exec(t, c, simple, "SET fence.token = '3'")
	if tag := exec(t, c, simple, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("a stale write through PgBouncer and pgfence: %s", tag)
	}
	exec(t, c, simple, "SET fence.token = '9'")
	if tag := exec(t, c, pgx.QueryExecModeExec, "UPDATE "+tbl+" SET val = 'fresh' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("a fresh write through PgBouncer and pgfence: %s", tag)
	}
	c.Close(ctx)
	// The pool's one server connection (one pgfence session) is the next
	// client's, after PgBouncer's DISCARD ALL.
	c = connect()
	defer c.Close(ctx)
	if got := show(t, c); got != "" && got != "<unset>" {
		t.Fatalf("the next client of the same pgfence session reads token %q, want none", got)
	}
	_, err = c.Exec(ctx, "UPDATE "+tbl+" SET val = 'inherited' WHERE id = 1", simple)
	if pe := pgErr(t, err); pe.Code != "55000" {
		t.Fatalf("a write by the next client without a token: %s %s, want 55000", pe.Code, pe.Message)
	}
	if v, e := row(t, tbl, 1); v != "fresh" || e != 9 {
		t.Fatalf("row is (%s, %d), want (fresh, 9)", v, e)
	}
}

// COPY in and out through a transaction pooler: the statement pgfence
// puts in front of the COPY's Query does not get in the way of its data.
func TestPooledCopy(t *testing.T) {
	tbl := table(t)
	plain := tbl + "_plain"
	pgtest.Exec(t, pgtest.Direct(t), "CREATE TABLE "+plain+" (id int, val text)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE "+plain) })
	p, _ := pooledProxy(t, 1, tbl)
	c := pooledConn(t, p)
	exec(t, c, simple, "SET fence.token = '4'")
	n, err := c.CopyFrom(ctx, pgx.Identifier{plain}, []string{"id", "val"}, pgx.CopyFromRows([][]any{{1, "a"}, {2, "b"}, {3, "c"}}))
	if err != nil || n != 3 {
		t.Fatalf("COPY FROM through the pooler: %d rows, %v", n, err)
	}
	var sum int
	if err := c.QueryRow(ctx, "SELECT sum(id) FROM "+plain).Scan(&sum); err != nil || sum != 6 {
		t.Fatalf("after COPY: sum %d, %v", sum, err)
	}
	res, err := c.PgConn().CopyTo(ctx, discard{}, "COPY "+plain+" TO STDOUT")
	if err != nil || res.RowsAffected() != 3 {
		t.Fatalf("COPY TO through the pooler: %v, %v", res, err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Behind a transaction pooler nobody told pgfence of (no TransactionPooling
// here, and the serve-level check bypassed), a session whose next
// transaction lands on another server connection is ended, naming the
// flag, the moment its token is set there: the write that went with it
// carried its own token, and nothing runs after.
func TestUndeclaredPoolerEndsSession(t *testing.T) {
	if !answersSets() {
		t.Skip("the goroutine relay answers no SET: nothing is deferred")
	}
	tbl := table(t, [3]any{1, "a", 0}, [3]any{2, "b", 0})
	b := startBouncer(t, "transaction", 2)
	p := pgtest.StartProxy(t, []string{tbl}, func(pc *proxy.Config, fc *fence.Config) {
		pc.Upstream, pc.UpstreamTLS = b.Addr(), nil
	})
	a := pooledConn(t, p)
	exec(t, a, simple, "SET fence.token = '5'")
	exec(t, a, simple, "UPDATE "+tbl+" SET val = 'x' WHERE id = 1") // server connection X
	// Another client holds X in a transaction; a's next one gets Y.
	other := bouncerConn(t, b)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var busy uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&busy); err != nil {
		t.Fatal(err)
	}
	// On Y the session's own set statement does not exist (its name is
	// the session's alone): the write fails with 26000 and does not run.
	// pgfence prepares it again for the next, which tells it the server
	// process changed.
	exec(t, a, simple, "SET fence.token = '6'")
	_, err = a.Exec(ctx, "UPDATE "+tbl+" SET val = 'y' WHERE id = 2", simple)
	if pe := pgErr(t, err); pe.Code != "26000" || !strings.Contains(pe.Message, "pgfence.set.") {
		t.Fatalf("a write on another server connection: %s %q, want 26000 naming pgfence's statement", pe.Code, pe.Message)
	}
	if v, _ := row(t, tbl, 2); v != "b" {
		t.Fatalf("the write behind the failed SET ran: row 2 is %q", v)
	}
	_, err = a.Exec(ctx, "UPDATE "+tbl+" SET val = 'z' WHERE id = 2", simple)
	if err == nil {
		_, err = a.Exec(ctx, "SELECT 1", simple)
	}
	if pe := pgErr(t, err); pe.Code != "08006" || !strings.Contains(pe.Hint, "transaction pooler") {
		t.Fatalf("a session moved to another server connection: %s %q (hint %q), want 08006 saying to declare the transaction pooler", pe.Code, pe.Message, pe.Hint)
	}
	if v, e := row(t, tbl, 2); v != "b" && e != 6 {
		t.Fatalf("a write landed with epoch %d", e)
	}
}
