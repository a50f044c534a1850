package fence_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Which texts wait for the server's settings when sent before it said
// them (see proxy's Reading holds): only those that may write a guarded
// table and read otherwise under another setting; behind a transaction
// pooler, every text that reads otherwise.
func TestDependsOnReading(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		cfg := fence.Config{TransactionPooling: pooled}
		for _, spec := range []string{"accounts", "kontö"} {
			g, err := sqlrewrite.ParseGuard(spec)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Guards = append(cfg.Guards, g)
		}
		p, err := fence.New(cfg, fence.NewMetrics(prometheus.NewRegistry()), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := &proxy.Client{}
		p.SessionStart(c)
		for _, tc := range []struct {
			sql           string
			want, pooling bool
		}{
			{"UPDATE accounts SET v = 'x' WHERE id = 1", false, false},
			{"UPDATE accounts SET v = E'x\\'y' WHERE id = 1", false, false},
			{`UPDATE accounts SET v = 'C:\dir' WHERE id = 1`, true, true},
			{"UPDATE accounts SET v = 'grüße' WHERE id = 1", true, true},
			{`SELECT 'a\', '; UPDATE accounts SET v = 1 --'`, true, true},
			{`SELECT 'a\' FROM accounts`, false, true},              // no write keyword: cannot write
			{`UPDATE other SET v = 'a\' WHERE id = 1`, false, true}, // names no guarded table
			{"UPDATE other SET v = 'ü'", true, true},                // a guarded name is not ASCII
			{"SELECT 'ü' FROM accounts", false, true},
		} {
			want := tc.want
			if pooled {
				want = tc.pooling
			}
			if got := p.DependsOnReading(c, tc.sql); got != want {
				t.Errorf("pooled %v: DependsOnReading(%q) = %v, want %v", pooled, tc.sql, got, want)
			}
		}
	}
}
