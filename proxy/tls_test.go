package proxy_test

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fence"
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

// newTLSSetup starts it; hostAuth "" means trust (no password).
func newTLSSetup(t *testing.T, hostAuth string, upstreamTLS bool) *tlsSetup {
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
	p := pgtest.StartProxy(t, nil, func(pc *proxy.Config, _ *fence.Config) {
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
	p := pgtest.StartProxy(t, nil, func(pc *proxy.Config, _ *fence.Config) {
		pc.UpstreamTLS = &tls.Config{InsecureSkipVerify: true}
		pc.UpstreamTLSRequired = true
	})
	_, err := pgx.Connect(ctx, p.URL())
	pe := wantCode(t, err, "08001")
	if !strings.Contains(pe.Message, "does not accept TLS") {
		t.Fatalf("message %q", pe.Message)
	}
}
