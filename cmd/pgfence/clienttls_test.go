package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// refusedStart runs 'pgfence serve' with args, which must end with an
// error before it serves, and returns that error.
func refusedStart(t *testing.T, args ...string) error {
	t.Helper()
	inst, done := startServe(t, append([]string{"--upstream", "postgres://u@127.0.0.1:1/db"}, args...)...)
	if inst != nil {
		t.Fatalf("serve %q started", args)
	}
	return <-done
}

// --client-tls=require without a certificate to offer is a start-up error
// that says what is missing, from a flag or the config file; a value other
// than allow or require is refused too.
func TestClientTLSRequireNeedsCert(t *testing.T) {
	for _, k := range []string{"CLIENT_TLS", "TLS_CERT", "TLS_KEY"} {
		t.Setenv("PGFENCE_"+k, "") // the test's environment may not choose
		os.Unsetenv("PGFENCE_" + k)
	}
	err := refusedStart(t, "--client-tls", "require")
	if err == nil || !strings.Contains(err.Error(), "--client-tls=require needs --tls-cert and --tls-key") {
		t.Fatalf("--client-tls require without a certificate: %v", err)
	}
	file := filepath.Join(t.TempDir(), "pgfence.yaml")
	if err := os.WriteFile(file, []byte("client-tls: require\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = refusedStart(t, "--config", file)
	if err == nil || !strings.Contains(err.Error(), "--client-tls=require needs --tls-cert") {
		t.Fatalf("client-tls: require in the config file, without a certificate: %v", err)
	}
	err = refusedStart(t, "--client-tls", "prefer")
	if err == nil || !strings.Contains(err.Error(), `--client-tls "prefer": want allow or require`) {
		t.Fatalf("--client-tls prefer: %v", err)
	}
}

// With a certificate, require refuses plaintext clients with 28000 and
// serves TLS ones; allow, while the leg to Postgres is TLS, serves both
// and says at start that Postgres's hostssl rules do not see the clients.
func TestClientTLSModes(t *testing.T) {
	pgtest.Need(t)
	ca := pgtest.NewCA(t)
	cert, key := ca.Issue(t, "postgres")
	pg, err := pgserver.Start(context.Background(), pgserver.Options{TLSCert: cert, TLSKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	pfCert, pfKey := ca.Issue(t, "pgfence")
	certFile, keyFile := ca.File(t, "pgfence.crt", pfCert), ca.File(t, "pgfence.key", pfKey)
	const warning = "plaintext clients are accepted (--client-tls=allow)"
	connect := func(inst *instance, sslmode string) (*pgx.Conn, error) {
		c, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/postgres?sslmode="+sslmode)
		if err == nil {
			t.Cleanup(func() { c.Close(context.Background()) })
		}
		return c, err
	}
	onTLS := func(c *pgx.Conn) (client, server bool) {
		_, client = c.PgConn().Conn().(*tls.Conn)
		if err := c.QueryRow(context.Background(), "SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()").Scan(&server); err != nil {
			t.Fatal(err)
		}
		return client, server
	}

	for _, tc := range []struct {
		name, clientTLS, upstreamSSL string
		warns                        bool
	}{
		{"allow, TLS upstream", "", "require", true},
		{"allow, plain upstream", "allow", "disable", false},
		{"require, TLS upstream", "require", "require", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &serveTest{t: t, pg: pg}
			logs := &pgtest.LogBuffer{}
			o := serveOptions{upstream: "postgres://postgres@" + pg.Addr() + "/postgres?sslmode=" + tc.upstreamSSL, backstop: "off", discover: true,
				tlsCert: certFile, tlsKey: keyFile, clientTLS: tc.clientTLS}
			if o.clientTLS == "" {
				o.clientTLS = clientTLSAllow // as the flag's default
			}
			inst := s.serveLogged(o, logs)
			if got := strings.Contains(logs.String(), warning); got != tc.warns {
				t.Fatalf("warned of plaintext clients: %v, want %v; log:\n%s", got, tc.warns, logs.String())
			}
			c, err := connect(inst, "require")
			if err != nil {
				t.Fatal(err)
			}
			if client, server := onTLS(c); !client || server != (tc.upstreamSSL == "require") {
				t.Fatalf("TLS on the client's leg %v, on Postgres's %v", client, server)
			}
			plain, err := connect(inst, "disable")
			if tc.clientTLS != clientTLSRequire {
				if err != nil {
					t.Fatalf("a plaintext client under allow: %v", err)
				}
				if client, _ := onTLS(plain); client {
					t.Fatal("sslmode=disable got TLS")
				}
				return
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "28000" || !strings.Contains(pe.Message, "pgfence requires TLS") || !strings.Contains(pe.Hint, "sslmode=require") {
				t.Fatalf("a plaintext client under require: %v, want 28000 saying pgfence requires TLS", err)
			}
		})
	}
}
