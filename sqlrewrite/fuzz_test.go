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

// fuzzBackstops gives the fuzzing guards the database backstop: all but
// public.orders, so that statements mix forms the backstop fences with
// writes fenced in the text.
var fuzzBackstops = []bool{true, false, true, true}

// fuzzRewriterIn is fuzzRewriter with the guards in the lock domains
// given, in guard order (nil: none).
func fuzzRewriterIn(t testing.TB, cfg uint8, domains []string) *Rewriter {
	return fuzzRewriterWith(t, cfg, domains, nil)
}

// fuzzRewriterWith is fuzzRewriterIn with the guards' Backstop given, in
// guard order (nil: none).
func fuzzRewriterWith(t testing.TB, cfg uint8, domains []string, backstops []bool) *Rewriter {
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
		if backstops != nil {
			g.Backstop = backstops[i]
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
// lock domains, with and without the database backstop), that Rewrite does not panic or fail, and that its result
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
	for i, s := range backstopSeeds() {
		// Enforce, all Shadow (with lock domains), and mixed rollouts with
		// Allow switches.
		f.Add(s, i%2 == 0, []uint8{0, 0x15, 0xc6}[i%3])
	}
	var rs, ds, bs [256]*Rewriter
	for i := range rs {
		rs[i] = fuzzRewriter(f, uint8(i))
		ds[i] = fuzzRewriterIn(f, uint8(i), fuzzDomains)
		bs[i] = fuzzRewriterWith(f, uint8(i), [][]string{nil, fuzzDomains}[i%2], fuzzBackstops) // lock domains for odd cfg
	}
	f.Fuzz(func(t *testing.T, sql string, prepared bool, cfg uint8) {
		rewriteAndVerify(t, sql, prepared, rs[cfg], ds[cfg], bs[cfg])
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

// FuzzMayWrite checks that the prefilters never miss what the scanner
// finds (MayWrite a write keyword, MayInvalidate what invalidating finds),
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
		"BEGIN; SET LOCAL ROLE r",
		"select pg_catalog.set_config('role', 'r', true)",
		"ROLLBACK TO SAVEPOINT s",
		"COMMIT AND CHAIN",
		"/* c */ SET ROLE r",
	} {
		f.Add(s)
	}
	r := fuzzRewriter(f, 0)
	f.Fuzz(func(t *testing.T, sql string) {
		scan, err := pg_query.Scan(sql)
		if err == nil && !MayInvalidate(sql) {
			if what := invalidating(sql, scan.Tokens); what != "" {
				t.Fatalf("MayInvalidate(%q) = false, but the scanner finds %s", sql, what)
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

// invalidating names what in tokens of sql MayInvalidate must see, "" if
// nothing: DEALLOCATE, DISCARD or search_path anywhere; a statement that
// starts SET or RESET and names the role, RESET ALL, ROLLBACK ... TO, or
// COMMIT (END, ABORT, ROLLBACK) AND CHAIN; set_config( with anything but
// a plain string naming another setting first.
func invalidating(sql string, tokens []*pg_query.ScanToken) string {
	text := func(tok *pg_query.ScanToken) string { return sql[tok.Start:tok.End] }
	var first pg_query.Token
	start := true
	for i, tok := range tokens {
		if start {
			first, start = tok.Token, false
		}
		switch tok.Token {
		case pg_query.Token_ASCII_59:
			start = true
		case pg_query.Token_DEALLOCATE, pg_query.Token_DISCARD:
			return tok.Token.String()
		case pg_query.Token_IDENT:
			name := strings.ToLower(strings.Trim(text(tok), `"`))
			if name == "search_path" {
				return "search_path"
			}
			if name == "set_config" && i+2 < len(tokens) && tokens[i+1].Token == pg_query.Token_ASCII_40 {
				arg := tokens[i+2]
				if arg.Token != pg_query.Token_SCONST || !strings.HasPrefix(text(arg), "'") {
					return "set_config of a setting it cannot name"
				}
				if v := strings.ToLower(strings.Trim(text(arg), "'")); v == "role" || v == "session_authorization" {
					return "set_config of " + v
				}
			}
		case pg_query.Token_ROLE, pg_query.Token_AUTHORIZATION:
			if first == pg_query.Token_SET || first == pg_query.Token_RESET {
				return "a SET or RESET of the role"
			}
		case pg_query.Token_ALL:
			if first == pg_query.Token_RESET && tokens[i-1].Token == pg_query.Token_RESET {
				return "RESET ALL"
			}
		case pg_query.Token_TO:
			if first == pg_query.Token_ROLLBACK {
				return "ROLLBACK TO"
			}
		case pg_query.Token_CHAIN:
			switch first {
			case pg_query.Token_COMMIT, pg_query.Token_END_P, pg_query.Token_ABORT_P, pg_query.Token_ROLLBACK:
				return "AND CHAIN"
			}
		}
	}
	return ""
}
