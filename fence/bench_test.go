package fence_test

// Benchmarks of the policy's per-statement path, the one the proxy calls
// for every Query and Parse message (make bench runs them with -benchmem).
// They need no Postgres, but this package's TestMain starts one anyway.

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

func benchPolicy(b testing.TB) (*fence.Policy, *proxy.Client) {
	return policyWith(b, fence.Config{}, prometheus.NewRegistry())
}

// policyWith is a Policy guarding pgbench_accounts, configured by cfg
// otherwise, with its metrics in reg.
func policyWith(b testing.TB, cfg fence.Config, reg *prometheus.Registry) (*fence.Policy, *proxy.Client) {
	b.Helper()
	g, err := sqlrewrite.ParseGuard("pgbench_accounts")
	if err != nil {
		b.Fatal(err)
	}
	cfg.Guards = []sqlrewrite.Guard{g}
	p, err := fence.New(cfg, fence.NewMetrics(reg), nil)
	if err != nil {
		b.Fatal(err)
	}
	c := &proxy.Client{RemoteAddr: "127.0.0.1:1"}
	p.SessionStart(c)
	b.Cleanup(func() { p.SessionEnd(c, nil) })
	return p, c
}

// BenchmarkPolicyCacheHit is a guarded UPDATE whose rewrite is in the
// cache: prefilter, cache lookup, and the plan handed to the proxy.
func BenchmarkPolicyCacheHit(b *testing.B) {
	b.Run("parse", func(b *testing.B) {
		p, c := benchPolicy(b)
		const sql = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2"
		if plan := p.Parse(c, sql); plan.SQL == "" || len(plan.Probes) != 1 {
			b.Fatalf("not fenced: %+v", plan)
		}
		b.ReportAllocs()
		for b.Loop() {
			p.Parse(c, sql)
		}
	})
	b.Run("query", func(b *testing.B) {
		p, c := benchPolicy(b)
		const sql = "UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = 567890;"
		if plan := p.Query(c, sql); plan.SQL == "" || len(plan.Probes) != 1 {
			b.Fatalf("not fenced: %+v", plan)
		}
		b.ReportAllocs()
		for b.Loop() {
			p.Query(c, sql)
		}
	})
}

// BenchmarkPolicyCacheMiss is a guarded UPDATE seen for the first time:
// every iteration has a new text (as pgbench -M simple sends them), so the
// text is scanned and parameterized, its template's plan found in the
// template cache, and the text added to the cache of whole parameterized
// texts (evicting another). A text that must be parsed is sqlrewrite's
// BenchmarkFullRewrite.
func BenchmarkPolicyCacheMiss(b *testing.B) {
	for _, bc := range []struct{ name, format string }{
		{"numbers", "UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = %d;"},
		{"strings", "UPDATE pgbench_accounts SET filler = 'note %[1]d', abalance = 0 WHERE aid = %[1]d AND filler <> 'x'"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p, c := benchPolicy(b)
			texts := numbered(bc.format)     // far more than the cache's 4096
			for _, t := range texts[:8192] { // fill the cache, so Adds evict
				if plan := p.Query(c, t); plan.ParamTypes == nil {
					b.Fatalf("%q not parameterized", t)
				}
			}
			queryEach(b, p, c, texts[8192:])
		})
	}
}

// BenchmarkPolicyPassthrough is a statement the prefilter passes without
// parsing, through the whole policy (what an unguarded statement costs).
func BenchmarkPolicyPassthrough(b *testing.B) {
	p, c := benchPolicy(b)
	const sql = "SELECT abalance FROM pgbench_branches WHERE bid = $1"
	if plan := p.Parse(c, sql); plan.SQL != "" || len(plan.Probes) != 0 {
		b.Fatalf("rewritten: %+v", plan)
	}
	b.ReportAllocs()
	for b.Loop() {
		p.Parse(c, sql)
	}
}

// BenchmarkPolicyGuardedQuery is a query of a guarded table with a new text
// every iteration (pgbench -S -M simple on a guarded table): it spells no
// write keyword, so it passes without a scan or the cache.
func BenchmarkPolicyGuardedQuery(b *testing.B) {
	p, c := benchPolicy(b)
	texts := numbered("SELECT abalance FROM pgbench_accounts WHERE aid = %d;")
	if plan := p.Query(c, texts[0]); plan.SQL != "" || len(plan.Probes) != 0 {
		b.Fatalf("rewritten: %+v", plan)
	}
	queryEach(b, p, c, texts)
}

// numbered returns 65536 texts: format with 0, 1, 2, ...
func numbered(format string) []string {
	texts := make([]string, 1<<16)
	for i := range texts {
		texts[i] = fmt.Sprintf(format, i)
	}
	return texts
}

// queryEach is the benchmark loop: a Query of each text in turn.
func queryEach(b *testing.B, p *fence.Policy, c *proxy.Client, texts []string) {
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p.Query(c, texts[i%len(texts)])
		i++
	}
}

// BenchmarkPolicyPooled is the per-statement path behind a transaction
// pooler (Config.TransactionPooling), where each text is also checked for
// a change of the token for the session and for whether it needs the
// token: a cached fenced write, the token's SET, a plain read, cached
// fenced writes whose rewrite is not bound to their literals (RETURNING,
// and one with a COMMIT between two writes), and a text that runs as sent
// with a COMMIT between two statements (its starts kept by the loop).
func BenchmarkPolicyPooled(b *testing.B) {
	for _, bc := range []struct{ name, sql string }{
		{"write", "UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = 567890;"},
		{"set", "SET fence.token = '1000'"},
		{"read", "SELECT abalance FROM pgbench_branches WHERE bid = 1"},
		// Not bound to their literals: the cached rewrite of the text as
		// sent, whose transaction starts were found with it.
		{"returning", "UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = 567890 RETURNING abalance"},
		{"returning-commit", "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 2 RETURNING abalance; COMMIT; UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 3"},
		{"passed-commit", "BEGIN; INSERT INTO pgbench_history (tid, bid, aid, delta) VALUES (1, 1, 2, 3); COMMIT; SELECT 1"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p, c := policyWith(b, fence.Config{TransactionPooling: true}, prometheus.NewRegistry())
			p.Query(c, bc.sql)
			b.ReportAllocs()
			for b.Loop() {
				p.Query(c, bc.sql)
			}
		})
	}
}
