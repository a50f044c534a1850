package sqlrewrite

import (
	"path/filepath"
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// fuzzRewriter builds the fuzzing configuration: four guards whose rollouts
// and missing-token policies come from the bits of cfg, and the Allow
// switches from its high bits.
func fuzzRewriter(t testing.TB, cfg uint8) *Rewriter {
	return fuzzRewriterIn(t, cfg, nil)
}

// fuzzDomains puts the fuzzing guards in lock domains: two in one domain,
// one in another, one in none.
var fuzzDomains = []string{"billing", "shipping", "billing", ""}

// fuzzRewriterIn is fuzzRewriter with the guards in the lock domains
// given, in guard order (nil: none).
func fuzzRewriterIn(t testing.TB, cfg uint8, domains []string) *Rewriter {
	specs := []string{"accounts", "public.orders:version", `"Odd ""Name"""`, "billing.ledger:epoch"}
	c := Config{TokenSetting: "fence.token", Allow: Allow{Truncate: cfg&0x40 != 0, CopyFrom: cfg&0x40 != 0, CurrentOf: cfg&0x80 != 0}}
	for i, s := range specs {
		g, err := ParseGuard(s)
		if err != nil {
			t.Fatal(err)
		}
		switch (cfg >> (i * 2 % 6)) & 3 { // the last guard shares bits with the first
		case 1:
			g.Rollout = Shadow
		case 2:
			g.Rollout = Observe
		case 3:
			g.AllowMissingToken = true
		}
		if domains != nil {
			g.Domain = domains[i]
		}
		c.Guards = append(c.Guards, g)
	}
	r, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fuzzSession is what the fuzzed session has PREPAREd.
var fuzzSession = fakeSession{"p": {"accounts"}, "q": {"public.orders", "accounts"}, "gone": {"no.such"}}

// FuzzRewrite checks, for any text and configuration (with and without
// lock domains), that Rewrite does not panic or fail, and that its result
// passes verify: a refusal statement, or output that parses with every
// guarded write fenced (and checking its lock domain, at the top level),
// probes where they belong and nothing else changed.
func FuzzRewrite(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join(caseDir, "*.txt"))
	for i, p := range paths {
		c, err := loadCase(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(c.input, c.mode == Prepared, uint8(i))
	}
	var rs, ds [256]*Rewriter
	for i := range rs {
		rs[i] = fuzzRewriter(f, uint8(i))
		ds[i] = fuzzRewriterIn(f, uint8(i), fuzzDomains)
	}
	f.Fuzz(func(t *testing.T, sql string, prepared bool, cfg uint8) {
		rewriteAndVerify(t, sql, prepared, rs[cfg], ds[cfg])
	})
}

// rewriteAndVerify rewrites sql with each rewriter, with and without a
// session, and fails on an error or on output the verifier rejects.
func rewriteAndVerify(t *testing.T, sql string, prepared bool, rws ...*Rewriter) {
	t.Helper()
	mode := Simple
	if prepared {
		mode = Prepared
	}
	for _, r := range rws {
		for _, s := range []Session{nil, fuzzSession} {
			res, err := r.Rewrite(sql, mode, s)
			if err != nil {
				t.Fatalf("Rewrite(%q): %v", sql, err)
			}
			if err := verify(r, sql, mode, s, res); err != nil {
				t.Fatalf("Rewrite(%q) with domains %v: %v", sql, r.domains != nil, err)
			}
		}
	}
}

// FuzzMayWrite checks that the prefilters never miss a keyword the scanner
// finds (MayWrite a write keyword, MayInvalidate DEALLOCATE or DISCARD),
// and that Rewrite passes a text MayWrite clears unchanged.
func FuzzMayWrite(f *testing.F) {
	for _, s := range []string{
		"SELECT * FROM accounts WHERE id = 1",
		"UPDATE accounts SET v = 1",
		"select 'x' || $$update$$ from t /* insert */",
		"Copy t to stdout",
		"SELECT U&\"d\\0065lete\" FROM accounts",
		"EXECUTE q",
		"SELECT updated_at FROM accounts;DISCARD ALL",
		"SELECT 1deallocate",
	} {
		f.Add(s)
	}
	r := fuzzRewriter(f, 0)
	f.Fuzz(func(t *testing.T, sql string) {
		scan, err := pg_query.Scan(sql)
		if err == nil && !MayInvalidate(sql) {
			for _, tok := range scan.Tokens {
				if tok.Token == pg_query.Token_DEALLOCATE || tok.Token == pg_query.Token_DISCARD ||
					tok.Token == pg_query.Token_IDENT && strings.EqualFold(strings.Trim(sql[tok.Start:tok.End], `"`), "search_path") {
					t.Fatalf("MayInvalidate(%q) = false, but the scanner finds %v", sql, tok.Token)
				}
			}
		}
		if MayWrite(sql) {
			return
		}
		if err == nil && hasWriteKeyword(scan.Tokens) {
			t.Fatalf("MayWrite(%q) = false, but the scanner finds a write keyword", sql)
		}
		for _, s := range []Session{nil, fuzzSession} {
			res, err := r.Rewrite(sql, Simple, s)
			if err != nil || res.SQL != sql || res.Refusal != nil || len(res.Probes) > 0 {
				t.Fatalf("Rewrite(%q) = %+v, %v; want it unchanged", sql, res, err)
			}
		}
	})
}
