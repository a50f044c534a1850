package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/poll"
)

// TestServeBackstopBehindOpenTransaction: a backstop that cannot be put in
// place without waiting behind an open transaction makes pgfence not
// ready, saying why, and is tried again soon, not at the next discovery:
// once the transaction ends, the backstop is in place and pgfence ready.
func TestServeBackstopBehindOpenTransaction(t *testing.T) {
	s := newServeTest(t)
	s.exec(`CREATE TABLE ro_locked (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)`)
	s.exec("BEGIN")
	s.exec("LOCK TABLE ro_locked IN ROW EXCLUSIVE MODE") // as a writer's open transaction holds it
	inst := s.serve(serveOptions{discover: true, discoverInterval: time.Hour, backstop: "install"})
	code, body := readyz(t, inst)
	if code != 503 || !strings.Contains(body, "ro_locked") || !strings.Contains(body, "does not queue behind them") {
		t.Fatalf("/readyz behind an open transaction: %d %q", code, body)
	}
	s.exec("COMMIT")
	poll.Eventually(t, 30*time.Second, "pgfence ready once the transaction ended", func() bool {
		code, _ := readyz(t, inst)
		return code == 200
	})
	if v := scrape(t, inst, `pgfence_backstop_installed{database="postgres",table="public.ro_locked"}`); v != "1" {
		t.Fatalf("pgfence_backstop_installed = %q", v)
	}
}

// TestServeKeepsRecordedConfiguration: an instance whose flags differ from
// the configuration the database records keeps the database's, says so in
// its log, metric and /readyz, and leaves to the backstop nothing it
// would fence otherwise than this instance's flags say.
func TestServeKeepsRecordedConfiguration(t *testing.T) {
	s := newServeTest(t)
	s.exec(`CREATE TABLE ro_shadow (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO ro_shadow VALUES (1, 'a', 5)`)
	first := s.serve(serveOptions{discover: true, backstop: "install", policyOptions: policyOptions{mode: "shadow"}})
	if v := scrape(t, first, `pgfence_backstop_config_differs{database="postgres"}`); v != "0" {
		t.Fatalf("the first instance's differences: %q", v)
	}
	second := s.serve(serveOptions{discover: true, backstop: "install", policyOptions: policyOptions{mode: "enforce"}})
	// The table's rollout, and what tables found by their epoch column get.
	if v := scrape(t, second, `pgfence_backstop_config_differs{database="postgres"}`); v != "2" {
		t.Fatalf("pgfence_backstop_config_differs = %q, want 2", v)
	}
	if code, body := readyz(t, second); code != 200 || !strings.Contains(body, "configuration differs") || !strings.Contains(body, "pgfence init") {
		t.Fatalf("/readyz %d %q", code, body)
	}
	// The database's shadow stays: a direct stale write lands.
	if got := tag(t, s.direct("3"), "UPDATE ro_shadow SET val = 'direct' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("direct stale write under the recorded shadow: %s", got)
	}
	// Through the enforcing instance, a MERGE is not left to a backstop
	// that only shadows.
	if _, err := s.client(second, "3").Exec(context.Background(), "MERGE INTO ro_shadow r USING (SELECT 1 AS id) s ON r.id = s.id WHEN MATCHED THEN UPDATE SET val = 'm'"); err == nil {
		t.Fatal("MERGE ran through an enforcing instance on a table the backstop only shadows")
	}
}

// TestServeSaysWhoCanSwitchTheBackstopOff: with pgfence's role not a
// superuser, the DDL guard cannot be in place: serve names, in a metric
// and in /readyz, each guarded table whose owner is another role.
func TestServeSaysWhoCanSwitchTheBackstopOff(t *testing.T) {
	s := newServeTest(t)
	s.exec(`CREATE ROLE ro_app; CREATE ROLE ro_pf LOGIN; GRANT ro_app TO ro_pf; GRANT CREATE ON DATABASE postgres TO ro_pf;
		CREATE TABLE ro_owned (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); ALTER TABLE ro_owned OWNER TO ro_app`)
	up := strings.Replace(s.pg.URL("postgres"), "postgres@", "ro_pf@", 1)
	inst := s.serve(serveOptions{upstream: up, discover: true, backstop: "install"})
	if v := scrape(t, inst, `pgfence_backstop_owner_exposed{database="postgres",owner="ro_app",table="public.ro_owned"}`); v != "1" {
		t.Fatalf("pgfence_backstop_owner_exposed = %q, want 1", v)
	}
	if code, body := readyz(t, inst); code != 200 || !strings.Contains(body, "public.ro_owned (owner ro_app)") {
		t.Fatalf("/readyz %d %q", code, body)
	}
	// Owned by pgfence's role, no table is named.
	s.exec(`ALTER TABLE ro_owned OWNER TO ro_pf`)
	inst.reload(context.Background(), inst.opts)
	if v := scrape(t, inst, `pgfence_backstop_owner_exposed{database="postgres",owner="ro_app",table="public.ro_owned"}`); v != "" {
		t.Fatalf("pgfence_backstop_owner_exposed after the table went to pgfence's role: %q", v)
	}
}
