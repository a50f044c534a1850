package proxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/proxy"
)

// dialRaw opens a TCP connection to addr that sends nothing of itself,
// with a 10 s deadline; closed when the test ends.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn
}

// readToEnd reads conn until the proxy closes it, and fails t if it does
// not by conn's deadline.
func readToEnd(t *testing.T, conn net.Conn) {
	t.Helper()
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("the proxy did not close the connection: %v", err)
	}
}

// connectionsAre waits until the proxy counts n client connections.
func connectionsAre(t *testing.T, p *pgtest.Proxy, n int, what string) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, what, func() bool { return p.Server.Connections() == n })
}

// Connections that have not finished startup count toward
// MaxClientConns, from accept on: connections that send nothing cannot
// take the proxy past the limit (nor its descriptors), and one over the
// limit is refused at once with 53300, before anything of it is read.
func TestMaxClientConnsCountsStartup(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.MaxClientConns = 3 })
	var silent []net.Conn
	for range 3 {
		silent = append(silent, dialRaw(t, p.Addr))
	}
	connectionsAre(t, p, 3, "three silent connections counted")

	// A real client is refused at once: its context ends long before the
	// startup timeout (30 s) would have freed a slot.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := pgx.Connect(cctx, p.URL("sslmode=disable"))
	pe := wantCode(t, err, "53300")
	if pe.Message != "pgfence: too many client connections: pgfence allows 3 at once" || pe.Hint == "" || pe.Severity != "FATAL" {
		t.Fatalf("refused with %s %q, hint %q", pe.Severity, pe.Message, pe.Hint)
	}
	// The error comes before the client has sent anything.
	conn := dialRaw(t, p.Addr)
	expectFatal(t, pgproto3.NewFrontend(conn, conn), "53300", "pgfence allows 3 at once")
	if n := p.Server.Connections(); n != 3 {
		t.Fatalf("%d connections counted after refusals, want the 3 silent ones", n)
	}
	if !strings.Contains(p.Logs.String(), "client refused: too many client connections") {
		t.Fatalf("no log line of the refusals:\n%s", p.Logs.String())
	}

	// Sessions and connections in startup count together.
	silent[0].Close()
	connectionsAre(t, p, 2, "a silent connection's slot freed")
	c := p.Connect(t)
	pgtest.Exec(t, c, "SELECT 1")
	if n := p.Server.Connections(); n != 3 || p.Server.Sessions() != 1 {
		t.Fatalf("%d connections and %d sessions, want 3 and 1", n, p.Server.Sessions())
	}
	_, err = pgx.Connect(cctx, p.URL("sslmode=disable"))
	wantCode(t, err, "53300")

	// A client that fails startup frees its slot.
	silent[1].Close()
	connectionsAre(t, p, 2, "another silent connection's slot freed")
	bad := dialRaw(t, p.Addr)
	bad.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	expectFatal(t, pgproto3.NewFrontend(bad, bad), "08P01", "startup packet length")
	connectionsAre(t, p, 2, "the failed client's slot freed")

	silent[2].Close()
	c.Close(ctx)
	connectionsAre(t, p, 0, "every slot freed")
	if p.Server.Sessions() != 0 {
		t.Fatalf("%d sessions left", p.Server.Sessions())
	}
	pgtest.Exec(t, p.Connect(t), "SELECT 1")
}

// Every way a connection ends gives its slot back: with a limit of one,
// the next client is served after each.
func TestConnectionSlotFreed(t *testing.T) {
	ca := pgtest.NewCA(t)
	p := pgtest.StartRelay(t, func(pc *proxy.Config) {
		pc.MaxClientConns = 1
		pc.TLS = ca.ServerTLS(t, "pgfence")
		pc.RequireClientTLS = true
		pc.Admit = func(c *proxy.Client) error {
			if c.ApplicationName() == "turn-me-away" {
				return errors.New("not this one")
			}
			return nil
		}
	})
	// The proxy's certificate is this test's, whatever PGFENCE_TEST_TLS
	// has p.URL trust: require does not check it.
	url := func(params string) string { return "postgres://postgres@" + p.Addr + "/postgres?" + params }
	served := func(t *testing.T) {
		t.Helper()
		c := pgtest.Connect(t, url("sslmode=require"))
		pgtest.Exec(t, c, "SELECT 1")
		c.Close(ctx)
	}
	startTLS := func(t *testing.T, conn net.Conn) net.Conn {
		t.Helper()
		conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}) // SSLRequest
		var answer [1]byte
		if _, err := io.ReadFull(conn, answer[:]); err != nil || answer[0] != 'S' {
			t.Fatalf("SSLRequest answered %q, %v", answer[0], err)
		}
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		return tc
	}
	cancelPacket, _ := (&pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}).Encode(nil)
	dead := func() string {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		return ln.Addr().String()
	}()

	for _, tc := range []struct {
		name string
		end  func(t *testing.T)
	}{
		{"session", served},
		{"refused by Admit", func(t *testing.T) {
			_, err := pgx.Connect(ctx, url("sslmode=require&application_name=turn-me-away"))
			wantCode(t, err, "08004")
		}},
		{"plain text under RequireClientTLS", func(t *testing.T) {
			_, err := pgx.Connect(ctx, url("sslmode=disable"))
			wantCode(t, err, "28000")
		}},
		{"bad startup packet", func(t *testing.T) {
			conn := dialRaw(t, p.Addr)
			conn.Write([]byte{0, 0, 0, 3})
			expectFatal(t, pgproto3.NewFrontend(conn, conn), "08P01", "startup packet length 3")
		}},
		{"client leaves mid-packet", func(t *testing.T) {
			conn := dialRaw(t, p.Addr)
			conn.Write([]byte{0, 0, 0, 40, 0, 3})
			connectionsAre(t, p, 1, "the client counted")
			conn.Close()
		}},
		{"TLS handshake fails", func(t *testing.T) {
			conn := dialRaw(t, p.Addr)
			conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f})
			var answer [1]byte
			if _, err := io.ReadFull(conn, answer[:]); err != nil || answer[0] != 'S' {
				t.Fatalf("SSLRequest answered %q, %v", answer[0], err)
			}
			conn.Write([]byte("no ClientHello here\r\n"))
			readToEnd(t, conn)
		}},
		{"cancel request in plain text", func(t *testing.T) {
			conn := dialRaw(t, p.Addr)
			conn.Write(cancelPacket)
			readToEnd(t, conn)
		}},
		{"cancel request over TLS", func(t *testing.T) {
			conn := startTLS(t, dialRaw(t, p.Addr))
			conn.Write(cancelPacket)
			readToEnd(t, conn)
		}},
		{"Postgres unreachable", func(t *testing.T) {
			up := p.Server.Upstream()
			moved := up
			moved.Addr = dead
			p.Server.SetUpstream(moved)
			defer p.Server.SetUpstream(up)
			_, err := pgx.Connect(ctx, url("sslmode=require"))
			wantCode(t, err, "08001")
		}},
		{"refused over the limit", func(t *testing.T) {
			holder := dialRaw(t, p.Addr)
			connectionsAre(t, p, 1, "the silent connection counted")
			conn := dialRaw(t, p.Addr)
			expectFatal(t, pgproto3.NewFrontend(conn, conn), "53300", "pgfence allows 1 at once")
			_, err := pgx.Connect(ctx, url("sslmode=require"))
			if err == nil {
				t.Fatal("a client over the limit was served")
			}
			holder.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.end(t)
			connectionsAre(t, p, 0, "the slot freed")
			served(t)
			connectionsAre(t, p, 0, "the served session's slot freed")
		})
	}
}

// A client that sends nothing holds its slot until the startup timeout,
// and no longer.
func TestStartupTimeoutFreesSlot(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) {
		pc.MaxClientConns = 1
		pc.StartupTimeout = 500 * time.Millisecond
	})
	readToEnd(t, dialRaw(t, p.Addr))
	connectionsAre(t, p, 0, "the timed-out client's slot freed")
	pgtest.Exec(t, p.Connect(t), "SELECT 1")
}

// A flood of refusals gets a log line a second at most, which says how
// many went unlogged.
func TestRefusalLogPaced(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.MaxClientConns = 1 })
	dialRaw(t, p.Addr)
	connectionsAre(t, p, 1, "the silent connection counted")
	const line = "client refused: too many client connections"
	refuse := func() {
		conn := dialRaw(t, p.Addr)
		expectFatal(t, pgproto3.NewFrontend(conn, conn), "53300", "too many client connections")
		conn.Close()
	}
	start := time.Now()
	for range 50 {
		refuse()
	}
	poll.Eventually(t, 10*time.Second, "a line that says how many went unlogged", func() bool {
		refuse()
		return strings.Contains(p.Logs.String(), "unlogged=")
	})
	logs := p.Logs.String()
	if n, most := strings.Count(logs, line), 10*(int(time.Since(start)/time.Second)+1); n > most {
		t.Fatalf("%d lines for the refusals of %v, want %d at most:\n%s", n, time.Since(start), most, logs)
	}
}

// A client's failed startups, which it can make as fast as it connects,
// are logged ten a second at most.
func TestStartupFailuresLogPaced(t *testing.T) {
	p := pgtest.StartRelay(t)
	start := time.Now()
	for range 40 {
		conn := dialRaw(t, p.Addr)
		conn.Write([]byte{0, 0, 0, 3})
		expectFatal(t, pgproto3.NewFrontend(conn, conn), "08P01", "startup packet length 3")
		conn.Close()
	}
	logs := p.Logs.String()
	if n, most := strings.Count(logs, "startup failed"), 10*(int(time.Since(start)/time.Second)+1); n > most || n == 0 {
		t.Fatalf("%d lines for 40 failed startups in %v, want 1 to %d:\n%s", n, time.Since(start), most, logs)
	}
}

// Under RequireClientTLS a client in plain text is refused with 28000,
// where pgfence's own TLS leg would have satisfied Postgres's hostssl rules
// in its place; a TLS client is served; cancel requests are taken in plain
// text and over TLS, and Unix-socket clients, which never use TLS, are
// served.
func TestRequireClientTLS(t *testing.T) {
	s := startTLSSetup(t, "", true, func(t testing.TB, edit ...func(*proxy.Config)) *pgtest.Proxy {
		return pgtest.StartRelay(t, append(edit, func(pc *proxy.Config) { pc.RequireClientTLS = true })...)
	})
	_, err := pgx.Connect(ctx, s.url("postgres", "", "sslmode=disable"))
	pe := wantCode(t, err, "28000")
	if !strings.Contains(pe.Message, "pgfence requires TLS") || !strings.Contains(pe.Hint, "sslmode=require") || pe.Severity != "FATAL" {
		t.Fatalf("%s %q, hint %q", pe.Severity, pe.Message, pe.Hint)
	}
	// allow tries plain text first, and TLS once that is refused.
	for _, params := range []string{"sslmode=allow", "sslmode=prefer", "sslmode=require", "sslmode=verify-full&sslrootcert=" + s.rootCA} {
		c := pgtest.Connect(t, s.url("postgres", "", params))
		if _, ok := c.PgConn().Conn().(*tls.Conn); !ok {
			t.Fatalf("%s: served without TLS", params)
		}
		if !sslOnServer(t, c) {
			t.Fatal("the upstream leg was to be TLS")
		}
	}

	// GSSENCRequest is answered "no", and the plain text startup after it
	// refused.
	conn := dialRaw(t, s.p.Addr)
	conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30})
	var answer [1]byte
	if _, err := io.ReadFull(conn, answer[:]); err != nil || answer[0] != 'N' {
		t.Fatalf("GSSENCRequest answered %q %v, want N", answer[0], err)
	}
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "postgres"}})
	fe.Flush()
	expectFatal(t, fe, "28000", "pgfence requires TLS")

	// Cancel requests: by hand in plain text, and pgx's own over TLS.
	c := pgtest.Connect(t, s.url("postgres", "", "sslmode=require"))
	direct := pgtest.Connect(t, s.pg.URL("postgres"))
	sleeping := func() {
		poll.Eventually(t, 10*time.Second, "the session in pg_sleep", func() bool {
			var n int
			err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'", int32(c.PgConn().PID())).Scan(&n)
			return err == nil && n == 1
		})
	}
	for _, how := range []string{"plain text", "pgx, over TLS"} {
		result := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, "SELECT pg_sleep(30)")
			result <- err
		}()
		sleeping()
		if how == "plain text" {
			packet, _ := (&pgproto3.CancelRequest{ProcessID: c.PgConn().PID(), SecretKey: c.PgConn().SecretKey()}).Encode(nil)
			conn := dialRaw(t, s.p.Addr)
			conn.Write(packet)
			readToEnd(t, conn)
		} else if err := c.PgConn().CancelRequest(ctx); err != nil {
			t.Fatal(err)
		}
		var pe *pgconn.PgError
		if err := <-result; !errors.As(err, &pe) || pe.Code != "57014" {
			t.Fatalf("cancel %s: %v, want 57014", how, err)
		}
	}

	// A Unix socket: drivers never try TLS over one.
	dir, err := os.MkdirTemp("", "pgf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, ".s.PGSQL.5432"))
	if err != nil {
		t.Fatal(err)
	}
	go s.p.Server.Serve(ln)
	t.Cleanup(func() { ln.Close() })
	pgtest.Exec(t, pgtest.Connect(t, "host="+dir+" port=5432 user=postgres dbname=postgres sslmode=disable"), "SELECT 1")
}

// RequireClientTLS without a certificate to offer is a configuration
// error, not a proxy that refuses everyone.
func TestRequireClientTLSNeedsTLS(t *testing.T) {
	_, err := proxy.New(proxy.Config{Upstream: "127.0.0.1:5432", Interceptor: proxy.NopInterceptor{}, RequireClientTLS: true})
	if err == nil || !strings.Contains(err.Error(), "RequireClientTLS needs Config.TLS") {
		t.Fatalf("New: %v", err)
	}
}
