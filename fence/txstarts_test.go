package fence

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Behind a transaction pooler, a rewrite the cache keeps whose transaction
// starts were never found is checked at its first use all the same, and
// one pgfence cannot read is refused at every use, from what its plan
// keeps: being in the cache says nothing of where its transactions start.
func TestPooledStartsUncheckedRefused(t *testing.T) {
	g, err := sqlrewrite.ParseGuard("pgbench_accounts")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Guards: []sqlrewrite.Guard{g}, TransactionPooling: true}, NewMetrics(prometheus.NewRegistry()), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &proxy.Client{RemoteAddr: "127.0.0.1:1"}
	p.SessionStart(c)
	defer p.SessionEnd(c, nil)
	const (
		sql = "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2 RETURNING abalance"
		// Ends a transaction, then goes on where pgfence's parser cannot
		// follow: where the next transaction starts is unknown.
		unreadable = "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2; COMMIT; UPDATE pgbench_accounts SET abalance = = 1"
	)
	st := p.state.Load()
	pl := p.newPlanned(st, sql, &sqlrewrite.Result{SQL: unreadable})
	st.cachesOf(c).cache.Add(cacheKey{sqlrewrite.Simple, sql}, pl)
	for i := range 3 {
		plan := p.Query(c, sql)
		if !strings.Contains(plan.SQL, "cannot read this statement") || !strings.Contains(plan.SQL, "42601") {
			t.Errorf("execution %d of a cached rewrite pgfence cannot read: sent %.80q...; want it refused (42601)", i+1, plan.SQL)
		}
		if tx := pl.tx.Load(); tx == nil || tx.unread == nil {
			t.Errorf("execution %d: the plan keeps %+v; want the refusal", i+1, tx)
		}
	}
}
