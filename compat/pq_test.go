package compat

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestLibPQ runs the checks with lib/pq, Go's other widely used driver,
// through database/sql, in both of its ways of sending a statement with
// arguments: by default the unnamed statement is parsed and described in
// one exchange (Parse, Describe, Sync) and bound and run in a second (Bind,
// Execute, Sync); with binary_parameters=yes all of it goes in one batch
// (Parse, Bind, Describe, Execute, Sync). A statement without arguments is
// a simple Query in both. A third run asks for the newest protocol
// (max_protocol_version=latest: 3.2, whose cancel keys are longer, where
// Postgres 18 serves it; a NegotiateProtocolVersion down to 3.0 before).
// lib/pq has no pipelining, so no pipeline check.
func TestLibPQ(t *testing.T) {
	t.Parallel()
	for _, m := range []struct{ name, param string }{
		{"TwoExchanges", ""},
		{"BinaryParameters", "binary_parameters=yes"},
		{"LatestProtocol", "max_protocol_version=latest"},
	} {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, "pq_"+strings.ToLower(m.name))
			var extra []string
			if m.param != "" {
				extra = append(extra, m.param)
			}
			d := &pqDriver{f: f, url: f.Proxy.URL(extra...)}
			for _, c := range []struct {
				name string
				run  func(t *testing.T, ctx context.Context)
			}{
				{checkTxCommit, d.txCommit},
				{checkTxRollback, d.txRollback},
				{checkParams, d.params},
				{checkPrepared, d.prepared},
				{checkError, d.errorRecovery},
				{checkCopyIn, d.copyIn},
				{checkListenNotify, d.listenNotify},
				{checkCancel, d.cancel},
				{checkFenced, d.fenced},
				{checkTokenSet, d.tokenSet},
				{checkTokenLocal, d.tokenSetLocal},
			} {
				t.Run(c.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					f.answeredBase = f.answered(t)
					c.run(t, ctx)
					if !t.Failed() {
						f.verify(t, c.name)
					}
				})
			}
		})
	}
}

type pqDriver struct {
	f   *fixture
	url string // the proxy's, with the mode's parameters
}

// connect opens one connection through the proxy (database/sql's pool
// would spread a session's statements over several) and, if token is not
// "", sets fence.token with a bound parameter.
func (d *pqDriver) connect(t *testing.T, ctx context.Context, token string) *sql.Conn {
	t.Helper()
	db, err := sql.Open("postgres", d.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if token != "" {
		d.exec(t, ctx, c, "SELECT set_config('fence.token', $1, false)", token)
	}
	return c
}

// exec runs query on c and returns the rows it reports as affected.
func (d *pqDriver) exec(t *testing.T, ctx context.Context, c *sql.Conn, query string, args ...any) int64 {
	t.Helper()
	res, err := c.ExecContext(ctx, query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		t.Fatalf("%s: rows affected: %v", query, err)
	}
	return n
}

func (d *pqDriver) txCommit(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "10")
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (id, val) VALUES ($1, $2)", d.f.Table), 100, "committed"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func (d *pqDriver) txRollback(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "10")
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (id, val) VALUES ($1, $2)", d.f.Table), 101, "rolled back"); err != nil {
		t.Fatal(err)
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", d.f.Table), "rolled back", 3)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("UPDATE in the transaction: %d rows, want 1", n)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
}

func (d *pqDriver) params(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "10")
	var sum int
	var s string
	if err := c.QueryRowContext(ctx, "SELECT $1::int + $2::int, $3::text", 1, 2, "x").Scan(&sum, &s); err != nil || sum != 3 || s != "x" {
		t.Fatalf("SELECT $1::int + $2::int, $3::text = %d, %q, %v; want 3, x", sum, s, err)
	}
	if n := d.exec(t, ctx, c, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", d.f.Table), "param", 4); n != 1 {
		t.Fatalf("UPDATE row 4: %d rows, want 1", n)
	}
}

// prepared runs one UPDATE 20 times: 10 times through a statement lib/pq
// prepares by name (Parse, Describe, Sync once; then Bind, Execute, Sync
// each time), 10 times by its text through the unnamed statement.
func (d *pqDriver) prepared(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "10")
	query := fmt.Sprintf("UPDATE %s SET n = n + 1 WHERE id = $1", d.f.Table)
	stmt, err := c.PrepareContext(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	for i := 0; i < 20; i++ {
		var res sql.Result
		if i%2 == 0 {
			res, err = stmt.ExecContext(ctx, 2)
		} else {
			res, err = c.ExecContext(ctx, query, 2)
		}
		if err != nil {
			t.Fatalf("execution %d: %v", i+1, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("execution %d: %d rows, want 1", i+1, n)
		}
	}
}

func (d *pqDriver) errorRecovery(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "")
	_, err := c.ExecContext(ctx, "SELECT 1 / $1::int", 0)
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "22012" {
		t.Fatalf("SELECT 1 / 0: %v, want SQLSTATE 22012", err)
	}
	var one int
	if err := c.QueryRowContext(ctx, "SELECT $1::int", 1).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT after the error: %d, %v", one, err)
	}
}

// copyIn uses lib/pq's COPY FROM STDIN: a prepared COPY statement in a
// transaction, a row per Exec, and an Exec without arguments to end it.
func (d *pqDriver) copyIn(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "")
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	stmt, err := tx.PrepareContext(ctx, fmt.Sprintf("COPY %s (id, val) FROM STDIN", d.f.Plain))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"a", "b", "c"} {
		if _, err := stmt.ExecContext(ctx, i+1, v); err != nil {
			t.Fatalf("COPY row %d: %v", i+1, err)
		}
	}
	if _, err := stmt.ExecContext(ctx); err != nil {
		t.Fatalf("ending the COPY: %v", err)
	}
	if err := stmt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// listenNotify uses lib/pq's Listener, which keeps a connection of its own.
func (d *pqDriver) listenNotify(t *testing.T, ctx context.Context) {
	l := pq.NewListener(d.url, 100*time.Millisecond, time.Second, nil)
	t.Cleanup(func() { l.Close() })
	if err := l.Listen(d.f.Channel); err != nil {
		t.Fatalf("LISTEN: %v", err)
	}
	n := d.connect(t, ctx, "")
	d.exec(t, ctx, n, "SELECT pg_notify($1, $2)", d.f.Channel, "hello")
	select {
	case note := <-l.Notify:
		if note == nil || note.Channel != d.f.Channel || note.Extra != "hello" {
			t.Fatalf("notification %+v, want channel %s and payload hello", note, d.f.Channel)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification within 5 s")
	}
}

// cancel ends the context of a running pg_sleep(30): lib/pq then sends a
// CancelRequest on a connection of its own, and, as it does after every
// cancel, closes the connection the statement ran on.
func (d *pqDriver) cancel(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "")
	var pid uint32
	if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	result := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(sctx, "SELECT pg_sleep($1)", 30)
		result <- err
	}()
	pgtest.Sleeping(t, pid)
	stop()
	err := <-result
	elapsed := time.Since(start)
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "57014" {
		t.Fatalf("SELECT pg_sleep(30): %v after %v, want SQLSTATE 57014", err, elapsed)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("cancelled only after %v", elapsed)
	}
	again := d.connect(t, ctx, "")
	var one int
	if err := again.QueryRowContext(ctx, "SELECT $1::int", 1).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT on a new connection after the cancel: %d, %v", one, err)
	}
}

func (d *pqDriver) fenced(t *testing.T, ctx context.Context) {
	b := d.connect(t, ctx, "43")
	a := d.connect(t, ctx, "42")
	update := fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", d.f.Table)
	if n := d.exec(t, ctx, b, update, "B", 1); n != 1 {
		t.Fatalf("writer B (token 43): %d rows, want 1", n)
	}
	if n := d.exec(t, ctx, a, update, "A", 1); n != 0 {
		t.Fatalf("writer A (token 42, stale): %d rows, want 0", n)
	}
	var val string
	if err := a.QueryRowContext(ctx, fmt.Sprintf("SELECT val FROM %s WHERE id = $1", d.f.Table), 1).Scan(&val); err != nil || val != "B" {
		t.Fatalf("row 1 is %q (%v), want B", val, err)
	}
}

// tokenSet sets the token with plain SETs, which lib/pq sends as simple
// Queries (no arguments).
func (d *pqDriver) tokenSet(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "")
	for _, s := range d.f.tokenSetSteps() {
		if n := d.exec(t, ctx, c, s.sql); n != s.rows {
			t.Fatalf("%s: %d rows, want %d", s.sql, n, s.rows)
		}
	}
	if n := d.exec(t, ctx, c, fmt.Sprintf("UPDATE %s SET n = n + 1 WHERE id = $1", d.f.Table), 103); n != 1 {
		t.Fatalf("UPDATE with token 11 again: %d rows, want 1", n)
	}
}

// tokenSetLocal sets the token with SET LOCAL in each transaction, which
// lib/pq opens with a BEGIN of its own.
func (d *pqDriver) tokenSetLocal(t *testing.T, ctx context.Context) {
	c := d.connect(t, ctx, "")
	for _, s := range d.f.tokenLocalSteps() {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "SET LOCAL fence.token = '"+s.token+"'"); err != nil {
			t.Fatalf("SET LOCAL fence.token = '%s': %v", s.token, err)
		}
		res, err := tx.ExecContext(ctx, s.sql, s.args...)
		if err != nil {
			t.Fatalf("%s: %v", s.sql, err)
		}
		if n, _ := res.RowsAffected(); n != s.rows {
			t.Fatalf("%s with token %s: %d rows, want %d", s.sql, s.token, n, s.rows)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
