package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/proxy"
)

func wantCode(t *testing.T, err error, code string) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("want SQLSTATE %s, got %v", code, err)
	}
	return pe
}

// backends counts client backends with an application_name prefix.
func backends(t *testing.T, prefix string) int {
	t.Helper()
	var n int
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 || '%'", prefix).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStartupTimeout(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.StartupTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := conn.Read(b[:]); err == nil {
		t.Fatal("a silent client got data instead of being dropped")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("silent client dropped after %v, want about 300ms", d)
	}
	pgtest.Exec(t, p.Connect(t), "SELECT 1")
}

// A client that goes away mid-query or mid-transaction has its backend
// released and its transaction rolled back.
func TestClientVanishes(t *testing.T) {
	p := pgtest.StartRelay(t)
	pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS vanish_t; CREATE TABLE vanish_t (id int)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS vanish_t") })

	conn, fe := pgtest.RawSession(t, p.Addr)
	fe.Send(&pgproto3.Query{String: "SET application_name = 'vanish-query'; SELECT pg_sleep(60)"})
	fe.Flush()
	c2 := p.Connect(t, "application_name=vanish-tx")
	pgtest.Exec(t, c2, "BEGIN")
	pgtest.Exec(t, c2, "INSERT INTO vanish_t VALUES (1)")
	poll.Eventually(t, 10*time.Second, "both sessions showing", func() bool { return backends(t, "vanish-") == 2 })

	conn.Close()
	c2.PgConn().Conn().Close() // no Terminate: the socket just goes away
	poll.Eventually(t, 10*time.Second, "the backends released", func() bool { return backends(t, "vanish-") == 0 })
	var n int
	pgtest.Direct(t).QueryRow(ctx, "SELECT count(*) FROM vanish_t").Scan(&n)
	if n != 0 {
		t.Fatal("the vanished client's transaction was committed")
	}
}

func TestUpstreamUnreachable(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.Upstream = dead })
	_, err := pgx.Connect(ctx, p.URL())
	pe := wantCode(t, err, "08001")
	if !strings.Contains(pe.Message, "cannot connect to Postgres at "+dead) {
		t.Fatalf("message %q", pe.Message)
	}
}

func TestMaxClientConns(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.MaxClientConns = 2 })
	a := p.Connect(t)
	p.Connect(t)
	// Refused before pgfence reads anything, the error comes where a TLS
	// client awaits the answer to its SSLRequest: in plain text only.
	_, err := pgx.Connect(ctx, p.URL("sslmode=disable"))
	pe := wantCode(t, err, "53300")
	if !strings.Contains(pe.Message, "too many client connections") {
		t.Fatalf("message %q", pe.Message)
	}
	a.Close(ctx)
	poll.Eventually(t, 10*time.Second, "a slot freed", func() bool { return p.Server.Sessions() < 2 })
	pgtest.Exec(t, p.Connect(t), "SELECT 1")
}

// Many sessions come and go: no goroutine and no server connection stays.
func TestNoLeaks(t *testing.T) {
	p := pgtest.StartRelay(t)
	warm := p.Connect(t)
	pgtest.Exec(t, warm, "SELECT 1")
	warm.Close(ctx)
	poll.Eventually(t, 10*time.Second, "the warm-up session ending", func() bool { return p.Server.Sessions() == 0 })
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := pgx.Connect(ctx, p.URL(fmt.Sprintf("application_name=leak-%d", i)))
			if err != nil {
				t.Error(err)
				return
			}
			c.Exec(ctx, "SELECT 1")
			if i%2 == 0 {
				c.Close(ctx)
			} else {
				c.PgConn().Conn().Close()
			}
		}(i)
	}
	wg.Wait()
	poll.Eventually(t, 10*time.Second, "the sessions ending", func() bool { return p.Server.Sessions() == 0 })
	poll.Eventually(t, 10*time.Second, "the server connections closing", func() bool { return backends(t, "leak-") == 0 })
	poll.Eventually(t, 10*time.Second, "the goroutines returning", func() bool { return runtime.NumGoroutine() <= base+2 })
}

// Postgres restarts under load: sessions in flight get an error, the proxy
// stays up, and new sessions work as soon as Postgres is back. The restart
// waits for every session to be connected and mid-query, as Postgres sees
// it: on a busy machine the clients could otherwise all be between
// statements, and the test would prove nothing.
func TestPostgresRestart(t *testing.T) {
	pgtest.Need(t)
	pg, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.Upstream = pg.Addr() })
	url := "postgres://postgres@" + p.Addr + "/postgres?sslmode=disable"
	direct, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	// The sessions' queries as Postgres runs them (not this one's).
	const query = "SELECT pg_sleep(600) -- restart"
	running := func() int {
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = $1`, query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	const sessions = 4
	idle := make([]*pgx.Conn, 2)
	for k := range idle {
		idle[k] = pgtest.Connect(t, url)
		pgtest.Exec(t, idle[k], "SELECT 1")
	}
	errs := make(chan error, sessions)
	for i := 0; i < sessions; i++ {
		c := pgtest.Connect(t, url)
		go func() {
			// Bounded, so that a query that hangs across the restart
			// fails the test instead of stalling it.
			qctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, err := c.Exec(qctx, query)
			errs <- err
		}()
	}
	poll.Eventually(t, 30*time.Second, fmt.Sprintf("%d sessions running their query in Postgres", sessions), func() bool { return running() == sessions })
	direct.Close(ctx)
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// Every session mid-query gets an error, none hangs.
	for i := 0; i < sessions; i++ {
		err := <-errs
		switch {
		case err == nil:
			t.Error("a query ran on across the restart")
		case errors.Is(err, context.DeadlineExceeded):
			t.Error("a query hung across the restart instead of failing")
		}
	}
	// An idle session's next statement fails too (its server is gone).
	for _, c := range idle {
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Error("an idle session's statement ran after the restart on a server connection that is gone")
		}
	}
	c := pgtest.Connect(t, url) // the proxy is up and Postgres is back
	pgtest.Exec(t, c, "SELECT 1")
	poll.Eventually(t, 30*time.Second, "the failed sessions to end in the proxy", func() bool { return p.Server.Sessions() == 1 })
}

// Shutdown drains: idle sessions end at once with 57P01, a session in a
// transaction may finish it, then ends too.
func TestShutdownDrains(t *testing.T) {
	p := pgtest.StartRelay(t)
	idle := p.Connect(t)
	busy := p.Connect(t)
	pgtest.Exec(t, busy, "BEGIN")
	pgtest.Exec(t, busy, "SELECT 1")

	done := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		done <- p.Server.Shutdown(sctx)
	}()
	poll.Eventually(t, 10*time.Second, "the idle session ending", func() bool { return p.Server.Sessions() == 1 })
	_, err := idle.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("idle session still works during a drain")
	}
	if tag := pgtest.Exec(t, busy, "SELECT 2"); tag != "SELECT 1" {
		t.Fatal(tag)
	}
	pgtest.Exec(t, busy, "COMMIT")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not finish after the last transaction ended")
	}
	if _, err := busy.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("session still open after the drain")
	}
}

func TestShutdownDeadline(t *testing.T) {
	p := pgtest.StartRelay(t)
	busy := p.Connect(t)
	pgtest.Exec(t, busy, "BEGIN")
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Server.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown past its deadline: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	if p.Server.Sessions() != 0 {
		t.Fatal("sessions left after the deadline")
	}
}

// After the client's own Terminate nothing more is sent to it, however the
// two ends of the session close.
func TestNothingAfterTerminate(t *testing.T) {
	p := pgtest.StartRelay(t)
	for i := 0; i < 200; i++ {
		conn, fe := pgtest.RawSession(t, p.Addr)
		conn.Write([]byte{'X', 0, 0, 0, 4})
		if m, err := fe.Receive(); err == nil {
			t.Fatalf("session %d: got %T %+v after Terminate", i, m, m)
		}
		conn.Close()
	}
}
