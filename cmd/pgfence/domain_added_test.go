package main

import (
	"context"
	"testing"
)

// A table put in a lock domain after its backstop was recorded without
// one (serve's --domain adds it to pgfence.domain_members, which every
// instance's rewrite follows) gets a backstop that claims the domain too:
// a stale write the rewrite does not see (straight to Postgres here) is
// skipped by the backstop, as the rewrite refuses one through pgfence (red
// team 7a: it landed, while /readyz said the backstop was in place).
func TestDomainAddedLaterReachesBackstop(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE da_t (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO da_t VALUES (1, 'a', 0), (2, 'b', 0)")
	s.serve(serveOptions{backstop: "install", initDomains: true, policyOptions: policyOptions{guards: []string{"da_t"}}})
	inst := s.serve(serveOptions{backstop: "install", initDomains: true, policyOptions: policyOptions{guards: []string{"da_t"}, domains: []string{"da_t=da_billing"}}})
	s.exec("UPDATE pgfence.domains SET token = 100 WHERE domain = 'da_billing'") // a newer holder wrote the domain

	if got := tag(t, s.client(inst, "50"), "UPDATE da_t SET v = 'x' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("a stale write through pgfence: %s, want UPDATE 0", got)
	}
	if got := tag(t, s.direct("50"), "UPDATE da_t SET v = 'y' WHERE id = 2"); got != "UPDATE 0" {
		t.Fatalf("a stale write straight to Postgres, the domain at 100: %s, want UPDATE 0 (the backstop claims the domain)", got)
	}
	var domain string
	if err := s.db.QueryRow(context.Background(), "SELECT coalesce(domain, '') FROM pgfence.guarded WHERE relid = 'da_t'::regclass").Scan(&domain); err != nil || domain != "da_billing" {
		t.Fatalf("recorded domain %q, %v; want da_billing", domain, err)
	}
}

// A table whose backstop is recorded with a lock domain, but that has no
// membership row (one deleted by pgfence's role, say), is not moved to
// another domain by an instance's --domain: its backstop keeps claiming
// the recorded one (red team 8).
func TestDomainFlagDoesNotMoveRecordedTable(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE dm_t (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO dm_t VALUES (1, 'a', 0)")
	s.serve(serveOptions{backstop: "install", initDomains: true, policyOptions: policyOptions{guards: []string{"dm_t"}, domains: []string{"dm_t=dm_a"}}})
	s.exec("DELETE FROM pgfence.domain_members WHERE relid = 'dm_t'::regclass")
	s.serve(serveOptions{backstop: "install", initDomains: true, policyOptions: policyOptions{guards: []string{"dm_t"}, domains: []string{"dm_t=dm_b"}}})
	var member string
	if err := s.db.QueryRow(context.Background(), "SELECT coalesce((SELECT domain FROM pgfence.domain_members WHERE relid = 'dm_t'::regclass), '')").Scan(&member); err != nil || member == "dm_b" {
		t.Fatalf("membership %q, %v: an instance's --domain moved the table to its domain", member, err)
	}
	var rec string
	if err := s.db.QueryRow(context.Background(), "SELECT coalesce(domain, '') FROM pgfence.guarded WHERE relid = 'dm_t'::regclass").Scan(&rec); err != nil || rec != "dm_a" {
		t.Fatalf("recorded domain %q, %v; want dm_a kept", rec, err)
	}
	s.exec("UPDATE pgfence.domains SET token = 100 WHERE domain = 'dm_a'")
	if got := tag(t, s.direct("50"), "UPDATE dm_t SET v = 'y' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("a stale write straight to Postgres, dm_a at 100: %s, want UPDATE 0 (the backstop still claims dm_a)", got)
	}
}
