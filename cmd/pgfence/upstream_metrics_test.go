package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// pgfence_upstream_up says what /readyz says of the upstream, at each
// scrape.
func TestUpstreamUpMetric(t *testing.T) {
	s := newServeTest(t)
	opts := func(up string) serveOptions {
		return serveOptions{upstream: up, discover: false, backstop: "off",
			policyOptions: policyOptions{guards: []string{"accounts"}}}
	}
	check := func(inst *instance, want string, wantReady int) {
		t.Helper()
		if v := scrape(t, inst, "pgfence_upstream_up"); v != want {
			t.Errorf("pgfence_upstream_up = %q, want %s", v, want)
		}
		if code, body := readyz(t, inst); code != wantReady {
			t.Errorf("/readyz %d %q, want %d", code, body, wantReady)
		}
	}

	inst := s.serve(opts(""))
	check(inst, "1", 200)

	// A server whose sessions are read-only for pgfence's role (the
	// Postgres is this test's own, stopped at its end).
	s.exec(`CREATE ROLE up_ro LOGIN SUPERUSER; ALTER ROLE up_ro SET default_transaction_read_only = on`)
	ro := s.serve(opts(strings.Replace(s.pg.URL("postgres"), "postgres@", "up_ro@", 1)))
	check(ro, "0", 503)

	// Nothing listens at the upstream's address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	check(s.serve(opts("postgres://u@"+dead+"/db")), "0", 503)

	// And Postgres going away is seen once the last verdict (a second at
	// most) has passed.
	s.pg.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for scrape(t, inst, "pgfence_upstream_up") != "0" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	check(inst, "0", 503)
}
