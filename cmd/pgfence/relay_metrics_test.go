package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// pgfence_upstream_connect_failures_total counts, by cause, sessions
// Postgres refused during startup; every cause's series is there from the
// start. pgfence_added_latency_seconds observes each round trip.
func TestServeRelayMetrics(t *testing.T) {
	s := newServeTest(t)
	inst := s.serve(serveOptions{})
	for _, cause := range []string{"refused", "timeout", "network", "tls", "auth", "rejected"} {
		if v := scrape(t, inst, `pgfence_upstream_connect_failures_total{cause="`+cause+`"}`); v != "0" {
			t.Fatalf("cause %s at start: %q, want 0", cause, v)
		}
	}
	bg := context.Background()
	connect := func(user, db string) error {
		c, err := pgx.Connect(bg, "postgres://"+user+"@"+inst.Addr()+"/"+db+"?sslmode=disable")
		if err == nil {
			c.Close(bg)
		}
		return err
	}
	if err := connect("nosuchrole", "postgres"); err == nil {
		t.Fatal("an unknown role connected")
	}
	if err := connect("postgres", "nosuchdb"); err == nil {
		t.Fatal("an unknown database connected")
	}
	for cause, want := range map[string]string{"auth": "1", "rejected": "1", "refused": "0"} {
		if v := scrape(t, inst, `pgfence_upstream_connect_failures_total{cause="`+cause+`"}`); v != want {
			t.Errorf("cause %s: %q, want %s", cause, v, want)
		}
	}

	before, _ := strconv.Atoi(scrape(t, inst, "pgfence_added_latency_seconds_count"))
	c := s.client(inst, "")
	for range 20 {
		if _, err := c.Exec(bg, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := strconv.Atoi(scrape(t, inst, "pgfence_added_latency_seconds_count"))
	// The startup's round trip, pgx's own, and the 20 SELECTs.
	if after-before < 20 {
		t.Fatalf("pgfence_added_latency_seconds_count grew by %d over 20 round trips, want at least 20", after-before)
	}
	sum, err := strconv.ParseFloat(scrape(t, inst, "pgfence_added_latency_seconds_sum"), 64)
	if err != nil || sum <= 0 || sum > 5 {
		t.Fatalf("pgfence_added_latency_seconds_sum = %v (%v), want a small positive time", sum, err)
	}
}
