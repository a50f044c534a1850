// Package pgtest runs a package's tests against a real Postgres through a
// real pgfence proxy on loopback.
package pgtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgversion"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/internal/server"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

var pg *pgserver.Server

// helpers sets the backstop's helpers up once per package, under
// PGFENCE_TEST_HELPERS.
var helpers struct {
	sync.Once
	err error
}

// version is pg's server_version_num.
var version pgversion.Version

// unit is PGFENCE_UNIT=1 (make unit): no Postgres is started, and a test
// that needs one is skipped at its first call that takes its testing.TB
// (StartProxy, Direct, Connect, Running); make test runs them all.
var unit = os.Getenv("PGFENCE_UNIT") == "1"

// Need skips t in a run without Postgres (make unit): for a test whose
// first use of Postgres is Server or DirectURL.
func Need(t testing.TB) {
	t.Helper()
	need(t)
}

// need skips t in a run without Postgres.
func need(t testing.TB) {
	t.Helper()
	if unit {
		t.Skip("needs Postgres: make test runs it, make unit does not")
	}
}

// mustHave stops a test that reaches Postgres without first calling a
// function that takes its testing.TB, in a run without Postgres.
func mustHave() {
	if unit {
		panic("pgtest: this test needs Postgres and PGFENCE_UNIT=1 started none: call pgtest.Direct or StartProxy (which skip it then) before Server or DirectURL")
	}
}

// PGFENCE_TEST_TLS=1 runs the tests with TLS on both legs: every proxy
// terminates client TLS and reaches Postgres over verified TLS, and URL
// asks for sslmode=require with the CA as sslrootcert, so that drivers
// that verify on require (node-postgres) can (make test runs the protocol
// and driver tests so too). Raw sessions (RawSession) stay plain text,
// which pgfence accepts as well.
var testTLS struct {
	on       bool
	server   *tls.Config // the proxies' certificate
	upstream *tls.Config // trusting Postgres's
	rootCert string      // the CA's certificate file
}

// TLS reports whether the tests run with TLS on both legs
// (PGFENCE_TEST_TLS=1).
func TLS() bool { return testTLS.on }

// Main starts one throwaway Postgres for the package, runs its tests and
// cleans up. Call it from TestMain.
func Main(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if unit {
		return m.Run(), nil
	}
	var opts pgserver.Options
	if os.Getenv("PGFENCE_TEST_TLS") == "1" {
		dir, err := os.MkdirTemp("", "pgtest-ca-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(dir)
		ca, err := newCA(dir)
		if err != nil {
			return 0, err
		}
		if opts.TLSCert, opts.TLSKey, err = ca.issue("postgres"); err != nil {
			return 0, err
		}
		if testTLS.server, err = ca.serverTLS("pgfence"); err != nil {
			return 0, err
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		testTLS.upstream = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
		testTLS.rootCert = filepath.Join(dir, "root.crt")
		if err := os.WriteFile(testTLS.rootCert, ca.CertPEM, 0o644); err != nil {
			return 0, err
		}
		testTLS.on = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	var err error
	pg, err = pgserver.Start(ctx, opts)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("cannot start Postgres: %w", err)
	}
	defer pg.Stop()
	if version, err = pg.Version(context.Background()); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// Version is the version of the package's Postgres: tests of what
// differs between versions decide by it (make test-versions runs every
// supported one).
func Version(t testing.TB) pgversion.Version {
	t.Helper()
	need(t)
	return version
}

// NeedVersion skips t on a Postgres older than major (a feature it
// tests is new in major), saying so.
func NeedVersion(t testing.TB, major int, why string) {
	t.Helper()
	if v := Version(t); v.Major() < major {
		t.Skipf("needs PostgreSQL %d or later (%s); this is %s: make test-versions runs it on every supported version", major, why, v)
	}
}

// Server is the package's Postgres.
func Server() *pgserver.Server { mustHave(); return pg }

// DirectURL connects straight to Postgres, bypassing the proxy.
func DirectURL() string { mustHave(); return pg.URL("postgres") }

// Proxy is a running pgfence in front of the package's Postgres.
type Proxy struct {
	Addr string
	// Policy and Registry are nil for a relay alone (StartRelay).
	Policy   *fence.Policy
	Registry *prometheus.Registry
	Server   *proxy.Server
	Logs     *LogBuffer

	mu    sync.Mutex
	loops map[string]int // by application_name, see LoopOf
}

// StartProxy starts a proxy guarding the tables named by guards
// (TABLE[:COLUMN] specs); edit may adjust the proxy's configuration. It
// stops when the test ends.
func StartProxy(t testing.TB, guards []string, edit ...func(*proxy.Config, *fence.Config)) *Proxy {
	t.Helper()
	need(t)
	var gs []sqlrewrite.Guard
	for _, spec := range guards {
		g, err := sqlrewrite.ParseGuard(spec)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	px, pcfg, log := newProxy()
	fcfg := fence.Config{Guards: gs, TokenSetting: "fence.token", ServerVersion: int(version)}
	if os.Getenv("PGFENCE_TEST_HELPERS") == "1" {
		// As serve where the backstop's helpers are in place (make test
		// runs the driver suites this way too): fenced writes right after
		// a SET pgfence answered go without their probe.
		helpers.Do(func() { helpers.err = backstop.Setup(context.Background(), Direct(t)) })
		if helpers.err != nil {
			t.Fatal(helpers.err)
		}
		fcfg.StaleNotice = true
	}
	for _, e := range edit {
		e(&pcfg, &fcfg)
	}
	px.configured(&pcfg)
	srv, err := server.New(server.Config{Proxy: pcfg, Fence: fcfg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	px.serve(t, srv.Server)
	px.Policy, px.Registry = srv.Policy, srv.Registry
	return px
}

// newProxy is a Proxy not started yet, with the relay's configuration every
// test proxy starts from, and the logger its events go to.
func newProxy() (*Proxy, proxy.Config, *slog.Logger) {
	logs := &LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// PGFENCE_TEST_RELAY=goroutines runs the tests on the goroutine relay
	// instead of the event loop (make test runs both).
	// Two event loops at least, whatever the machine, so that every test
	// runs sessions on more than one (see TestLoops in proxy).
	pcfg := proxy.Config{Upstream: pg.Addr(), Logger: log, GoroutineRelay: os.Getenv("PGFENCE_TEST_RELAY") == "goroutines",
		EventLoops: max(2, runtime.GOMAXPROCS(0))}
	if testTLS.on {
		pcfg.TLS = testTLS.server
	}
	return &Proxy{Logs: logs, loops: map[string]int{}}, pcfg, log
}

// configured completes pcfg once the test's edits are made: TLS to the
// package's Postgres under PGFENCE_TEST_TLS, and the note of each
// session's loop (see LoopOf).
func (px *Proxy) configured(pcfg *proxy.Config) {
	if testTLS.on && pcfg.Upstream == pg.Addr() && pcfg.UpstreamTLS == nil {
		pcfg.UpstreamTLS, pcfg.UpstreamTLSRequired = testTLS.upstream, true
	}
	admit := pcfg.Admit
	pcfg.Admit = func(c *proxy.Client) error {
		px.mu.Lock()
		px.loops[c.ApplicationName()] = c.Loop()
		px.mu.Unlock()
		if admit != nil {
			return admit(c)
		}
		return nil
	}
}

// serve has srv serve on a loopback port of its own until the test ends.
func (px *Proxy) serve(t testing.TB, srv *proxy.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	px.Addr, px.Server = ln.Addr().String(), srv
}

// Relay adapts an edit of the relay's configuration alone to StartProxy's
// edits, for the proxy's own tests, which have no business with fence's.
func Relay(edit func(*proxy.Config)) func(*proxy.Config, *fence.Config) {
	return func(pc *proxy.Config, _ *fence.Config) { edit(pc) }
}

// LoopOf is the event loop the proxy gave the last session that started
// with application_name app (-1 when goroutines relay it); it fails t if
// there was none.
func (p *Proxy) LoopOf(t testing.TB, app string) int {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.loops[app]
	if !ok {
		t.Fatalf("no session with application_name %q started", app)
	}
	return l
}

// ConnectOnLoops opens one connection through the proxy per name, each
// with that application_name, and checks that they are spread over
// every event loop the proxy runs (one apart when there are fewer
// connections than loops): the loops take sessions in turn when they
// hold as many. Start it with no session open.
func (p *Proxy) ConnectOnLoops(t testing.TB, names ...string) []*pgx.Conn {
	t.Helper()
	var cs []*pgx.Conn
	seen := map[int]int{}
	for _, name := range names {
		cs = append(cs, p.Connect(t, "application_name="+name))
		seen[p.LoopOf(t, name)]++
	}
	if n := p.Server.EventLoops(); n > 0 && len(seen) != min(n, len(names)) {
		t.Fatalf("sessions %v went to the loops %v (of %d): not spread over them", names, seen, n)
	}
	return cs
}

// URL connects through the proxy; extra are added as query parameters
// (e.g. "application_name=x").
func (p *Proxy) URL(extra ...string) string {
	u, _ := url.Parse(pg.URL("postgres"))
	u.Host = p.Addr
	q := u.Query()
	if testTLS.on {
		q.Set("sslmode", "require")
		q.Set("sslrootcert", testTLS.rootCert)
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		q.Set(k, v)
	}
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads + literally
	return u.String()
}

// Connect opens a pgx connection through the proxy, closed when the test ends.
func (p *Proxy) Connect(t testing.TB, extra ...string) *pgx.Conn {
	t.Helper()
	return Connect(t, p.URL(extra...))
}

// Logical opens a logical replication connection (replication=database,
// simple protocol only) through the proxy, closed when the test ends, and
// returns a function that runs one text on it and returns the last
// statement's result, failing the test on an error.
func (p *Proxy) Logical(t testing.TB, ctx context.Context) (run func(sql string) *pgconn.Result) {
	t.Helper()
	c, err := pgconn.Connect(ctx, p.URL("replication=database"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return func(sql string) *pgconn.Result {
		t.Helper()
		res, err := c.Exec(ctx, sql).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return res[len(res)-1]
	}
}

// Connect opens a pgx connection to url, closed when the test ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Direct opens a pgx connection straight to Postgres.
func Direct(t testing.TB) *pgx.Conn {
	t.Helper()
	need(t)
	return Connect(t, DirectURL())
}

// Exec runs sql on c and fails the test on error.
func Exec(t testing.TB, c *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	tag, err := c.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.String()
}

// Counter reads a counter's (or gauge's) value, summed over the series
// that have labels, name=value pairs.
func (p *Proxy) Counter(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := p.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				switch {
				case m.Counter != nil:
					sum += m.Counter.GetValue()
				case m.Gauge != nil:
					sum += m.Gauge.GetValue()
				}
			}
		}
	}
	return sum
}

// Histogram reads a histogram's sample count and sum, over the series that
// have labels, name=value pairs.
func (p *Proxy) Histogram(t testing.TB, name string, labels ...string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := p.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && matches(m, labels) {
				count += h.GetSampleCount()
				sum += h.GetSampleSum()
			}
		}
	}
	return count, sum
}

func matches(m *dto.Metric, labels []string) bool {
	for _, kv := range labels {
		k, v, _ := strings.Cut(kv, "=")
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// RawSession opens a connection to addr, completes startup by hand and
// returns it ready for queries, with a 10 s deadline; it is closed when the
// test ends.
func RawSession(t testing.TB, addr string) (net.Conn, *pgproto3.Frontend) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "postgres", "database": "postgres"}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			return conn, fe
		}
	}
}

// Replies reads a raw session's replies up to its readies-th
// ReadyForQuery, and returns the command tags and errors among them.
func Replies(t testing.TB, fe *pgproto3.Frontend, readies int) (tags []string, errs []pgproto3.ErrorResponse) {
	t.Helper()
	for ready := 0; ready < readies; {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.ReadyForQuery:
			ready++
		case *pgproto3.CommandComplete:
			tags = append(tags, string(m.CommandTag))
		case *pgproto3.ErrorResponse:
			errs = append(errs, *m)
		}
	}
	return tags, errs
}

// Running waits until the server process pid runs a statement (a
// pg_sleep, say, for a test to cancel): through pgfence, a session's
// BackendKeyData carries its server process's pid.
func Running(t testing.TB, pid uint32) {
	t.Helper()
	running(t, fmt.Sprintf("server process %d busy", pid), "pid = $1", int32(pid))
}

// Sleeping waits until server process pid sleeps in pg_sleep: past
// parsing and describing it (which a driver may do first, in a round trip
// of its own, while the session shows as active too), so that a cancel
// sent now reaches the sleep.
func Sleeping(t testing.TB, pid uint32) {
	t.Helper()
	running(t, fmt.Sprintf("server process %d in pg_sleep", pid), "pid = $1 AND wait_event = 'PgSleep'", int32(pid))
}

// RunningApp waits until a session whose application_name is app runs a
// statement.
func RunningApp(t testing.TB, app string) {
	t.Helper()
	running(t, "a statement of "+app, "application_name = $1", app)
}

func running(t testing.TB, what, cond string, arg any) {
	t.Helper()
	need(t)
	db := Direct(t)
	poll.Eventually(t, 10*time.Second, what, func() bool {
		var n int
		err := db.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND "+cond, arg).Scan(&n)
		return err == nil && n > 0
	})
}
