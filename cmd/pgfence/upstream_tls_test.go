package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// /readyz, pgfence_upstream_up and the sessions pgfence connects follow
// the --upstream URL's sslmode as libpq does, against a Postgres with TLS
// and one without: prefer (and sslmode left out, which means prefer)
// tries TLS and falls back to plain text; require, verify-ca and
// verify-full insist on TLS, and the verifying ones on a certificate
// their sslrootcert trusts; disable never asks. A session's own leg to
// Postgres is over TLS exactly when the mode asks for it and Postgres
// accepts it (allow included: pgfence makes one attempt per session, and
// asks for TLS, where libpq would try plain text first).
func TestUpstreamSSLModes(t *testing.T) {
	pgtest.Need(t)
	bg := context.Background()
	ca := pgtest.NewCA(t)
	cert, key := ca.Issue(t, "postgres")
	withTLS, err := pgserver.Start(bg, pgserver.Options{TLSCert: cert, TLSKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { withTLS.Stop() })
	plain, err := pgserver.Start(bg, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Stop() })
	rootCert := ca.File(t, "root.crt", ca.CertPEM)
	otherCA := pgtest.NewCA(t)
	otherRoot := otherCA.File(t, "other.crt", otherCA.CertPEM)
	// Neither the test's environment nor a ~/.postgresql/root.crt may
	// choose for the URL.
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")

	const (
		refused = iota // not ready, and sessions refused
		plainLeg
		tlsLeg
	)
	for _, tc := range []struct {
		query          string // the URL's query ("" leaves sslmode out)
		onTLS, onPlain int
	}{
		{"", tlsLeg, plainLeg},
		{"sslmode=disable", plainLeg, plainLeg},
		{"sslmode=allow", tlsLeg, plainLeg},
		{"sslmode=prefer", tlsLeg, plainLeg},
		{"sslmode=require", tlsLeg, refused},
		{"sslmode=verify-ca&sslrootcert=" + rootCert, tlsLeg, refused},
		{"sslmode=verify-full&sslrootcert=" + rootCert, tlsLeg, refused},
		// A certificate the URL's sslrootcert does not trust.
		{"sslmode=verify-ca&sslrootcert=" + otherRoot, refused, refused},
		{"sslmode=verify-full&sslrootcert=" + otherRoot, refused, refused},
	} {
		for _, server := range []struct {
			name string
			pg   *pgserver.Server
			want int
		}{{"with TLS", withTLS, tc.onTLS}, {"without TLS", plain, tc.onPlain}} {
			name := strings.ReplaceAll(strings.ReplaceAll(tc.query, rootCert, "CA"), otherRoot, "another CA")
			if name == "" {
				name = "sslmode left out"
			}
			t.Run(name+"/"+server.name, func(t *testing.T) {
				up := fmt.Sprintf("postgres://postgres@%s/postgres", server.pg.Addr())
				if tc.query != "" {
					up += "?" + tc.query
				}
				s := &serveTest{t: t, pg: server.pg}
				inst := s.serve(serveOptions{upstream: up, backstop: "off", discover: true})
				code, body := readyz(t, inst)
				upMetric := scrape(t, inst, "pgfence_upstream_up")
				if server.want == refused {
					if code != http.StatusServiceUnavailable || upMetric != "0" {
						t.Fatalf("/readyz %d %q, pgfence_upstream_up %s; want 503 and 0", code, body, upMetric)
					}
					ctx, cancel := context.WithTimeout(bg, 10*time.Second)
					defer cancel()
					if c, err := pgx.Connect(ctx, "postgres://postgres@"+inst.Addr()+"/postgres?sslmode=disable"); err == nil {
						c.Close(bg)
						t.Fatal("a session got through a pgfence that cannot reach Postgres as its sslmode says")
					}
					return
				}
				if code != http.StatusOK || upMetric != "1" {
					t.Fatalf("/readyz %d %q, pgfence_upstream_up %s; want 200 and 1", code, body, upMetric)
				}
				c := s.client(inst, "")
				var onTLS bool
				if err := c.QueryRow(bg, "SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()").Scan(&onTLS); err != nil {
					t.Fatal(err)
				}
				if onTLS != (server.want == tlsLeg) {
					t.Fatalf("a session's leg to Postgres is over TLS: %v, want %v", onTLS, server.want == tlsLeg)
				}
			})
		}
	}
}
