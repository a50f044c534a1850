package sqlrewrite

import (
	"path/filepath"
	"testing"
)

// FuzzRewrite checks, for any text, that Rewrite does not panic or fail,
// and that its result passes verify: a refusal statement, or output that
// parses with every guarded UPDATE/DELETE fenced and nothing else changed.
func FuzzRewrite(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join(caseDir, "*.txt"))
	for _, p := range paths {
		c, err := loadCase(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(c.input, c.mode == Prepared)
	}
	r := mustNew(f, "fence.token", "accounts", "public.orders:version", `"Odd ""Name"""`, "billing.ledger:epoch")
	f.Fuzz(func(t *testing.T, sql string, prepared bool) {
		mode := Simple
		if prepared {
			mode = Prepared
		}
		res, err := r.Rewrite(sql, mode)
		if err != nil {
			t.Fatalf("Rewrite(%q): %v", sql, err)
		}
		if err := verify(r, sql, mode, res); err != nil {
			t.Fatalf("Rewrite(%q): %v", sql, err)
		}
	})
}
