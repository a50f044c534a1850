package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/proxy"
)

// The tests here run sessions on two event loops at once (pgtest starts
// every proxy with two at least), each feature on each loop.

// twoLoops starts a relay (no fencing policy) with exactly two event loops.
func twoLoops(t *testing.T) *pgtest.Proxy {
	t.Helper()
	return pgtest.StartRelay(t, func(pc *proxy.Config) { pc.EventLoops = 2 })
}

// onLoops reports whether the proxy relays on event loops (not with
// PGFENCE_TEST_RELAY=goroutines).
func onLoops(p *pgtest.Proxy) bool { return p.Server.EventLoops() > 0 }

// Each new session goes to the loop that holds the fewest, ties in turn;
// one that ends leaves its loop.
func TestLoopsBalance(t *testing.T) {
	p := twoLoops(t)
	if !onLoops(p) {
		if n := p.Server.EventLoops(); n != 0 {
			t.Fatalf("EventLoops with the goroutine relay: %d", n)
		}
		t.Skip("the goroutine relay runs no event loop")
	}
	if n := p.Server.EventLoops(); n != 2 {
		t.Fatalf("EventLoops: %d, want 2", n)
	}
	loads := func() string { return fmt.Sprint(p.Server.LoopSessions()) }
	var cs []*pgx.Conn
	for i := range 6 {
		cs = append(cs, p.Connect(t, fmt.Sprintf("application_name=b%d", i)))
	}
	if got := loads(); got != "[3 3]" {
		t.Fatalf("six sessions over two loops: %s", got)
	}
	// End the two of loop 0 (b0, b2): the next two go there.
	for i, c := range cs {
		if p.LoopOf(t, fmt.Sprintf("b%d", i)) == 0 && i < 4 {
			c.Close(ctx)
		}
	}
	poll.Eventually(t, 10*time.Second, "the ended sessions to leave loop 0", func() bool { return loads() == "[1 3]" })
	for i := range 2 {
		name := fmt.Sprintf("c%d", i)
		pgtest.Exec(t, p.Connect(t, "application_name="+name), "SELECT 1")
		if l := p.LoopOf(t, name); l != 0 {
			t.Fatalf("session %s went to loop %d, which holds more: %s", name, l, loads())
		}
	}
	if got := loads(); got != "[3 3]" {
		t.Fatalf("after two more: %s", got)
	}
	// Every session on both loops relays, all at once.
	var wg sync.WaitGroup
	errs := make(chan error, len(cs))
	for i, c := range cs {
		if p.LoopOf(t, fmt.Sprintf("b%d", i)) == 1 || i >= 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					var n int
					if err := c.QueryRow(ctx, "SELECT $1::int", 7).Scan(&n); err != nil || n != 7 {
						errs <- fmt.Errorf("%d, %v", n, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// 0 is one per core.
	srv, err := proxy.New(proxy.Config{Upstream: "127.0.0.1:1", Interceptor: proxy.NopInterceptor{}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if n := srv.EventLoops(); n != runtime.GOMAXPROCS(0) {
		t.Fatalf("EventLoops by default: %d, want GOMAXPROCS %d", n, runtime.GOMAXPROCS(0))
	}
	if _, err := proxy.New(proxy.Config{Upstream: "127.0.0.1:1", Interceptor: proxy.NopInterceptor{}, EventLoops: -1}); err == nil || !strings.Contains(err.Error(), "EventLoops") {
		t.Fatalf("EventLoops -1: %v", err)
	}
}

// A CancelRequest comes on a connection of its own, which no loop holds:
// it cancels the statement of the session it names on either loop.
func TestLoopsCancel(t *testing.T) {
	p := twoLoops(t)
	cs := p.ConnectOnLoops(t, "cancel0", "cancel1")
	for i, c := range cs {
		t.Run(fmt.Sprint("loop", i), func(t *testing.T) {
			result := make(chan error, 1)
			go func() {
				_, err := c.Exec(ctx, "SELECT pg_sleep(20)")
				result <- err
			}()
			pgtest.Running(t, c.PgConn().PID())
			// The other loop's session is served meanwhile.
			pgtest.Exec(t, cs[1-i], "SELECT 1")
			if err := c.PgConn().CancelRequest(ctx); err != nil {
				t.Fatal(err)
			}
			var pe *pgconn.PgError
			if err := <-result; !errors.As(err, &pe) || pe.Code != "57014" {
				t.Fatalf("want SQLSTATE 57014, got %v", err)
			}
			pgtest.Exec(t, c, "SELECT 1") // the session goes on
		})
	}
}

// A drain ends the idle sessions of both loops at once, and each busy one
// once its transaction ends.
func TestLoopsDrain(t *testing.T) {
	p := twoLoops(t)
	cs := p.ConnectOnLoops(t, "busy0", "busy1", "idle0", "idle1")
	busy, idle := cs[:2], cs[2:]
	for _, c := range busy {
		pgtest.Exec(t, c, "BEGIN")
		pgtest.Exec(t, c, "SELECT 1")
	}
	done := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		done <- p.Server.Shutdown(sctx)
	}()
	poll.Eventually(t, 10*time.Second, "the idle sessions to end", func() bool { return p.Server.Sessions() == 2 })
	if onLoops(p) {
		if got := fmt.Sprint(p.Server.LoopSessions()); got != "[1 1]" {
			t.Fatalf("during the drain the loops hold %s, want a busy session each", got)
		}
	}
	for i, c := range idle {
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Fatalf("idle session %d still works during the drain", i)
		}
	}
	for i, c := range busy {
		if tag := pgtest.Exec(t, c, "SELECT 2"); tag != "SELECT 1" {
			t.Fatal(tag)
		}
		pgtest.Exec(t, c, "COMMIT")
		if i == 0 {
			poll.Eventually(t, 10*time.Second, "the first busy session to end", func() bool { return p.Server.Sessions() == 1 })
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drain did not finish after the last transaction ended")
	}
	for i, c := range busy {
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Fatalf("busy session %d still open after the drain", i)
		}
	}
}

// Holds on both loops at once: one that waits for a catalog read (a
// goroutine resumes it, on its session's loop) and one that waits only
// for the server's answers (its loop resumes it). While they wait, the
// other sessions of both loops are served; each held statement runs only
// once its hold ends.
func TestLoopsHolds(t *testing.T) {
	// fence's policy, whose DDL hook starts the hold.
	p := pgtest.StartProxy(t, []string{"loops_hold"}, pgtest.Relay(func(pc *proxy.Config) { pc.EventLoops = 2 }))
	gates := make(chan chan struct{}, 4)
	p.Policy.SetDDLHook(func() <-chan struct{} {
		g := make(chan struct{})
		gates <- g
		return g
	})
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS loops_hold_log; DROP SEQUENCE IF EXISTS loops_hold_seq; CREATE TABLE loops_hold_log (who text, n bigint); CREATE SEQUENCE loops_hold_seq")
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS loops_hold_log; DROP SEQUENCE IF EXISTS loops_hold_seq")
	})
	cs := p.ConnectOnLoops(t, "held0", "held1", "other0", "other1")
	held, others := cs[:2], cs[2:]

	// The catalog-read hold: DDL, then a statement held until the read
	// the DDL started is done.
	results := make([]chan error, 2)
	for i, c := range held {
		pgtest.Exec(t, c, fmt.Sprintf("CREATE TEMP TABLE loops_hold_t%d (id int)", i))
		results[i] = make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, fmt.Sprintf("INSERT INTO loops_hold_log SELECT 'held%d', nextval('loops_hold_seq')", i))
			results[i] <- err
		}()
	}
	var open []chan struct{}
	for range held {
		select {
		case g := <-gates:
			open = append(open, g)
		case <-time.After(10 * time.Second):
			t.Fatal("the DDL started no catalog read")
		}
	}
	// Marks taken while the statements are held come before theirs.
	for i, c := range others {
		pgtest.Exec(t, c, fmt.Sprintf("INSERT INTO loops_hold_log SELECT 'other%d', nextval('loops_hold_seq')", i))
	}
	for _, g := range open {
		close(g)
	}
	for i, r := range results {
		select {
		case err := <-r:
			if err != nil {
				t.Fatalf("held statement %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("held statement %d still held after the catalog read", i)
		}
	}
	var order string
	if err := db.QueryRow(ctx, "SELECT string_agg(who, ',' ORDER BY who LIKE 'held%', n) FROM loops_hold_log").Scan(&order); err != nil {
		t.Fatal(err)
	}
	var first string
	if err := db.QueryRow(ctx, "SELECT string_agg(who, ',' ORDER BY n) FROM loops_hold_log").Scan(&first); err != nil {
		t.Fatal(err)
	}
	if first != order {
		t.Fatalf("statements ran in the order %s: a held one ran before the catalog read was done", first)
	}

	// The hold on the server's answers: a pipelined SET client_encoding
	// holds the statement behind it until Postgres has answered, which
	// the loop sees itself. Both loops at once, many times.
	var wg sync.WaitGroup
	errs := make(chan error, len(cs))
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 50 {
				b := &pgx.Batch{}
				b.Queue("SET client_encoding = 'UTF8'")
				b.Queue("SELECT $1::text", fmt.Sprint(i, k))
				br := c.SendBatch(ctx, b)
				if _, err := br.Exec(); err != nil {
					errs <- err
					return
				}
				var s string
				if err := br.QueryRow().Scan(&s); err != nil || s != fmt.Sprint(i, k) {
					errs <- fmt.Errorf("session %d: %q, %v", i, s, err)
					return
				}
				if err := br.Close(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TLS sessions on both loops move large messages both ways at once.
func TestLoopsTLS(t *testing.T) {
	s := newTLSSetup(t, "", true)
	if s.p.Server.EventLoops() < 2 && onLoops(s.p) {
		t.Fatalf("the TLS proxy runs %d event loops", s.p.Server.EventLoops())
	}
	var cs []*pgx.Conn
	seen := map[int]bool{}
	for i := range 2 {
		name := fmt.Sprint("tls", i)
		c := pgtest.Connect(t, s.url("postgres", "", "sslmode=require&application_name="+name))
		if !sslOnServer(t, c) {
			t.Fatal("pgfence reached Postgres without TLS")
		}
		cs = append(cs, c)
		seen[s.p.LoopOf(t, name)] = true
	}
	if onLoops(s.p) && len(seen) != 2 {
		t.Fatalf("the TLS sessions share a loop: %v", seen)
	}
	text := strings.Repeat("t", 2<<20)
	var wg sync.WaitGroup
	errs := make(chan error, len(cs))
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				var back string
				if err := c.QueryRow(ctx, "SELECT $1::text || 'x'", text).Scan(&back); err != nil || back != text+"x" {
					errs <- fmt.Errorf("%d bytes back, %v", len(back), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// When the upstream moves (the failover follower calls SetUpstream), the
// sessions of both loops on the old one end, mid-stream too, and new ones
// go to the new one on both loops.
func TestLoopsUpstreamMoves(t *testing.T) {
	p := twoLoops(t)
	old := p.Server.Upstream()
	cs := p.ConnectOnLoops(t, "moved0", "moved1")
	streams := make(chan error, len(cs))
	for _, c := range cs {
		rows, err := c.Query(ctx, "SELECT repeat('s', 1000) FROM generate_series(1, 10000000)")
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatalf("no first row: %v", rows.Err())
		}
		go func() {
			defer rows.Close()
			for rows.Next() {
			}
			streams <- rows.Err()
		}()
	}
	// The same Postgres by another address: the sessions were connected
	// elsewhere as far as the proxy knows.
	moved := old
	host, port, _ := strings.Cut(old.Addr, ":")
	if host != "127.0.0.1" {
		t.Skipf("upstream %s: want 127.0.0.1:port", old.Addr)
	}
	moved.Addr = "localhost:" + port
	p.Server.SetUpstream(moved)
	for range cs {
		select {
		case err := <-streams:
			// The loop ends a session between messages and says why; the
			// goroutine relay may cut one mid-row.
			if err == nil || onLoops(p) && !strings.Contains(err.Error(), "lost the connection to Postgres") {
				t.Fatalf("a streaming session on the old upstream ended with %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a session on the old upstream is still streaming")
		}
	}
	poll.Eventually(t, 10*time.Second, "the old sessions to end", func() bool { return p.Server.Sessions() == 0 })
	for _, c := range p.ConnectOnLoops(t, "new0", "new1") {
		pgtest.Exec(t, c, "SELECT 1")
	}
}

// Two loops on one P, as the core governor (internal/cores) runs them at
// a light load: they take turns on it, and a session kept busy on one
// does not stop the other's.
func TestLoopsShareOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	p := twoLoops(t)
	if !onLoops(p) {
		t.Skip("the goroutine relay runs no event loop")
	}
	busy, quiet := p.Connect(t, "application_name=busy"), p.Connect(t, "application_name=quiet")
	if a, b := p.LoopOf(t, "busy"), p.LoopOf(t, "quiet"); a == b {
		t.Fatalf("both sessions on loop %d", a)
	}
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Big rows keep its loop reading and writing without a pause.
			if _, err := busy.Exec(ctx, "SELECT repeat('x', 1 << 20) FROM generate_series(1, 8)"); err != nil {
				errs <- err
				return
			}
		}
	}()
	for i := range 500 {
		var n int
		if err := quiet.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
			t.Fatalf("the quiet session's statement %d: %d, %v", i, n, err)
		}
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("the busy session: %v", err)
	}
}
