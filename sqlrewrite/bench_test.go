package sqlrewrite_test

// Benchmarks of the rewriter on pgbench's statements (make bench runs them
// with -benchmem). The policy's cache path is benchmarked in fence.

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/sqlrewrite"
)

func benchRewriter(b *testing.B) *sqlrewrite.Rewriter {
	b.Helper()
	g, err := sqlrewrite.ParseGuard("pgbench_accounts")
	if err != nil {
		b.Fatal(err)
	}
	rw, err := sqlrewrite.New(sqlrewrite.Config{Guards: []sqlrewrite.Guard{g}, TokenSetting: "fence.token"})
	if err != nil {
		b.Fatal(err)
	}
	return rw
}

// Statements that name no guarded table: MayTouch says no without parsing.
var prefilterMisses = []struct{ name, sql string }{
	{"set-token", "SET fence.token = '1000'"},
	{"select", "SELECT abalance FROM pgbench_branches WHERE bid = $1"},
	{"insert-history", "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)"},
	{"select-1KiB", "SELECT " + strings.Repeat("b.bbalance + ", 78) + "0 FROM pgbench_branches b WHERE b.bid = $1"},
}

// BenchmarkPrefilterMiss is the prefilter (MayTouch) on statements it
// passes without parsing: the cost every unguarded statement pays.
func BenchmarkPrefilterMiss(b *testing.B) {
	rw := benchRewriter(b)
	for _, c := range prefilterMisses {
		if rw.MayTouch(c.sql) {
			b.Fatalf("%s: MayTouch(%q) = true, want a miss", c.name, c.sql)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rw.MayTouch(c.sql)
			}
		})
	}
}

// BenchmarkFullRewrite is a full parse and rewrite (what a rewrite-cache miss
// costs): a fenced UPDATE as pgbench sends it in each protocol mode, and a
// SELECT of the guarded table, which is parsed and passes unchanged.
func BenchmarkFullRewrite(b *testing.B) {
	rw := benchRewriter(b)
	cases := []struct {
		name string
		sql  string
		mode sqlrewrite.Mode
	}{
		{"update-prepared", "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2", sqlrewrite.Prepared},
		{"update-simple", "UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = 567890;", sqlrewrite.Simple},
		{"select-guarded-simple", "SELECT abalance FROM pgbench_accounts WHERE aid = 567890;", sqlrewrite.Simple},
	}
	for _, c := range cases {
		res, err := rw.Rewrite(c.sql, c.mode, nil)
		if err != nil || res.Refusal != nil {
			b.Fatalf("%s: %v %v", c.name, err, res.Refusal)
		}
		if strings.HasPrefix(c.name, "update") == (res.SQL == c.sql) {
			b.Fatalf("%s: rewritten = %v, unexpected", c.name, res.SQL != c.sql)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rw.Rewrite(c.sql, c.mode, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
