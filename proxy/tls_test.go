package proxy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// tlsSetup is a password-protected Postgres with ssl=on and a pgfence that
// terminates client TLS and connects to Postgres over verified TLS.
type tlsSetup struct {
	ca     *pgtest.CA
	pg     *pgserver.Server
	p      *pgtest.Proxy
	rootCA string // path of the CA certificate
}

// newTLSSetup starts it, with the relay alone (pgtest.StartRelay); hostAuth
// "" means trust (no password).
func newTLSSetup(t *testing.T, hostAuth string, upstreamTLS bool) *tlsSetup {
	t.Helper()
	return startTLSSetup(t, hostAuth, upstreamTLS, pgtest.StartRelay)
}

// withPolicy starts a proxy with fence's policy (no table guarded), for a test
// of what the relay does for a policy.
func withPolicy(t testing.TB, edit ...func(*proxy.Config)) *pgtest.Proxy {
	t.Helper()
	return pgtest.StartProxy(t, nil, pgtest.Relay(func(pc *proxy.Config) {
		for _, e := range edit {
			e(pc)
		}
	}))
}

// startTLSSetup starts it with the proxy start makes.
func startTLSSetup(t *testing.T, hostAuth string, upstreamTLS bool, start func(testing.TB, ...func(*proxy.Config)) *pgtest.Proxy) *tlsSetup {
	t.Helper()
	ca := pgtest.NewCA(t)
	cert, key := ca.Issue(t, "postgres")
	opts := pgserver.Options{HostAuth: hostAuth, TLSCert: cert, TLSKey: key}
	if hostAuth != "" {
		opts.Password = "s3cret"
	}
	pg, err := pgserver.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	p := start(t, func(pc *proxy.Config) {
		pc.Upstream = pg.Addr()
		pc.TLS = ca.ServerTLS(t, "pgfence")
		if upstreamTLS {
			pc.UpstreamTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
			pc.UpstreamTLSRequired = true
		}
	})
	return &tlsSetup{ca: ca, pg: pg, p: p, rootCA: ca.File(t, "root.crt", ca.CertPEM)}
}

func (s *tlsSetup) url(user, password, params string) string {
	return "postgres://" + user + ":" + password + "@" + s.p.Addr + "/postgres?" + params
}

// sslOnServer reports whether the session's own backend is on TLS.
func sslOnServer(t *testing.T, c *pgx.Conn) bool {
	t.Helper()
	var ssl bool
	if err := c.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil {
		t.Fatal(err)
	}
	return ssl
}

func TestTLSBothSides(t *testing.T) {
	s := newTLSSetup(t, "", true)
	for _, params := range []string{"sslmode=require", "sslmode=verify-full&sslrootcert=" + s.rootCA, "sslmode=disable"} {
		t.Run(params, func(t *testing.T) {
			c := pgtest.Connect(t, s.url("postgres", "s3cret", params))
			_, clientTLS := c.PgConn().Conn().(*tls.Conn)
			if clientTLS != !strings.Contains(params, "disable") {
				t.Fatalf("client TLS = %v with %s", clientTLS, params)
			}
			if !sslOnServer(t, c) {
				t.Fatal("pgfence reached Postgres without TLS")
			}
		})
	}
	// verify-full against the wrong CA fails.
	other := pgtest.NewCA(t)
	_, err := pgx.Connect(ctx, s.url("postgres", "s3cret", "sslmode=verify-full&sslrootcert="+other.File(t, "other.crt", other.CertPEM)))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("wrong CA: %v", err)
	}
}

// SCRAM and md5 pass through, with and without client TLS. Channel binding
// cannot (the client's TLS ends at pgfence): a client that would use it gets
// an error saying why and what to do.
func TestAuthMethodsOverTLS(t *testing.T) {
	pgtest.Need(t)
	t.Run("scram, plain upstream", func(t *testing.T) {
		s := newTLSSetup(t, "scram-sha-256", false)
		for _, params := range []string{"sslmode=disable", "sslmode=require", "sslmode=verify-full&sslrootcert=" + s.rootCA} {
			c := pgtest.Connect(t, s.url("postgres", "s3cret", params))
			if sslOnServer(t, c) {
				t.Fatal("the upstream leg was to be plain")
			}
			if _, err := pgx.Connect(ctx, s.url("postgres", "nope", params)); err == nil {
				t.Fatalf("%s: a wrong password was accepted", params)
			}
		}
	})
	t.Run("scram, TLS upstream", func(t *testing.T) {
		s := newTLSSetup(t, "scram-sha-256", true)
		for _, params := range []string{"sslmode=disable", "sslmode=require&channel_binding=disable"} {
			c := pgtest.Connect(t, s.url("postgres", "s3cret", params))
			if !sslOnServer(t, c) {
				t.Fatal("the upstream leg was to be TLS")
			}
			if _, err := pgx.Connect(ctx, s.url("postgres", "nope", params)); err == nil {
				t.Fatalf("%s: a wrong password was accepted", params)
			}
		}
		for _, params := range []string{"sslmode=require&channel_binding=prefer", "sslmode=require&channel_binding=require"} {
			_, err := pgx.Connect(ctx, s.url("postgres", "s3cret", params))
			pe := wantCode(t, err, "28000")
			if !strings.Contains(pe.Message, "channel binding cannot pass through pgfence") || !strings.Contains(pe.Hint, "channel_binding=disable") {
				t.Fatalf("%s: %q hint %q", params, pe.Message, pe.Hint)
			}
		}
		if strings.Contains(s.p.Logs.String(), "s3cret") {
			t.Fatal("a password reached the log")
		}
	})
	t.Run("md5", func(t *testing.T) {
		s := newTLSSetup(t, "md5", true)
		admin := pgtest.Connect(t, s.pg.URL("postgres")+"&sslmode=require")
		pgtest.Exec(t, admin, "SET password_encryption = 'md5'")
		pgtest.Exec(t, admin, "CREATE ROLE md5user LOGIN PASSWORD 'md5pass'")
		var stored string
		admin.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = 'md5user'").Scan(&stored)
		if !strings.HasPrefix(stored, "md5") {
			t.Fatalf("password not stored as md5: %.6s", stored)
		}
		for _, params := range []string{"sslmode=disable", "sslmode=require"} {
			pgtest.Exec(t, pgtest.Connect(t, s.url("md5user", "md5pass", params)), "SELECT 1")
			if _, err := pgx.Connect(ctx, s.url("md5user", "wrong", params)); err == nil {
				t.Fatalf("%s: a wrong md5 password was accepted", params)
			}
		}
	})
}

// An upstream URL that requires TLS meets a Postgres without it: a clear
// error, not a plain-text session.
func TestUpstreamRefusesTLS(t *testing.T) {
	pgtest.Need(t)
	// A Postgres of its own: the package's has ssl on under PGFENCE_TEST_TLS.
	pg, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	p := pgtest.StartRelay(t, func(pc *proxy.Config) {
		pc.Upstream = pg.Addr()
		pc.UpstreamTLS = &tls.Config{InsecureSkipVerify: true}
		pc.UpstreamTLSRequired = true
	})
	_, err = pgx.Connect(ctx, p.URL())
	pe := wantCode(t, err, "08001")
	if !strings.Contains(pe.Message, "does not accept TLS") {
		t.Fatalf("message %q", pe.Message)
	}
}

// TLS sessions, on either leg, are relayed by the event loop as plain ones
// are: one parked goroutine a session, not three. What crosses them arrives
// whole: a result and a query text far larger than the loop's buffers and
// TLS's records, a COPY each way; and pgfence answers the token's SET.
func TestTLSOnEventLoop(t *testing.T) {
	goroutines := os.Getenv("PGFENCE_TEST_RELAY") == "goroutines"
	s := startTLSSetup(t, "", true, withPolicy) // fence's policy vouches for the token's SET
	url := s.url("postgres", "", "sslmode=require")
	c := pgtest.Connect(t, url)
	if _, ok := c.PgConn().Conn().(*tls.Conn); !ok || !sslOnServer(t, c) {
		t.Fatal("a leg is not on TLS")
	}

	base := runtime.NumGoroutine()
	const n = 30
	for range n {
		pgtest.Exec(t, pgtest.Connect(t, url), "SELECT 1")
	}
	per := float64(runtime.NumGoroutine()-base) / n
	if !goroutines && per > 1.5 {
		t.Fatalf("%.1f goroutines per TLS session: they are not on the event loop", per)
	}

	var rows, total int
	if err := c.QueryRow(ctx, "SELECT count(*), sum(length(r)) FROM (SELECT repeat('x', 1000) || g AS r FROM generate_series(1, 3000) g) s").Scan(&rows, &total); err != nil {
		t.Fatal(err)
	}
	big, err := c.Query(ctx, "SELECT repeat('x', 1000) || g FROM generate_series(1, 3000) g")
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for big.Next() {
		var r string
		if err := big.Scan(&r); err != nil {
			t.Fatal(err)
		}
		got += len(r)
	}
	if big.Err() != nil || got != total || rows != 3000 {
		t.Fatalf("read %d bytes (%v), want %d", got, big.Err(), total)
	}
	text := strings.Repeat("y", 3<<20)
	var length int
	if err := c.QueryRow(ctx, "SELECT length('"+text+"')", pgx.QueryExecModeSimpleProtocol).Scan(&length); err != nil || length != len(text) {
		t.Fatalf("a 3 MiB query text: %d, %v", length, err)
	}

	pgtest.Exec(t, c, "CREATE TEMP TABLE tls_copy (id int, v text)")
	in := strings.Repeat("1\t"+strings.Repeat("z", 500)+"\n", 4000)
	tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader(in), "COPY tls_copy FROM STDIN")
	if err != nil || tag.RowsAffected() != 4000 {
		t.Fatalf("COPY FROM: %v, %v", tag, err)
	}
	var out bytes.Buffer
	if _, err := c.PgConn().CopyTo(ctx, &out, "COPY tls_copy TO STDOUT"); err != nil || out.String() != in {
		t.Fatalf("COPY TO: %d bytes back of %d, %v", out.Len(), len(in), err)
	}

	before := s.p.Counter(t, "pgfence_token_sets_answered_total")
	pgtest.Exec(t, c, "SET fence.token = '42'")
	var token string
	if err := c.QueryRow(ctx, "SELECT current_setting('fence.token')").Scan(&token); err != nil || token != "42" {
		t.Fatalf("token %q, %v", token, err)
	}
	want := 1.0
	if goroutines {
		want = 0 // the goroutine relay forwards it
	}
	if got := s.p.Counter(t, "pgfence_token_sets_answered_total") - before; got != want {
		t.Fatalf("%v SETs answered, want %v", got, want)
	}
}
