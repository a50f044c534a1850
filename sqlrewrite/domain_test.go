package sqlrewrite

import (
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

func TestDomainValidation(t *testing.T) {
	ok := []string{"", "billing", "_x", "a1_b2", strings.Repeat("d", MaxDomainLen)}
	for _, d := range ok {
		if _, err := New(Config{Guards: []Guard{{Table: "t", Column: "e", Domain: d}}, TokenSetting: "fence.token"}); err != nil {
			t.Errorf("domain %q: %v", d, err)
		}
	}
	bad := []string{"Billing", "1billing", "bill-ing", "bill ing", "billing.eu", "bil'ling", "é", "a\x00", strings.Repeat("d", MaxDomainLen+1)}
	for _, d := range bad {
		_, err := New(Config{Guards: []Guard{{Table: "t", Column: "e", Domain: d}}, TokenSetting: "fence.token"})
		if err == nil || !strings.Contains(err.Error(), "lock domain") || !strings.Contains(err.Error(), `"t"`) {
			t.Errorf("domain %q: err = %v", d, err)
		}
	}
}

func TestDomainSQL(t *testing.T) {
	if DomainTable != "pgfence.domains" {
		t.Errorf("DomainTable = %q", DomainTable)
	}
	const ddl = "CREATE SCHEMA IF NOT EXISTS pgfence; CREATE TABLE IF NOT EXISTS pgfence.domains (domain text PRIMARY KEY, token bigint NOT NULL)"
	const row = "INSERT INTO pgfence.domains (domain, token) VALUES ($1, -9223372036854775808) ON CONFLICT (domain) DO NOTHING"
	if DomainTableDDL() != ddl || DomainRowSQL() != row {
		t.Errorf("DDL %q, row SQL %q", DomainTableDDL(), DomainRowSQL())
	}
	for _, sql := range []string{ddl, row} {
		if n, err := countStmts(sql); err != nil || n != strings.Count(sql, ";")+1 {
			t.Errorf("%q: %d statements, %v", sql, n, err)
		}
	}
}

// TestDomainFragments checks every fragment a lock domain adds: it parses,
// and each operator in it is schema-qualified (the only bare '=' being the
// SET of the domain's token).
func TestDomainFragments(t *testing.T) {
	g := []Guard{{Table: "accounts", Column: "fence_epoch", Domain: "billing"},
		{Table: "orders", Column: "v", Domain: "billing", AllowMissingToken: true},
		{Table: "ledger", Column: "e", Domain: "gl", Rollout: Shadow}}
	r, err := New(Config{Guards: g, TokenSetting: "App.Token"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.domains) != 2 || r.domains[0].name != "billing" || r.domains[1].name != "gl" || r.guards[0].domain != r.guards[1].domain {
		t.Fatalf("domains %+v", r.domains)
	}
	if r.guards[2].domainFenced() || r.guards[2].dflag != "" || !strings.Contains(r.guards[2].tok, "App.Token.gl") {
		t.Errorf("a Shadow guard is fenced by its domain, or does not read the domain's setting: %+v", r.guards[2])
	}
	var frags []string
	for _, d := range r.domains {
		frags = append(frags, "WITH "+d.query+" SELECT", "SELECT "+d.exists)
	}
	for _, gi := range r.guards[:2] {
		frags = append(frags, "SELECT "+gi.insert, "SELECT "+gi.domainRaise("t"), "SELECT "+gi.tok)
	}
	frags = append(frags, "SELECT "+r.guards[0].cast, "SELECT "+r.guards[0].gate)
	for _, f := range frags {
		if _, err := pg_query.Parse(f); err != nil {
			t.Errorf("%v:\n%s", err, f)
			continue
		}
		scan, _ := pg_query.Scan(f)
		toks := scan.Tokens
		for i, tk := range toks {
			switch tk.Token {
			case pg_query.Token_Op, pg_query.Token_ASCII_61, pg_query.Token_ASCII_60, pg_query.Token_ASCII_62,
				pg_query.Token_LESS_EQUALS, pg_query.Token_GREATER_EQUALS, pg_query.Token_NOT_EQUALS, pg_query.Token_ASCII_43, pg_query.Token_ASCII_45:
			default:
				continue
			}
			qualified := i >= 4 && toks[i-4].Token == pg_query.Token_OPERATOR && f[toks[i-2].Start:toks[i-2].End] == "pg_catalog"
			set := i >= 2 && toks[i-2].Token == pg_query.Token_SET && f[toks[i-1].Start:toks[i-1].End] == `"token"`
			if !qualified && !set {
				t.Errorf("bare operator %q at byte %d of:\n%s", f[tk.Start:tk.End], tk.Start, f)
			}
		}
	}
	// The claim reads the domain's own setting first, then the general one,
	// and raises nothing of its own: the writes check the token first.
	for _, want := range []string{
		`SET "token" = COALESCE(NULLIF(pg_catalog.current_setting(E'App.Token.billing', true), E''), pg_catalog.current_setting(E'App.Token', true))::pg_catalog.int8`,
		`pg_catalog.int8le("token", (CASE WHEN NULLIF(pg_catalog.current_setting(E'App.Token.billing', true), E'') IS NULL THEN`,
	} {
		if !strings.Contains(r.domains[0].query, want) {
			t.Errorf("the claim lacks %q:\n%s", want, r.domains[0].query)
		}
	}
	if strings.Contains(r.domains[0].query, "pgfence 55000") || strings.Contains(r.domains[0].query, "pgfence 22023") {
		t.Errorf("the claim raises an error of its own:\n%s", r.domains[0].query)
	}
	for _, tok := range []string{r.guards[0].tok, r.guards[0].gate} {
		if !strings.Contains(tok, `guarded table "accounts" in lock domain "billing"; set App.Token.billing or App.Token first`) ||
			!strings.Contains(tok, `App.Token.billing or App.Token must be an integer fencing token for a write to guarded table "accounts" in lock domain "billing", got: `) {
			t.Errorf("TOK or GATE of a domain table:\n%s", tok)
		}
	}
	if cast := r.guards[0].cast; !strings.HasPrefix(cast, `COALESCE(NULLIF(pg_catalog.current_setting(E'App.Token.billing', true), E''), `) {
		t.Errorf("TOKC of a domain table:\n%s", cast)
	}
}

func TestDomainMarkers(t *testing.T) {
	const pre = `invalid input syntax for type bigint: "`
	cases := []struct{ msg, code, text, hint string }{
		{`pgfence PF001: stale fencing token for lock domain "billing" (guarded table "accounts"): a newer holder has written to it; stop writing and re-acquire the lock; token: 4; newer token: 7"`,
			"PF001", `pgfence: stale fencing token for lock domain "billing" (guarded table "accounts"): a newer holder has written to it; stop writing and re-acquire the lock; token: 4; newer token: 7`, hintStaleDomain},
		{`pgfence 55000: no fencing token is set for this write to guarded table "accounts" in lock domain "billing"; set fence.token.billing or fence.token first"`,
			"55000", `pgfence: no fencing token is set for this write to guarded table "accounts" in lock domain "billing"; set fence.token.billing or fence.token first`,
			"SET fence.token.billing (or fence.token) = '<token>' (or SET LOCAL inside a transaction) before writing"},
		{`pgfence 55000: no fencing token is set for this write to lock domain "billing"; set fence.token.billing or fence.token first"`,
			"55000", `pgfence: no fencing token is set for this write to lock domain "billing"; set fence.token.billing or fence.token first`,
			"SET fence.token.billing (or fence.token) = '<token>' (or SET LOCAL inside a transaction) before writing"},
		{`pgfence 22023: fence.token.billing or fence.token must be an integer fencing token for a write to lock domain "billing", got: x"`,
			"22023", `pgfence: fence.token.billing or fence.token must be an integer fencing token for a write to lock domain "billing", got: x`,
			"the token must be a whole number, e.g. SET fence.token.billing (or fence.token) = '42'"},
		{`pgfence 42939: WITH query name "pgfence_domain_0" is reserved for pgfence in a statement that writes a lock domain"`,
			"42939", `pgfence: WITH query name "pgfence_domain_0" is reserved for pgfence in a statement that writes a lock domain`, hintReservedName},
	}
	for _, c := range cases {
		got, ok := ParseErrorMarker("22P02", pre+c.msg)
		if !ok || got != (Refusal{c.code, c.text, c.hint}) {
			t.Errorf("ParseErrorMarker(%q) = %+v, %v", c.msg, got, ok)
		}
	}
	if tok, newer, ok := StaleDomainTokens(cases[0].text); !ok || tok != "4" || newer != "7" {
		t.Errorf("StaleDomainTokens = %q, %q, %v; want 4, 7", tok, newer, ok)
	}
	if _, _, ok := StaleDomainTokens(cases[1].text); ok {
		t.Errorf("StaleDomainTokens read tokens from a 55000 message")
	}
}

// TestProbeOutcome reads probe rows as the probe's SQL lays them out.
func TestProbeOutcome(t *testing.T) {
	p := &Probe{Tables: []ProbeTable{{Table: "a"}, {Table: "b", Domain: "d"}, {Table: "c", Domain: "d"}}}
	b := func(s ...string) [][]byte {
		out := make([][]byte, len(s))
		for i, v := range s {
			if v != "NULL" {
				out[i] = []byte(v)
			}
		}
		return out
	}
	const tag = "2026-11-28 07:11:50.357123+00"
	row := b("5", tag, tag+":9", "NULL", "NULL", "", tag+":12", "6", tag+":?", "", "NULL", "x", "y")
	want := []struct {
		token, winner string
		stale         Stale
	}{{"5", "9", StaleRow}, {"6", "12", StaleDomain}, {"5", "", StaleRow}}
	for i, w := range want {
		o, ok := p.Outcome(row, i)
		if !ok || string(o.Token) != w.token || string(o.Winner) != w.winner || o.Stale != w.stale {
			t.Errorf("table %d: %q %q %v %v, want %+v", i, o.Token, o.Winner, o.Stale, ok, w)
		}
	}
	if _, ok := p.Outcome(row[:10], 2); ok {
		t.Error("a short row was read")
	}
	if o, _ := p.Outcome(b("5", tag, "", "NULL", "", "", "NULL", "", "", "NULL", ""), 1); o.Stale != NotStale || string(o.Token) != "5" {
		t.Errorf("fresh write: %+v", o)
	}
	// A flag that does not hold the probe's own transaction's tag was not
	// raised by the write: a client set it (in an earlier transaction, or
	// to a value of its own).
	for _, flag := range []string{"9", "2026-11-28 07:11:50.357122+00:9", tag, tag + "9", ":" + tag + ":9", "x" + tag + ":9"} {
		for i, r := range [][][]byte{b("5", tag, flag, "NULL", "NULL"), b("5", tag, "", flag, "7")} {
			if o, ok := (&Probe{Tables: []ProbeTable{{Table: "a"}}}).Outcome(r, 0); !ok || o.Stale != NotStale {
				t.Errorf("flag %d set to %q: %+v, want the write counted as not stale", i, flag, o)
			}
		}
	}
	if o, _ := (&Probe{Tables: []ProbeTable{{Table: "a"}}}).Outcome(b("5", "", ":9", "NULL", "NULL"), 0); o.Stale != NotStale {
		t.Errorf("no tag: %+v", o)
	}
}

// TestDomainProbe checks the probe's layout: the token, then per table its
// row flag and its domain flag, then the clearing columns.
func TestDomainProbe(t *testing.T) {
	g := []Guard{{Table: "accounts", Column: "e", Domain: "billing"}, {Table: "audit", Column: "e"},
		{Table: "obs", Column: "e", Domain: "billing", Rollout: Observe}}
	r, err := New(Config{Guards: g, TokenSetting: "fence.token"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Rewrite("WITH a AS (DELETE FROM audit RETURNING 1), o AS (DELETE FROM obs RETURNING 1) UPDATE accounts SET x = 1", Prepared, nil)
	if err != nil || res.Refusal != nil {
		t.Fatalf("Rewrite: %v %+v", err, res.Refusal)
	}
	billing := "COALESCE(NULLIF(pg_catalog.current_setting(E'fence.token.billing', true), E''), pg_catalog.current_setting(E'fence.token', true))"
	want := "SELECT pg_catalog.current_setting(E'fence.token', true), " + flagTag + ", " +
		"pg_catalog.current_setting(E'pgfence.stale_1', true), NULL::pg_catalog.text, NULL::pg_catalog.text, " +
		"NULL::pg_catalog.text, NULL::pg_catalog.text, " + billing + ", " +
		"pg_catalog.current_setting(E'pgfence.stale_0', true), pg_catalog.current_setting(E'pgfence.dstale_0', true), " + billing + ", " +
		"pg_catalog.set_config(E'pgfence.stale_1', E'', true), pg_catalog.set_config(E'pgfence.stale_0', E'', true), pg_catalog.set_config(E'pgfence.dstale_0', E'', true)"
	if len(res.Probes) != 1 || res.Probes[0].SQL != want {
		t.Fatalf("Probes = %+v", res.Probes)
	}
	wantTables := []ProbeTable{{"audit", Enforce, "", 1}, {"obs", Observe, "billing", 2}, {"accounts", Enforce, "billing", 0}}
	for i, pt := range res.Probes[0].Tables {
		if pt != wantTables[i] {
			t.Errorf("table %d = %+v, want %+v", i, pt, wantTables[i])
		}
	}
	if _, err := pg_query.Parse(want); err != nil {
		t.Error(err)
	}
}

// RefusedTable reads back the table pgfence's own messages name.
func TestRefusedTable(t *testing.T) {
	for msg, want := range map[string]string{
		`pgfence: no fencing token is set for this write to guarded table "accounts"; set fence.token first`:                                                                                  "accounts",
		`pgfence: no fencing token is set for this write to guarded table "public.accounts" in lock domain "billing"; set fence.token.billing or fence.token first`:                           "public.accounts",
		`pgfence: stale fencing token for lock domain "billing" (guarded table "accounts"): a newer holder has written to it; stop writing and re-acquire the lock; token: 4; newer token: 7`: "accounts",
		`pgfence: no fencing token is set for this write to lock domain "billing"; set fence.token.billing or fence.token first`:                                                              "",
	} {
		if got := RefusedTable(msg); got != want {
			t.Errorf("RefusedTable(%q) = %q, want %q", msg, got, want)
		}
	}
}

// The table names RefusedTable reads back are the ones the rewriter puts in
// its refusals, quoted names included.
func TestRefusedTableFromRefusals(t *testing.T) {
	for _, spec := range []string{"accounts", "public.accounts", `"Odd"".Name"`} {
		g, err := ParseGuard(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, domain := range []string{"", "billing"} {
			g.Domain = domain
			r, err := New(Config{Guards: []Guard{g}, TokenSetting: "fence.token"})
			if err != nil {
				t.Fatal(err)
			}
			gi := &r.guards[0]
			for _, msg := range []string{forgedEpoch(gi).Message, noColumnList(gi).Message, positioned("UPDATE", gi).Message,
				"pgfence: no fencing token is set for this write to " + tableSubject(gi.name, domain) + "; set fence.token first"} {
				if got := RefusedTable(msg); got != g.Name() {
					t.Errorf("RefusedTable(%q) = %q, want %q", msg, got, g.Name())
				}
			}
		}
	}
}
