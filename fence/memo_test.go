package fence_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// A session remembers the last text it passed untouched, so that a driver
// sending it again skips the policy's scans; the memory must never outlive
// its reasons: the configuration, the session's SQL-level prepared writes,
// and the text ending nothing.
func TestPassthroughMemo(t *testing.T) {
	p, c := policyWith(t, fence.Config{}, prometheus.NewRegistry())
	fenced := func(sql string) bool {
		plan := p.Parse(c, sql)
		return plan.SQL != "" || len(plan.Probes) > 0
	}
	const other = "UPDATE other_t SET x = 1 WHERE id = $1"
	for range 2 {
		if fenced(other) {
			t.Fatal("a write to an unguarded table was fenced")
		}
	}
	// The table becomes guarded: the same text is fenced at once.
	cfg := p.Config()
	g, err := sqlrewrite.ParseGuard("other_t")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Guards = append(cfg.Guards, g)
	if err := p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if !fenced(other) {
		t.Fatal("after a reload guarding its table, a remembered text still passes untouched")
	}

	// EXECUTE passes while the session has no prepared write; once it has
	// one, the same text is probed.
	const run = "EXECUTE w (1)"
	for range 2 {
		if plan := p.Query(c, run); len(plan.Probes) > 0 {
			t.Fatal("EXECUTE with no prepared write was probed")
		}
	}
	if !fenced("PREPARE w (int) AS UPDATE pgbench_accounts SET abalance = 0 WHERE aid = $1") {
		t.Fatal("PREPARE of a write was not fenced")
	}
	if plan := p.Query(c, run); len(plan.Probes) == 0 {
		t.Fatal("after PREPARE of a write, a remembered EXECUTE of it passes unprobed")
	}

	// A text that ends a transaction after a setting changed says Forget
	// every time, never from memory.
	for range 2 {
		p.Query(c, "SET search_path = public")
		if plan := p.Query(c, "COMMIT"); !plan.Forget {
			t.Fatal("COMMIT after a search_path change did not say Forget")
		}
	}
}

// A plain SET of the token is planned as a Setting for the proxy to
// answer, without allocating when the session sets the same token again
// (once per transaction, as it should with a pool).
func TestTokenSetPlanAllocations(t *testing.T) {
	p, c := policyWith(t, fence.Config{}, prometheus.NewRegistry())
	const set = "SET fence.token = '1000'"
	plan := p.Query(c, set)
	if plan.Setting == nil || plan.Setting.Name != "fence.token" || plan.Setting.Value != "1000" || plan.SQL != "" {
		t.Fatalf("plan of %q: %+v", set, plan)
	}
	if got := p.Query(c, "set FENCE.TOKEN to 1000;").Setting; got != plan.Setting {
		t.Fatalf("the same setting written otherwise: %+v, want the session's last one", got)
	}
	if n := testing.AllocsPerRun(100, func() { p.Query(c, set) }); n != 0 {
		t.Fatalf("planning the same SET again allocates %v times", n)
	}
	if got := p.Query(c, "SET fence.token = '1001'").Setting; got == plan.Setting || got.Value != "1001" {
		t.Fatalf("a new token: %+v", got)
	}
}
