package sqlrewrite

import (
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// conflictBranch spells out, independently of tokenConflict, the branch
// every expression reading a lock domain's token starts its CASE with:
// the token text (text: v, or the expression itself) differs from the
// general setting, which is set, exactly when both settings are set, to
// different tokens; that raises 22023 naming them, their values and
// subject.
func conflictBranch(setting, domain, subject, text string) string {
	g := "pg_catalog.current_setting(" + quoteLiteral(setting) + ", true)"
	return " WHEN " + text + " OPERATOR(pg_catalog.<>) " + g + " AND " + g + " OPERATOR(pg_catalog.<>) E''" +
		" THEN pg_catalog.format(" + quoteLiteral("pgfence 22023: both "+setting+"."+domain+" and "+setting+
		" are set, to different tokens (%L and %L), for a write to "+strings.ReplaceAll(subject, "%", "%%")) +
		", " + text + ", " + g + ")::pg_catalog.int8"
}

// TestTokenPrecedenceExprs checks that every token expression of a table in
// a lock domain, and of the domain's own check, fails first when the
// domain's setting and the general one are set to different tokens, naming
// the real setting names; that TOKC, which GATE has already checked, and
// every expression outside a lock domain are as before.
func TestTokenPrecedenceExprs(t *testing.T) {
	const tbl = `guarded table "accounts" in lock domain "billing"`
	const dom = `lock domain "billing"`
	for _, setting := range []string{"fence.token", "App.Lease"} {
		strict, allowMissing, lenient := tokenExprs(setting, "accounts", "billing")
		cast, gate := strictCheck(setting, "accounts", "billing")
		text := tokenText(setting, "billing")
		cases := []struct {
			name, got, prefix string
		}{
			{"TOK", strict, "(SELECT CASE" + conflictBranch(setting, "billing", tbl, "v") + " WHEN v OPERATOR(pg_catalog.~) "},
			{"TOKA", allowMissing, "(SELECT CASE" + conflictBranch(setting, "billing", tbl, "v") + " WHEN v OPERATOR(pg_catalog.~) "},
			// TOKL names no table: the same for every table of the domain.
			{"TOKL", lenient, "(SELECT CASE" + conflictBranch(setting, "billing", dom, "v") + " WHEN v OPERATOR(pg_catalog.~) "},
			{"GATE", gate, "CASE" + conflictBranch(setting, "billing", tbl, text) + " WHEN coalesce(" + text + ", E'') OPERATOR(pg_catalog.=) E'' THEN "},
		}
		for _, c := range cases {
			if !strings.HasPrefix(c.got, c.prefix) {
				t.Errorf("%s with %s does not check the settings' precedence first:\n%s\nwant prefix:\n%s", c.name, setting, c.got, c.prefix)
			}
			// The token itself is still read once, from tokenText.
			if c.name != "GATE" && !strings.HasSuffix(c.got, " END FROM "+text+" AS pgfence_token(v))") {
				t.Errorf("%s with %s does not read the token text once:\n%s", c.name, setting, c.got)
			}
			if n := strings.Count(c.got, "are set, to different tokens"); n != 1 {
				t.Errorf("%s with %s checks the precedence %d times", c.name, setting, n)
			}
			if _, err := pg_query.Parse("SELECT " + c.got); err != nil {
				t.Errorf("%s with %s does not parse: %v", c.name, setting, err)
			}
			if strings.Count(c.got, "OPERATOR(") != strings.Count(c.got, "OPERATOR(pg_catalog.") {
				t.Errorf("%s with %s has an operator that is not schema-qualified", c.name, setting)
			}
		}
		// TOKC only runs after GATE has checked.
		if cast != text+"::pg_catalog.int8" {
			t.Errorf("TOKC with %s = %s", setting, cast)
		}
		if _, _, lenient2 := tokenExprs(setting, "ledger", "billing"); lenient2 != lenient {
			t.Errorf("TOKL with %s depends on the table", setting)
		}
		// The error is formatted: a % in a table's name is no placeholder.
		odd, _, _ := tokenExprs(setting, `50%s"`, "billing")
		if !strings.Contains(odd, `, to different tokens (%L and %L), for a write to guarded table "50%%s"" in lock domain "billing"', v, `) {
			t.Errorf("TOK with %s of a table named with %%:\n%s", setting, odd)
		}
	}
	// Outside a lock domain nothing reads a per-domain setting or checks
	// the precedence.
	strict, allowMissing, lenient := tokenExprs("fence.token", "accounts", "")
	cast, gate := strictCheck("fence.token", "accounts", "")
	for _, e := range []string{strict, allowMissing, lenient, cast, gate} {
		if strings.Contains(e, "different tokens") || strings.Contains(e, "fence.token.") {
			t.Errorf("an expression outside a lock domain checks the precedence:\n%s", e)
		}
	}
	if tokenConflict("fence.token", "", "x", "v") != "" {
		t.Error("tokenConflict outside a lock domain")
	}
}

// TestTokenPrecedenceRewrite checks, through Rewrite, which statements
// carry the check: every write to a domain's table (Enforce, allow-missing
// or Shadow), and none to a table without a domain.
func TestTokenPrecedenceRewrite(t *testing.T) {
	const marker = "are set, to different tokens ("
	guards := []Guard{
		{Table: "accounts", Column: "fence_epoch", Domain: "billing"},
		{Table: "orders", Column: "fence_epoch", Domain: "billing", AllowMissingToken: true},
		{Table: "ledger", Column: "fence_epoch", Domain: "gl", Rollout: Shadow},
		{Table: "audit", Column: "fence_epoch"},
		{Table: "notes", Column: "fence_epoch", Domain: "billing", Rollout: Observe},
	}
	r, err := New(Config{Guards: guards, TokenSetting: "fence.token"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		sql     string
		checked []string // the settings whose precedence the output checks, "" for none
	}{
		{"UPDATE accounts SET x = 1 WHERE id = 1", []string{"fence.token.billing"}},
		{"DELETE FROM accounts", []string{"fence.token.billing"}},
		{"INSERT INTO accounts (id) VALUES (1)", []string{"fence.token.billing"}},
		{"INSERT INTO accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET x = 2", []string{"fence.token.billing"}},
		{"UPDATE orders SET x = 1 WHERE id = 1", []string{"fence.token.billing"}},
		{"INSERT INTO orders (id) VALUES (1)", []string{"fence.token.billing"}},
		{"UPDATE ledger SET x = 1 WHERE id = 1", []string{"fence.token.gl"}},
		{"INSERT INTO ledger (id) VALUES (1)", []string{"fence.token.gl"}},
		{"UPDATE audit SET x = 1 WHERE id = 1", nil},
		{"INSERT INTO audit (id) VALUES (1)", nil},
		{"UPDATE notes SET x = 1 WHERE id = 1", nil},
		{"WITH a AS (DELETE FROM audit RETURNING id) UPDATE ledger SET x = 1 WHERE id IN (SELECT id FROM a)", []string{"fence.token.gl"}},
	}
	for _, c := range cases {
		res, err := r.Rewrite(c.sql, Prepared, nil)
		if err != nil || res.Refusal != nil {
			t.Fatalf("%s: %v %+v", c.sql, err, res.Refusal)
		}
		var got []string
		for _, d := range []string{"fence.token.billing", "fence.token.gl"} {
			if strings.Contains(res.SQL, "E'pgfence 22023: both "+d+" and fence.token "+marker) {
				got = append(got, d)
			}
		}
		if strings.Join(got, ",") != strings.Join(c.checked, ",") {
			t.Errorf("%s: checks the precedence of %q, want %q:\n%s", c.sql, got, c.checked, res.SQL)
		}
	}
}

// TestTokenConflictHint checks the hint of the precedence error, from the
// error Postgres raises for its marker.
func TestTokenConflictHint(t *testing.T) {
	const pre = `invalid input syntax for type bigint: "`
	cases := []struct{ marker, hint string }{
		{`pgfence 22023: both fence.token.billing and fence.token are set, to different tokens ('50' and '40'), for a write to guarded table "accounts" in lock domain "billing""`,
			"a per-domain token left over from another lease must not override the one you set: RESET the setting of the lease you do not hold (RESET fence.token.billing), or set both to the same token"},
		{`pgfence 22023: both App.Lease.gl and App.Lease are set, to different tokens ('x'' and ''y' and E'\\'), for a write to lock domain "gl""`,
			"a per-domain token left over from another lease must not override the one you set: RESET the setting of the lease you do not hold (RESET App.Lease.gl), or set both to the same token"},
		// Not the precedence error.
		{`pgfence 22023: fence.token.billing or fence.token must be an integer fencing token for a write to lock domain "billing", got: both a and b are set, to different tokens ("`, ""},
		{`pgfence 22023: fence.token must be an integer fencing token for a write to guarded table "accounts", got: x"`, ""},
		{`pgfence 22023: both fence.token.billing and other.token are set, to different tokens ('1' and '2'), for a write to x"`, ""},
		{`pgfence 22023: both x and fence.token are set, to different tokens ('1' and '2'), for a write to x"`, ""},
	}
	for _, c := range cases {
		r, ok := ParseErrorMarker("22P02", pre+c.marker)
		if !ok || r.Code != "22023" {
			t.Fatalf("ParseErrorMarker(%q) = %+v, %v", c.marker, r, ok)
		}
		hint, ok := TokenConflictHint(r.Message)
		if hint != c.hint || ok != (c.hint != "") {
			t.Errorf("TokenConflictHint(%q) = %q, %v; want %q", r.Message, hint, ok, c.hint)
		}
	}
}
