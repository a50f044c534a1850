package fence

import (
	"slices"
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
	p, c := pooledSession(t)
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

// Behind a transaction pooler, where a text that runs as sent starts
// transactions of its own is found once per event loop and kept when that
// took a parse: a BEGIN; ...; COMMIT; ... sent again and again is not
// parsed at each execution. A text that needs no parse is not kept.
func TestPooledPassedStartsKept(t *testing.T) {
	p, c := pooledSession(t)
	// Writes an unguarded table, so it runs as sent with the token set
	// ahead of it, and again ahead of what follows the COMMIT.
	const sql = "BEGIN; INSERT INTO audit_log VALUES (1); COMMIT; INSERT INTO audit_log VALUES (2)"
	want := []proxy.TxStart{{Offset: strings.Index(sql, "COMMIT;") + len("COMMIT;"), Index: 3}}
	cs := p.state.Load().cachesOf(c)
	for i := range 2 {
		plan := p.Query(c, sql)
		if plan.SQL != "" || !plan.NeedsToken || !slices.Equal(plan.TxStarts, want) {
			t.Fatalf("execution %d: plan sends %q, needs the token %v, starts %+v; want the text as sent, with the token, starting %+v",
				i+1, plan.SQL, plan.NeedsToken, plan.TxStarts, want)
		}
		if kept, ok := cs.passed.Get(sql); !ok || !slices.Equal(kept.starts, want) {
			t.Fatalf("execution %d: the loop's caches keep %+v (%v); want the starts", i+1, kept, ok)
		}
	}
	// What is kept is what the next execution uses: it is not parsed again.
	cs.passed.Add(sql, &txStarts{unread: &sqlrewrite.Refusal{Code: "42601", Message: "pgfence: kept in the loop's caches"}})
	if plan := p.Query(c, sql); !strings.Contains(plan.SQL, "kept in the loop") {
		t.Errorf("after the kept starts were replaced, the plan sends %.80q...; want what was kept", plan.SQL)
	}
	for _, one := range []string{
		"INSERT INTO audit_log VALUES (3)",           // one statement
		"INSERT INTO audit_log VALUES (4); SELECT 1", // no word that ends a transaction
		"INSERT INTO audit_log VALUES (5); COMMIT",   // parsed: ends with the COMMIT
	} {
		p.Query(c, one)
	}
	if n := cs.passed.Len(); n != 2 {
		t.Errorf("the loop's caches keep %d texts' starts; want 2 (the texts that took a parse)", n)
	}
}

// pooledSession is a session of a policy behind a transaction pooler that
// guards pgbench_accounts, ended when the test ends.
func pooledSession(t *testing.T) (*Policy, *proxy.Client) {
	t.Helper()
	return guardedSession(t, Config{TransactionPooling: true})
}

// guardedSession starts a session of a Policy of cfg guarding
// pgbench_accounts.
func guardedSession(t *testing.T, cfg Config) (*Policy, *proxy.Client) {
	t.Helper()
	g, err := sqlrewrite.ParseGuard("pgbench_accounts")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Guards = []sqlrewrite.Guard{g}
	p, err := New(cfg, NewMetrics(prometheus.NewRegistry()), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &proxy.Client{RemoteAddr: "127.0.0.1:1"}
	p.SessionStart(c)
	t.Cleanup(func() { p.SessionEnd(c, nil) })
	return p, c
}
