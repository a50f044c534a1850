package sqlrewrite_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// TestPlanReadsOnce counts the reads of a Query's text while the policy
// plans it (fence.Policy.Query), by which of the package's scanners: the
// analysis's one pass, and only what it says the text needs besides (a SET's
// own reading, the literals of a simple-protocol write, the parser). A
// text the session's memo passes is not read at all, but behind a
// transaction pooler, where whether it needs the token is asked of every
// text.
func TestPlanReadsOnce(t *testing.T) {
	const (
		update = "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2"
		twice  = "SELECT 1; COMMIT; UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2"
	)
	type reads map[string]int
	for _, pooled := range []bool{false, true} {
		g, err := sqlrewrite.ParseGuard("pgbench_accounts")
		if err != nil {
			t.Fatal(err)
		}
		p, err := fence.New(fence.Config{Guards: []sqlrewrite.Guard{g}, TransactionPooling: pooled},
			fence.NewMetrics(prometheus.NewRegistry()), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := &proxy.Client{RemoteAddr: "127.0.0.1:1"}
		p.SessionStart(c)
		memo := reads{}
		if pooled {
			memo = reads{"pass": 1}
		}
		for _, tc := range []struct {
			sql  string
			want reads
		}{
			{"SELECT 1", reads{"pass": 1}},
			{"SELECT 1", memo},
			{"SHOW work_mem", reads{"pass": 1}},
			{"SET fence.token = '5'", reads{"pass": 1, "token setting": 1}},
			{"SELECT abalance FROM pgbench_accounts WHERE aid = 2", reads{"pass": 1}},
			// A new write: the pass, and its literals taken out (its template
			// is parsed, another text).
			{update, reads{"pass": 1, "literals": 1}},
			{update, reads{"pass": 1, "literals": 1}}, // seen twice: its plan is kept by its text
			{update, reads{"pass": 1}},
			// Parsed: a SET of one of pgfence's own settings, which is
			// refused, and a text with no template, rewritten as sent (and
			// behind a pooler, its rewrite, another text, to find where
			// its transactions start), which is then kept by its text.
			{"SET pgfence.stale_0 = '1'", reads{"pass": 1, "token setting": 1, "parse": 1}},
			{twice, reads{"pass": 1, "literals": 1, "parse": 2}},
			{twice, reads{"pass": 1}},
		} {
			got := reads{}
			stop := sqlrewrite.CountScans(func(what, sql string) {
				if sql == tc.sql {
					got[what]++
				}
			})
			p.Query(c, tc.sql)
			stop()
			if !maps.Equal(got, tc.want) {
				t.Errorf("pooled %v: planning %q read it %v, want %v", pooled, tc.sql, fmt.Sprint(got), fmt.Sprint(tc.want))
			}
		}
		p.SessionEnd(c, nil)
	}
}

// TestPooledStartsFoundOnce: behind a transaction pooler, a simple Query
// whose rewrite is not bound to its literals (RETURNING, several
// statements, a client whose Query must stay simple) is rewritten as
// sent, and that rewrite, another text that spells END, is parsed to find
// where its transactions start: once, with the plan the cache keeps. Its
// later executions, served from the cache, parse nothing and carry the
// same starts.
func TestPooledStartsFoundOnce(t *testing.T) {
	const (
		returning = "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2 RETURNING abalance"
		twice     = returning + "; COMMIT; UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 3"
		plain     = "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2"
	)
	g, err := sqlrewrite.ParseGuard("pgbench_accounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		sql    string
		c      *proxy.Client
		starts int // transactions the rewrite starts after its first
	}{
		{"RETURNING", returning, &proxy.Client{RemoteAddr: "127.0.0.1:1"}, 0},
		{"COMMIT between writes", twice, &proxy.Client{RemoteAddr: "127.0.0.1:1"}, 1},
		{"simple only", plain, &proxy.Client{RemoteAddr: "127.0.0.1:1", Replication: true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := fence.New(fence.Config{Guards: []sqlrewrite.Guard{g}, TransactionPooling: true},
				fence.NewMetrics(prometheus.NewRegistry()), nil)
			if err != nil {
				t.Fatal(err)
			}
			p.SessionStart(tc.c)
			defer p.SessionEnd(tc.c, nil)
			var first proxy.Plan
			for i := range 3 {
				var parsed []string
				stop := sqlrewrite.CountScans(func(what, sql string) {
					if what == "parse" {
						parsed = append(parsed, sql)
					}
				})
				plan := p.Query(tc.c, tc.sql)
				stop()
				if plan.SQL == "" || plan.ParamTypes != nil || !plan.NeedsToken {
					t.Fatalf("execution %d: %+v; want the text's rewrite, run as sent, needing the token", i+1, plan)
				}
				if i == 0 {
					first = plan
					if len(plan.TxStarts) != tc.starts {
						t.Fatalf("the rewrite starts %v; want %d transactions after its first", plan.TxStarts, tc.starts)
					}
					continue
				}
				if len(parsed) != 0 {
					t.Errorf("execution %d, from the cache, parsed %d texts (%.40q...); want none", i+1, len(parsed), parsed)
				}
				if plan.SQL != first.SQL || !slices.Equal(plan.TxStarts, first.TxStarts) {
					t.Errorf("execution %d: starts %v (SQL the same: %v); want the first's, %v", i+1, plan.TxStarts, plan.SQL == first.SQL, first.TxStarts)
				}
			}
		})
	}
}
