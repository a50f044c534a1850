package fence

import "testing"

// A query of a guarded table that spells no write keyword passes untouched,
// and the session remembers it as it does a text naming no guarded table
// (see session.passes): drivers send the same query again and again, and
// a scan of each costs more than the comparison. Only an ASCII text is
// remembered, as only it reads the same in every client encoding, and
// never one that changes the session.
func TestReadOnlyMemo(t *testing.T) {
	p, c := guardedSession(t, Config{})
	sess := sessionOf(c)
	remembered := func(sql string) bool {
		t.Helper()
		if plan := p.Parse(c, sql); plan.SQL != "" || len(plan.Probes) > 0 {
			t.Fatalf("%q: planned %+v; want it passed untouched", sql, plan)
		}
		return sess.passes(p.state.Load(), sql)
	}
	const query = "SELECT abalance FROM pgbench_accounts WHERE aid = $1"
	if !remembered(query) {
		t.Errorf("%q: not remembered", query)
	}
	for _, sql := range []string{
		"SELECT 'é' FROM pgbench_accounts WHERE aid = $1",
		"SELECT pg_catalog.set_config('search_path', 'x', false) FROM pgbench_accounts",
	} {
		if remembered(sql) {
			t.Errorf("%q: remembered", sql)
		}
	}
	const write = "UPDATE pgbench_accounts SET abalance = 0 WHERE aid = $1"
	if plan := p.Parse(c, write); plan.SQL == "" || len(plan.Probes) == 0 {
		t.Fatalf("after a query was remembered, a write is planned %+v; want it fenced", plan)
	}
	if sess.passes(p.state.Load(), write) {
		t.Fatal("a fenced write is remembered as passed")
	}
}
