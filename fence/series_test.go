package fence_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A guarded table's series exist from start-up at 0, so that increase()
// sees its first reject, its first write without a token and its first
// guarded write.
func TestSeriesStartAtZero(t *testing.T) {
	tbl := table(t)
	p := pgtest.StartProxy(t, []string{tbl})
	mfs, err := p.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"fencing_reject_total":               2, // row: rewrite, backstop
		"critical_write_without_token_total": 2, // refused, allowed
		"pgfence_guarded_writes_total":       2, // set, missing
	}
	got := map[string]int{}
	for _, mf := range mfs {
		if _, ok := want[mf.GetName()]; !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "table" && l.GetValue() == tbl && m.GetCounter().GetValue() == 0 {
					got[mf.GetName()]++
				}
			}
		}
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s{table=%q}: %d series at 0 at start-up, want %d", name, tbl, got[name], n)
		}
	}
}

// A reload retires the series of tables no longer guarded: a table
// guarded by another name now keeps one set of series.
func TestSeriesRetired(t *testing.T) {
	tbl := table(t)
	p := pgtest.StartProxy(t, []string{tbl})
	cfg := p.Policy.Config()
	cfg.Guards[0].As = "public." + tbl
	if err := p.Policy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	mfs, err := p.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "table" {
					labels[l.GetValue()]++
				}
			}
		}
	}
	if labels[tbl] != 0 || labels["public."+tbl] == 0 {
		t.Fatalf("series by table label after the reload: %v; want only public.%s", labels, tbl)
	}
}
