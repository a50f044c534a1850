package compat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestPgx runs the checks with pgx in each of its query execution modes.
func TestPgx(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{
		{"CacheStatement", pgx.QueryExecModeCacheStatement},
		{"CacheDescribe", pgx.QueryExecModeCacheDescribe},
		{"DescribeExec", pgx.QueryExecModeDescribeExec},
		{"Exec", pgx.QueryExecModeExec},
		{"SimpleProtocol", pgx.QueryExecModeSimpleProtocol},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, "pgx_"+strings.ToLower(m.name))
			p := &pgxDriver{f: f, mode: m.mode}
			for _, c := range []struct {
				name string
				run  func(t *testing.T, ctx context.Context)
			}{
				{checkTxCommit, p.txCommit},
				{checkTxRollback, p.txRollback},
				{checkParams, p.params},
				{checkPrepared, p.prepared},
				{checkError, p.errorRecovery},
				{checkCopyIn, p.copyIn},
				{checkCopyOut, p.copyOut},
				{checkListenNotify, p.listenNotify},
				{checkCancel, p.cancel},
				{checkFenced, p.fenced},
				{checkPipeline, p.pipeline},
				{checkTokenSet, p.tokenSet},
				{checkTokenLocal, p.tokenSetLocal},
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

type pgxDriver struct {
	f    *fixture
	mode pgx.QueryExecMode
}

// connect opens a connection through the proxy in the driver's mode and,
// if token is not "", sets fence.token (with a bound parameter).
func (p *pgxDriver) connect(t *testing.T, ctx context.Context, token string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(p.f.Proxy.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = p.mode
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if token != "" {
		p.exec(t, ctx, c, "SELECT set_config('fence.token', $1, false)", token)
	}
	return c
}

// exec runs sql (with args, so through the mode's own protocol path) and
// returns the rows it reports as affected.
func (p *pgxDriver) exec(t *testing.T, ctx context.Context, c *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	tag, err := c.Exec(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

func (p *pgxDriver) txCommit(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "10")
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (id, val) VALUES ($1, $2)", p.f.Table), 100, "committed"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func (p *pgxDriver) txRollback(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "10")
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (id, val) VALUES ($1, $2)", p.f.Table), 101, "rolled back"); err != nil {
		t.Fatal(err)
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", p.f.Table), "rolled back", 3)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("UPDATE in the transaction: %v, %v", tag, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}

func (p *pgxDriver) params(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "10")
	var sum int
	var s string
	if err := c.QueryRow(ctx, "SELECT $1::int + $2::int, $3::text", 1, 2, "x").Scan(&sum, &s); err != nil || sum != 3 || s != "x" {
		t.Fatalf("SELECT $1::int + $2::int, $3::text = %d, %q, %v; want 3, x", sum, s, err)
	}
	if n := p.exec(t, ctx, c, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", p.f.Table), "param", 4); n != 1 {
		t.Fatalf("UPDATE row 4: %d rows, want 1", n)
	}
}

// prepared runs one UPDATE 20 times: 10 times through a statement prepared
// by name, 10 times by its text (cached and reused by pgx in the Cache*
// modes).
func (p *pgxDriver) prepared(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "10")
	sql := fmt.Sprintf("UPDATE %s SET n = n + 1 WHERE id = $1", p.f.Table)
	if _, err := c.Prepare(ctx, "bump", sql); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		stmt := "bump"
		if i%2 == 1 {
			stmt = sql
		}
		if n := p.exec(t, ctx, c, stmt, 2); n != 1 {
			t.Fatalf("execution %d: %d rows, want 1", i+1, n)
		}
	}
}

func (p *pgxDriver) errorRecovery(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "")
	_, err := c.Exec(ctx, "SELECT 1 / $1::int", 0)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("SELECT 1 / 0: %v, want SQLSTATE 22012", err)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT after the error: %d, %v", one, err)
	}
}

func (p *pgxDriver) copyIn(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "")
	rows := [][]any{{1, "a"}, {2, "b"}, {3, "c"}}
	n, err := c.CopyFrom(ctx, pgx.Identifier{p.f.Plain}, []string{"id", "val"}, pgx.CopyFromRows(rows))
	if err != nil || n != 3 {
		t.Fatalf("CopyFrom: %d rows, %v", n, err)
	}
}

func (p *pgxDriver) copyOut(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "")
	var buf bytes.Buffer
	tag, err := c.PgConn().CopyTo(ctx, &buf, fmt.Sprintf("COPY %s (id, val) TO STDOUT", p.f.Table))
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() < 10 || !strings.Contains(buf.String(), "5\tinit\n") {
		t.Fatalf("COPY TO STDOUT: %s, output %q", tag, buf.String())
	}
}

func (p *pgxDriver) listenNotify(t *testing.T, ctx context.Context) {
	l := p.connect(t, ctx, "")
	p.exec(t, ctx, l, "LISTEN "+p.f.Channel)
	n := p.connect(t, ctx, "")
	p.exec(t, ctx, n, "SELECT pg_notify($1, $2)", p.f.Channel, "hello")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	note, err := l.WaitForNotification(wctx)
	if err != nil || note.Channel != p.f.Channel || note.Payload != "hello" {
		t.Fatalf("WaitForNotification: %+v, %v", note, err)
	}
}

// cancel uses pgconn's CancelRequest (a CancelRequest on a new connection
// with the session's backend key) while pg_sleep(30) runs.
func (p *pgxDriver) cancel(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "")
	start := time.Now()
	result := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "SELECT pg_sleep($1)", 30)
		result <- err
	}()
	pgtest.Sleeping(t, c.PgConn().PID())
	// Postgres signals the backend twice for one CancelRequest (its pid,
	// then its process group), and the second signal can land on the next
	// statement. CancelRequest returns once Postgres has closed the cancel
	// connection, after both signals, so wait for it as a careful client does.
	if err := c.PgConn().CancelRequest(ctx); err != nil {
		t.Errorf("CancelRequest: %v", err)
	}
	err := <-result
	elapsed := time.Since(start)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("SELECT pg_sleep(30): %v after %v, want SQLSTATE 57014", err, elapsed)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("cancelled only after %v", elapsed)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT after the cancel: %d, %v", one, err)
	}
}

func (p *pgxDriver) fenced(t *testing.T, ctx context.Context) {
	b := p.connect(t, ctx, "43")
	a := p.connect(t, ctx, "42")
	update := fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", p.f.Table)
	if n := p.exec(t, ctx, b, update, "B", 1); n != 1 {
		t.Fatalf("writer B (token 43): %d rows, want 1", n)
	}
	if n := p.exec(t, ctx, a, update, "A", 1); n != 0 {
		t.Fatalf("writer A (token 42, stale): %d rows, want 0", n)
	}
	var val string
	if err := a.QueryRow(ctx, fmt.Sprintf("SELECT val FROM %s WHERE id = $1", p.f.Table), 1).Scan(&val); err != nil || val != "B" {
		t.Fatalf("row 1 is %q (%v), want B", val, err)
	}
}

// pipeline sends a batch (pipelined extended protocol; one multi-statement
// query string in SimpleProtocol mode): a write, a stale write, an insert
// and a read.
func (p *pgxDriver) pipeline(t *testing.T, ctx context.Context) {
	b := p.connect(t, ctx, "43")
	p.exec(t, ctx, b, fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", p.f.Table), "B", 7)
	c := p.connect(t, ctx, "10")
	batch := &pgx.Batch{}
	batch.Queue(fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", p.f.Table), "pipeline", 6)
	batch.Queue(fmt.Sprintf("UPDATE %s SET val = $1 WHERE id = $2", p.f.Table), "pipeline", 7)
	batch.Queue(fmt.Sprintf("INSERT INTO %s (id, val) VALUES ($1, $2)", p.f.Table), 102, "pipeline")
	batch.Queue(fmt.Sprintf("SELECT val FROM %s WHERE id = $1", p.f.Table), 6)
	br := c.SendBatch(ctx, batch)
	for i, want := range []int64{1, 0, 1} {
		tag, err := br.Exec()
		if err != nil || tag.RowsAffected() != want {
			t.Fatalf("batch statement %d: %v (%v), want %d rows", i+1, tag, err, want)
		}
	}
	var val string
	if err := br.QueryRow().Scan(&val); err != nil || val != "pipeline" {
		t.Fatalf("batch SELECT: %q, %v", val, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
}

// tokenSet sets the token with plain SETs, as an application does. pgx
// sends a statement without arguments as a simple Query in every mode.
func (p *pgxDriver) tokenSet(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "")
	for _, s := range p.f.tokenSetSteps() {
		if n := p.exec(t, ctx, c, s.sql); n != s.rows {
			t.Fatalf("%s: %d rows, want %d", s.sql, n, s.rows)
		}
	}
	if n := p.exec(t, ctx, c, fmt.Sprintf("UPDATE %s SET n = n + 1 WHERE id = $1", p.f.Table), 103); n != 1 {
		t.Fatalf("UPDATE with token 11 again: %d rows, want 1", n)
	}
}

// tokenSetLocal sets the token with SET LOCAL in each transaction, as an
// application that shares connections should.
func (p *pgxDriver) tokenSetLocal(t *testing.T, ctx context.Context) {
	c := p.connect(t, ctx, "")
	for _, s := range p.f.tokenLocalSteps() {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL fence.token = '"+s.token+"'"); err != nil {
			t.Fatalf("SET LOCAL fence.token = '%s': %v", s.token, err)
		}
		tag, err := tx.Exec(ctx, s.sql, s.args...)
		if err != nil {
			t.Fatalf("%s: %v", s.sql, err)
		}
		if tag.RowsAffected() != s.rows {
			t.Fatalf("%s with token %s: %d rows, want %d", s.sql, s.token, tag.RowsAffected(), s.rows)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
