package sqlrewrite

import (
	"strings"
	"testing"
)

// backstopRewriter guards accounts, its partition public.accounts_2024
// (the proxy guards partitions as tables of their own, with the parent's
// policy) and public.orders, all with rollout ro. accounts and its
// partition have Backstop set to backstop; orders never has it, and its
// lock domain is ordersDomain ("" for none).
func backstopRewriter(t *testing.T, ro Rollout, backstop bool, ordersDomain string, allow Allow) *Rewriter {
	t.Helper()
	var gs []Guard
	for _, spec := range []string{"accounts", "public.accounts_2024", "public.orders"} {
		g, err := ParseGuard(spec)
		if err != nil {
			t.Fatal(err)
		}
		g.Rollout = ro
		if g.Table == "orders" {
			g.Domain = ordersDomain
		} else {
			g.Backstop = backstop
		}
		gs = append(gs, g)
	}
	r, err := New(Config{Guards: gs, TokenSetting: "fence.token", Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// backstopForms are statements whose only guarded write is a form the
// rewriter cannot fence: refused without the backstop, passed unchanged
// (bar the probe) with it.
var backstopForms = []struct {
	sql    string
	table  string // Fenced.Table
	kind   string // Fenced.Kind
	nested bool
	probe  bool // a probe follows (not after EXPLAIN without ANALYZE or PREPARE)
}{
	// MERGE
	{"MERGE INTO accounts a USING incoming i ON a.id = i.id WHEN MATCHED THEN UPDATE SET balance = i.balance", "accounts", "MERGE", false, true},
	{"MERGE INTO accounts a USING incoming i ON a.id = i.id WHEN MATCHED AND i.closed THEN DELETE", "accounts", "MERGE", false, true},
	{"MERGE INTO accounts USING incoming i ON accounts.id = i.id WHEN NOT MATCHED THEN INSERT (id, balance) VALUES (i.id, i.balance)", "accounts", "MERGE", false, true},
	{"MERGE INTO accounts USING incoming i ON accounts.id = i.id WHEN NOT MATCHED THEN INSERT VALUES (i.id, i.balance, 0)", "accounts", "MERGE", false, true},
	{"MERGE INTO accounts USING incoming i ON accounts.id = i.id WHEN NOT MATCHED THEN INSERT DEFAULT VALUES", "accounts", "MERGE", false, true},
	{"/* c */ MERGE INTO public.accounts AS a USING (SELECT id, sum(v) AS v FROM accounts GROUP BY id) s ON a.id = s.id\n" +
		"WHEN MATCHED AND s.v = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET (balance, note) = (s.v, 'x') " +
		"WHEN NOT MATCHED BY SOURCE THEN DO NOTHING WHEN NOT MATCHED THEN INSERT (id, balance) VALUES (s.id, s.v) RETURNING merge_action(), a.* -- t",
		"accounts", "MERGE", false, true},
	{"MERGE INTO accounts_2024 a USING incoming i ON a.id = i.id WHEN MATCHED THEN DELETE", "public.accounts_2024", "MERGE", false, true},
	{"WITH s AS (SELECT 1 AS id) MERGE INTO accounts a USING s ON a.id = s.id WHEN MATCHED THEN DELETE", "accounts", "MERGE", false, true},
	{"WITH m AS (MERGE INTO accounts a USING t ON a.id = t.id WHEN MATCHED THEN DELETE RETURNING a.id) SELECT * FROM m", "accounts", "MERGE", true, true},
	{"EXPLAIN ANALYZE MERGE INTO accounts a USING t ON true WHEN MATCHED THEN DELETE", "accounts", "MERGE", true, true},
	{"EXPLAIN MERGE INTO accounts a USING t ON true WHEN MATCHED THEN DELETE", "accounts", "MERGE", true, false},
	{"PREPARE m AS MERGE INTO accounts a USING t ON true WHEN MATCHED THEN DELETE", "accounts", "MERGE", true, false},
	// COPY ... FROM
	{"COPY accounts FROM STDIN", "accounts", "COPY FROM", false, true},
	{"COPY accounts (id, balance) FROM STDIN WITH (FORMAT csv)", "accounts", "COPY FROM", false, true},
	{"COPY accounts (id, balance, fence_epoch) FROM STDIN", "accounts", "COPY FROM", false, true},
	{"COPY public.accounts FROM '/tmp/accounts.csv' WHERE id > 0", "accounts", "COPY FROM", false, true},
	{`COPY "public"."accounts" FROM PROGRAM 'cat x'`, "accounts", "COPY FROM", false, true},
	{"COPY public.accounts_2024 (id) FROM STDIN", "public.accounts_2024", "COPY FROM", false, true},
	// WHERE CURRENT OF
	{"UPDATE accounts SET balance = 0 WHERE CURRENT OF c", "accounts", "CURRENT OF", false, true},
	{"DELETE FROM accounts WHERE CURRENT OF c", "accounts", "CURRENT OF", false, true},
	{"DELETE FROM public.accounts a WHERE CURRENT OF c RETURNING a.id", "accounts", "CURRENT OF", false, true},
	{"UPDATE accounts_2024 SET balance = 0 WHERE CURRENT OF c", "public.accounts_2024", "CURRENT OF", false, true},
	{"WITH u AS (UPDATE accounts SET x = 1 WHERE CURRENT OF c RETURNING 1) SELECT 1", "accounts", "CURRENT OF", true, true},
}

// TestBackstopForms checks that MERGE, COPY FROM and WHERE CURRENT OF on
// a guarded table are refused with 0A000 without the backstop and pass
// unrewritten with it, reported with Backstop set, in Enforce and Shadow
// and in both modes.
func TestBackstopForms(t *testing.T) {
	for _, ro := range []Rollout{Enforce, Shadow} {
		for _, backstop := range []bool{false, true} {
			r := backstopRewriter(t, ro, backstop, "", Allow{})
			for _, mode := range []Mode{Simple, Prepared} {
				for _, c := range backstopForms {
					res, err := r.Rewrite(c.sql, mode, nil)
					if err != nil {
						t.Fatalf("%s backstop=%v: Rewrite(%q): %v", ro, backstop, c.sql, err)
					}
					if err := verify(r, c.sql, mode, nil, res); err != nil {
						t.Errorf("%s backstop=%v: Rewrite(%q): %v", ro, backstop, c.sql, err)
					}
					if !backstop {
						if res.Refusal == nil || res.Refusal.Code != codeUnsupported {
							t.Errorf("%s: Rewrite(%q) = %q, refusal %+v; want it refused with 0A000", ro, c.sql, res.SQL, res.Refusal)
						}
						continue
					}
					if res.Refusal != nil {
						t.Errorf("%s backstop: Rewrite(%q) refused: %s", ro, c.sql, res.Refusal.Message)
						continue
					}
					// The output is the input; in Simple mode with the probe
					// after the statement's last token.
					out := res.SQL
					if mode == Simple && c.probe {
						if len(res.Probes) != 1 {
							t.Fatalf("%s backstop: Rewrite(%q): probes %+v", ro, c.sql, res.Probes)
						}
						probe := ";" + res.Probes[0].SQL
						if strings.Count(out, probe) != 1 {
							t.Errorf("%s backstop: Rewrite(%q) = %q: no probe", ro, c.sql, out)
						}
						out = strings.Replace(out, probe, "", 1)
					}
					if out != c.sql {
						t.Errorf("%s backstop: Rewrite(%q) = %q, want the input", ro, c.sql, res.SQL)
					}
					wantF := []Fenced{{Table: c.table, Kind: c.kind, Rollout: ro, Nested: c.nested, Backstop: true}}
					if len(res.Fenced) != 1 || res.Fenced[0] != wantF[0] {
						t.Errorf("%s backstop: Rewrite(%q).Fenced = %+v, want %+v", ro, c.sql, res.Fenced, wantF)
					}
				}
			}
		}
	}
}

// TestBackstopMixed checks statements where a form the backstop fences
// comes with writes the rewriter still fences in the text.
func TestBackstopMixed(t *testing.T) {
	cases := []struct {
		sql     string
		fenced  []Fenced // Rollout is filled in
		domain  string   // orders' lock domain
		suffix  string   // the output ends with it, untouched ("" for the input's last 40 bytes)
		changed bool     // the output differs from the input (besides the probe)
	}{
		{sql: "WITH o AS (UPDATE orders SET qty = 0 WHERE id = 1 RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE",
			fenced:  []Fenced{{Table: "public.orders", Kind: "UPDATE", Nested: true}, {Table: "accounts", Kind: "MERGE", Backstop: true}},
			suffix:  " RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE",
			changed: true},
		{sql: "WITH o AS (UPDATE orders SET qty = 0 WHERE id = 1 RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE",
			fenced:  []Fenced{{Table: "public.orders", Kind: "UPDATE", Nested: true}, {Table: "accounts", Kind: "MERGE", Backstop: true}},
			domain:  "billing",
			suffix:  " RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE",
			changed: true},
		{sql: "WITH o AS (INSERT INTO orders (id, qty) VALUES (1, 2) RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN NOT MATCHED THEN INSERT (id) VALUES (o.id)",
			fenced:  []Fenced{{Table: "public.orders", Kind: "INSERT", Nested: true}, {Table: "accounts", Kind: "MERGE", Backstop: true}},
			suffix:  " RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN NOT MATCHED THEN INSERT (id) VALUES (o.id)",
			changed: true},
		{sql: "WITH d AS (DELETE FROM accounts WHERE id = 1 RETURNING id) MERGE INTO accounts USING d ON accounts.id = d.id WHEN MATCHED THEN DELETE",
			fenced:  []Fenced{{Table: "accounts", Kind: "DELETE", Nested: true}, {Table: "accounts", Kind: "MERGE", Backstop: true}},
			suffix:  " RETURNING id) MERGE INTO accounts USING d ON accounts.id = d.id WHEN MATCHED THEN DELETE",
			changed: true},
		{sql: "MERGE INTO accounts a USING (SELECT * FROM orders WHERE qty > 0) o ON a.id = o.id WHEN MATCHED THEN UPDATE SET balance = o.qty",
			fenced: []Fenced{{Table: "accounts", Kind: "MERGE", Backstop: true}}},
		{sql: "UPDATE orders SET qty = 1 WHERE id = 2; COPY accounts FROM STDIN; DELETE FROM accounts WHERE CURRENT OF c",
			fenced: []Fenced{{Table: "public.orders", Kind: "UPDATE"}, {Table: "accounts", Kind: "COPY FROM", Backstop: true},
				{Table: "accounts", Kind: "CURRENT OF", Backstop: true}},
			suffix:  "; COPY accounts FROM STDIN;",
			changed: true},
	}
	for _, ro := range []Rollout{Enforce, Shadow} {
		for _, c := range cases {
			// Without the backstop on accounts, the statement is refused.
			res, err := backstopRewriter(t, ro, false, c.domain, Allow{}).Rewrite(c.sql, Prepared, nil)
			if err != nil || res.Refusal == nil || res.Refusal.Code != codeUnsupported {
				t.Errorf("%s: Rewrite(%q) without the backstop = %+v, %v; want 0A000", ro, c.sql, res, err)
			}
			r := backstopRewriter(t, ro, true, c.domain, Allow{})
			for _, mode := range []Mode{Simple, Prepared} {
				if mode == Prepared && strings.Count(c.sql, ";") > 0 {
					continue
				}
				res, err := r.Rewrite(c.sql, mode, nil)
				if err != nil {
					t.Fatal(err)
				}
				if res.Refusal != nil {
					t.Errorf("%s: Rewrite(%q) refused: %s", ro, c.sql, res.Refusal.Message)
					continue
				}
				if err := verify(r, c.sql, mode, nil, res); err != nil {
					t.Errorf("%s: Rewrite(%q): %v", ro, c.sql, err)
				}
				if len(res.Fenced) != len(c.fenced) {
					t.Errorf("%s: Rewrite(%q).Fenced = %+v, want %+v", ro, c.sql, res.Fenced, c.fenced)
					continue
				}
				for i, f := range c.fenced {
					f.Rollout = ro
					if res.Fenced[i] != f {
						t.Errorf("%s: Rewrite(%q).Fenced[%d] = %+v, want %+v", ro, c.sql, i, res.Fenced[i], f)
					}
				}
				out := res.SQL
				if mode == Simple && strings.Count(c.sql, ";") == 0 {
					out = strings.TrimSuffix(out, ";"+res.Probes[0].SQL)
				}
				if (out != c.sql) != c.changed {
					t.Errorf("%s: Rewrite(%q) = %q; changed should be %v", ro, c.sql, out, c.changed)
				}
				if c.suffix != "" && !strings.Contains(out, c.suffix) {
					t.Errorf("%s: Rewrite(%q) = %q, lost %q", ro, c.sql, out, c.suffix)
				}
				if c.domain != "" && ro == Enforce && !strings.HasPrefix(out, `WITH "pgfence_domain_0" AS (`) {
					t.Errorf("%s: Rewrite(%q) = %q: no lock domain check first in the MERGE's WITH", ro, c.sql, out)
				}
			}
		}
	}
}

// TestBackstopStillRefused checks what the backstop does not let through.
func TestBackstopStillRefused(t *testing.T) {
	cases := []struct {
		sql, code string
		allow     Allow
	}{
		// An assignment to the epoch column, in MERGE too.
		{"MERGE INTO accounts a USING t ON a.id = t.id WHEN MATCHED THEN UPDATE SET fence_epoch = 1", codeForgedEpoch, Allow{}},
		{"MERGE INTO accounts a USING t ON a.id = t.id WHEN MATCHED THEN UPDATE SET (v, fence_epoch) = (1, 2)", codeForgedEpoch, Allow{}},
		{"MERGE INTO accounts a USING t ON a.id = t.id WHEN NOT MATCHED THEN INSERT (id, fence_epoch) VALUES (1, 2)", codeForgedEpoch, Allow{}},
		{"UPDATE accounts SET fence_epoch = 1 WHERE CURRENT OF c", codeForgedEpoch, Allow{CurrentOf: true}},
		{"UPDATE accounts SET balance = 0, fence_epoch = 1 WHERE id = 1", codeForgedEpoch, Allow{}},
		// TRUNCATE fires no row trigger.
		{"TRUNCATE accounts", codeUnsupported, Allow{CopyFrom: true, CurrentOf: true}},
		// A write stored for later.
		{"CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC MERGE INTO accounts a USING t ON true WHEN MATCHED THEN DELETE; END", codeUnsupported, Allow{}},
		{"CREATE RULE r AS ON INSERT TO audit DO ALSO DELETE FROM accounts WHERE CURRENT OF c", codeUnsupported, Allow{CurrentOf: true}},
		// MERGE of a table without the backstop, besides one with it.
		{"MERGE INTO orders o USING t ON true WHEN MATCHED THEN DELETE", codeUnsupported, Allow{}},
		{"WITH m AS (MERGE INTO orders o USING t ON true WHEN MATCHED THEN DELETE RETURNING 1) MERGE INTO accounts a USING m ON true WHEN MATCHED THEN DELETE", codeUnsupported, Allow{}},
		{"COPY orders FROM STDIN", codeUnsupported, Allow{}},
		{"DELETE FROM orders WHERE CURRENT OF c", codeUnsupported, Allow{}},
	}
	for _, ro := range []Rollout{Enforce, Shadow} {
		for _, c := range cases {
			r := backstopRewriter(t, ro, true, "", c.allow)
			res, err := r.Rewrite(c.sql, Simple, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Refusal == nil || res.Refusal.Code != c.code {
				t.Errorf("%s: Rewrite(%q) = %q, refusal %+v; want %s", ro, c.sql, res.SQL, res.Refusal, c.code)
			}
		}
	}
}

// TestBackstopRefusalHint checks that a refused MERGE points to the
// backstop, and that the marker gives back the same hint.
func TestBackstopRefusalHint(t *testing.T) {
	for _, c := range []struct {
		domain, msg, hint string
	}{
		{"", `pgfence: MERGE on guarded table "public.orders" cannot be fenced yet`, "(pgfence serve does by default)"},
		{"billing", `pgfence: MERGE on guarded table "public.orders" cannot be fenced yet`, "(pgfence serve does by default)"},
	} {
		r := backstopRewriter(t, Enforce, true, c.domain, Allow{})
		res, err := r.Rewrite("MERGE INTO orders o USING t ON true WHEN MATCHED THEN DELETE", Simple, nil)
		if err != nil {
			t.Fatal(err)
		}
		ref := res.Refusal
		if ref == nil || ref.Message != c.msg || !strings.Contains(ref.Hint, c.hint) {
			t.Fatalf("refusal %+v, want %q with a hint mentioning %q", ref, c.msg, c.hint)
		}
		text := strings.TrimPrefix(ref.Message, "pgfence: ")
		back, ok := ParseErrorMarker("22P02", `invalid input syntax for type bigint: "pgfence 0A000: `+text+`"`)
		if !ok || back != *ref {
			t.Errorf("ParseErrorMarker gives %+v, want %+v", back, *ref)
		}
	}
}

// TestBackstopPrecedence checks the backstop against the other ways these
// forms pass: Observe (they pass anyway, not because of the backstop),
// Allow (the backstop wins: fenced by Postgres, not let through unfenced),
// a lock domain (the backstop claims it too) and an unqualified name that
// may be a table without the backstop (refused).
func TestBackstopPrecedence(t *testing.T) {
	merge := "MERGE INTO accounts a USING t ON true WHEN MATCHED THEN DELETE"
	copyFrom := "COPY accounts FROM STDIN"
	currentOf := "DELETE FROM accounts WHERE CURRENT OF c"
	newR := func(ro Rollout, domain string, allow Allow, guards ...string) *Rewriter {
		var gs []Guard
		for i, spec := range guards {
			g, err := ParseGuard(spec)
			if err != nil {
				t.Fatal(err)
			}
			g.Rollout, g.Domain, g.Backstop = ro, domain, i == 0
			gs = append(gs, g)
		}
		r, err := New(Config{Guards: gs, TokenSetting: "fence.token", Allow: allow})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	all := Allow{Truncate: true, CopyFrom: true, CurrentOf: true}
	for _, c := range []struct {
		name     string
		r        *Rewriter
		sql      string
		refused  bool
		backstop bool
	}{
		{"observe merge", newR(Observe, "", Allow{}, "accounts"), merge, false, false},
		{"observe copy", newR(Observe, "", Allow{}, "accounts"), copyFrom, false, false},
		{"observe current of", newR(Observe, "", Allow{}, "accounts"), currentOf, false, false},
		{"allowed copy", newR(Enforce, "", all, "accounts"), copyFrom, false, true},
		{"allowed current of", newR(Shadow, "", all, "accounts"), currentOf, false, true},
		{"allowed truncate", newR(Enforce, "", all, "accounts"), "TRUNCATE accounts", false, false},
		{"domain merge", newR(Enforce, "billing", Allow{}, "accounts"), merge, false, true},
		{"domain copy", newR(Enforce, "billing", Allow{}, "accounts"), copyFrom, false, true},
		{"domain copy allowed", newR(Enforce, "billing", all, "accounts"), copyFrom, false, true},
		{"domain current of", newR(Enforce, "billing", Allow{}, "accounts"), currentOf, false, true},
		{"shadow domain merge", newR(Shadow, "billing", Allow{}, "accounts"), merge, false, true},
		{"ambiguous merge", newR(Enforce, "", Allow{}, "public.accounts", "other.accounts"), merge, true, false},
		{"ambiguous copy allowed", newR(Enforce, "", all, "public.accounts", "other.accounts"), copyFrom, false, false},
		{"qualified merge", newR(Enforce, "", Allow{}, "public.accounts", "other.accounts"),
			"MERGE INTO public.accounts a USING t ON true WHEN MATCHED THEN DELETE", false, true},
		{"other qualified merge", newR(Enforce, "", Allow{}, "public.accounts", "other.accounts"),
			"MERGE INTO other.accounts a USING t ON true WHEN MATCHED THEN DELETE", true, false},
	} {
		res, err := c.r.Rewrite(c.sql, Prepared, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := verify(c.r, c.sql, Prepared, nil, res); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if (res.Refusal != nil) != c.refused {
			t.Errorf("%s: Rewrite(%q) refusal %+v, want refused %v", c.name, c.sql, res.Refusal, c.refused)
			continue
		}
		if c.refused {
			continue
		}
		if res.SQL != c.sql || len(res.Fenced) != 1 || res.Fenced[0].Backstop != c.backstop {
			t.Errorf("%s: Rewrite(%q) = %q, %+v; want it unchanged with Backstop %v", c.name, c.sql, res.SQL, res.Fenced, c.backstop)
		}
	}
}

// backstopSeeds seed FuzzRewrite with the statements above.
func backstopSeeds() []string {
	var out []string
	for _, c := range backstopForms {
		out = append(out, c.sql)
	}
	return append(out,
		"WITH o AS (UPDATE public.orders SET v = 1 WHERE id = 1 RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE",
		"WITH o AS (INSERT INTO billing.ledger (id) VALUES (1) RETURNING id) MERGE INTO ledger l USING o ON true WHEN NOT MATCHED THEN INSERT VALUES (1)",
		"COPY billing.ledger FROM STDIN; UPDATE ledger SET v = 1 WHERE CURRENT OF c; DELETE FROM accounts WHERE id = 1",
		"MERGE INTO accounts a USING t ON true WHEN MATCHED THEN UPDATE SET fence_epoch = 1",
		"MERGE INTO orders USING t ON true WHEN NOT MATCHED THEN INSERT (id, version) VALUES (1, 2)")
}
