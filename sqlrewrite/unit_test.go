package sqlrewrite

import (
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

func mustNew(t testing.TB, setting string, specs ...string) *Rewriter {
	t.Helper()
	cfg := Config{TokenSetting: setting}
	for _, s := range specs {
		g, err := ParseGuard(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Guards = append(cfg.Guards, g)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseGuard(t *testing.T) {
	ok := []struct {
		spec string
		want Guard
		name string
	}{
		{"accounts", Guard{Table: "accounts", Column: "fence_epoch"}, "accounts"},
		{"  Accounts  ", Guard{Table: "accounts", Column: "fence_epoch"}, "accounts"},
		{"public.accounts", Guard{Schema: "public", Table: "accounts", Column: "fence_epoch"}, "public.accounts"},
		{"Public.Accounts:Epoch", Guard{Schema: "public", Table: "accounts", Column: "epoch"}, "public.accounts"},
		{`"Accounts"`, Guard{Table: "Accounts", Column: "fence_epoch"}, `"Accounts"`},
		{`"odd ""name""":"my:col"`, Guard{Table: `odd "name"`, Column: "my:col"}, `"odd ""name"""`},
		{`"my.schema"."t.1":e`, Guard{Schema: "my.schema", Table: "t.1", Column: "e"}, `"my.schema"."t.1"`},
		{"user", Guard{Table: "user", Column: "fence_epoch"}, `"user"`}, // reserved keyword
		{"name", Guard{Table: "name", Column: "fence_epoch"}, "name"},   // unreserved keyword
		{"t$1", Guard{Table: "t$1", Column: "fence_epoch"}, "t$1"},
		{"café", Guard{Table: "café", Column: "fence_epoch"}, "café"},
		{"ÉTÉ", Guard{Table: "ÉtÉ", Column: "fence_epoch"}, "ÉtÉ"}, // only ASCII folds
	}
	for _, c := range ok {
		g, err := ParseGuard(c.spec)
		if err != nil {
			t.Errorf("ParseGuard(%q): %v", c.spec, err)
			continue
		}
		if g != c.want {
			t.Errorf("ParseGuard(%q) = %+v, want %+v", c.spec, g, c.want)
		}
		if n := g.Name(); n != c.name {
			t.Errorf("ParseGuard(%q).Name() = %q, want %q", c.spec, n, c.name)
		}
	}
	bad := []string{"", "   ", ":", "accounts:", ":epoch", "a.b.c", "a..b", ".a", "a.", `"unterminated`, `""`,
		"1accounts", "acc ounts", "accounts:a:b", "accounts;drop", `"a"x`, strings.Repeat("a", 64)}
	for _, spec := range bad {
		_, err := ParseGuard(spec)
		if err == nil {
			t.Errorf("ParseGuard(%q) succeeded", spec)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, strings.TrimSpace(spec)) || !strings.Contains(msg, "TABLE[:COLUMN]") {
			t.Errorf("ParseGuard(%q) error %q does not name the spec and the expected form", spec, msg)
		}
	}
	if _, err := ParseGuard(strings.Repeat("a", 63)); err != nil {
		t.Errorf("63-byte name: %v", err)
	}
}

func TestNewValidation(t *testing.T) {
	acc := []Guard{{Table: "accounts", Column: "fence_epoch"}}
	for _, s := range []string{"fence.token", "a.b.c", "_x.y_1", "App.Token"} {
		if _, err := New(Config{Guards: acc, TokenSetting: s}); err != nil {
			t.Errorf("New with setting %q: %v", s, err)
		}
	}
	for _, s := range []string{"", "token", "fence.", ".token", "fence..token", "1fence.token", "fence.1token",
		"fence.to-ken", "fence.to ken", "fence.tok'en", "pgfence.stale", "PGFENCE.STALE", "pgfence.stale_0", "pgfence.token"} {
		_, err := New(Config{Guards: acc, TokenSetting: s})
		if err == nil || !strings.Contains(err.Error(), "setting") {
			t.Errorf("New with setting %q: err = %v", s, err)
		}
	}
	for _, g := range []Guard{{Column: "e"}, {Table: "t"}, {Table: strings.Repeat("t", 64), Column: "e"},
		{Schema: strings.Repeat("s", 64), Table: "t", Column: "e"}, {Table: "t\x00", Column: "e"}, {Table: "t\xff", Column: "e"},
		{Table: "t", Column: "e", Rollout: Observe + 1}, {Table: "t", Column: "e", Rollout: -1}} {
		if _, err := New(Config{Guards: []Guard{g}, TokenSetting: "fence.token"}); err == nil {
			t.Errorf("New accepted guard %+v", g)
		}
	}
	if _, err := New(Config{TokenSetting: "fence.token"}); err != nil {
		t.Errorf("New without guards: %v", err)
	}
}

func TestMayTouch(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts", `public."Odd ""Q"""`)
	cases := []struct {
		sql  string
		want bool
	}{
		{"SELECT 1", false},
		{"UPDATE orders SET x = 1", false},
		{"", false},
		{"UPDATE accounts SET x = 1", true},
		{"update ACCOUNTS set x = 1", true},
		{"UPDATE \"AcCoUnTs\" SET x = 1", true}, // when in doubt
		{"select 'accounts'", true},
		{"UPDATE U&\"\\0061ccounts\" SET x = 1", true},
		{"UPDATE u&\"x\" SET x = 1", true},
		{`UPDATE "Odd ""Q""" SET x = 1`, true},
		{`UPDATE "Odd "Q"" SET x = 1`, false}, // not how that name can be written
		{"accounts", true},
		{"accounts_x", true},
		{"accountz", false},
	}
	for _, c := range cases {
		if got := r.MayTouch(c.sql); got != c.want {
			t.Errorf("MayTouch(%q) = %v, want %v", c.sql, got, c.want)
		}
	}
	if none := mustNew(t, "fence.token"); none.MayTouch("UPDATE u&\"x\" SET accounts = 1") {
		t.Error("a Rewriter without guards touched something")
	}
	if res, err := r.Rewrite("SELEC garbage", Simple, nil); err != nil || res.SQL != "SELEC garbage" || res.Refusal != nil {
		t.Errorf("Rewrite of untouchable text = %+v, %v", res, err)
	}
	// With a Session, text that may EXECUTE a prepared write is parsed.
	s := fakeSession{"pay": {"accounts"}}
	if res, err := r.Rewrite("EXECUTE pay", Simple, s); err != nil || len(res.Probes) != 1 || !res.SessionDependent {
		t.Errorf("Rewrite(EXECUTE pay) = %+v, %v", res, err)
	}
	if res, err := r.Rewrite("ExEcUtE !garbage", Simple, s); err != nil || res.Refusal == nil {
		t.Errorf("Rewrite(ExEcUtE !garbage) = %+v, %v", res, err)
	}
	if res, err := r.Rewrite("EXECUTE pay", Simple, nil); err != nil || res.SQL != "EXECUTE pay" || len(res.Probes) > 0 || res.SessionDependent {
		t.Errorf("Rewrite(EXECUTE pay) without a Session = %+v, %v", res, err)
	}
}

func TestTokenExpressions(t *testing.T) {
	strict, allowMissing, lenient := tokenExprs("fence.token", "accounts", "")
	const (
		head  = `(SELECT CASE WHEN v OPERATOR(pg_catalog.~) E'^\\s*[-+]?[0-9]{1,19}\\s*$' THEN `
		empty = ` WHEN coalesce(v, E'') OPERATOR(pg_catalog.=) E'' THEN `
		bad   = ` ELSE (E'pgfence 22023: fence.token must be an integer fencing token for a write to guarded table "accounts", got: ' OPERATOR(pg_catalog.||) v)::pg_catalog.int8`
		tail  = ` END FROM pg_catalog.current_setting(E'fence.token', true) AS pgfence_token(v))`
		wantS = head + `v::pg_catalog.int8` + empty + `(E'pgfence 55000: no fencing token is set for this write to guarded table "accounts"; set fence.token first' OPERATOR(pg_catalog.||) coalesce(v, E''))::pg_catalog.int8` + bad + tail
		wantA = head + `v::pg_catalog.int8` + empty + `NULL::pg_catalog.int8` + bad + tail
		wantL = head + `CASE WHEN v::pg_catalog.numeric OPERATOR(pg_catalog.<=) 9223372036854775807::pg_catalog.numeric AND v::pg_catalog.numeric OPERATOR(pg_catalog.>=) (-9223372036854775808)::pg_catalog.numeric THEN v::pg_catalog.int8 END` + tail
	)
	for _, c := range []struct{ name, got, want string }{{"TOK", strict, wantS}, {"TOKA", allowMissing, wantA}, {"TOKL", lenient, wantL}} {
		if c.got != c.want {
			t.Errorf("%s:\n%s\nwant:\n%s", c.name, c.got, c.want)
		}
		if _, err := pg_query.Parse("SELECT " + c.got); err != nil {
			t.Errorf("%s does not parse: %v", c.name, err)
		}
		if strings.Count(c.got, "OPERATOR(") != strings.Count(c.got, "OPERATOR(pg_catalog.") {
			t.Errorf("%s has an operator that is not schema-qualified", c.name)
		}
	}
	// The rollout picks the expression.
	g := []Guard{{Table: "a", Column: "e"}, {Table: "b", Column: "e", AllowMissingToken: true}, {Table: "c", Column: "e", Rollout: Shadow}}
	r, err := New(Config{Guards: g, TokenSetting: "fence.token"})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{0, 1, 2} {
		all := [3]string{}
		all[0], all[1], all[2] = tokenExprs("fence.token", r.guards[i].name, "")
		if r.guards[i].tok != all[want] {
			t.Errorf("guard %d uses the wrong token expression", i)
		}
	}
	t.Run("TOKC and GATE", testStrictCheck)
	if g := r.guards; g[0].cast == "" || g[0].gate == "" || g[1].cast+g[1].gate+g[2].cast+g[2].gate != "" {
		t.Errorf("only the strict guard gets TOKC and GATE: %+v", g)
	}
	// Names with quotes and backslashes stay inside their literals.
	odd := mustNew(t, "fence.token", `"it's \ ""odd"""`)
	for _, e := range []string{odd.guards[0].tok, odd.guards[0].cast, odd.guards[0].gate} {
		if _, err := pg_query.Parse("SELECT " + e); err != nil {
			t.Errorf("token expression for an odd name does not parse: %v\n%s", err, e)
		}
	}
}

// testStrictCheck pins TOKC and GATE, the strict guards' token expressions
// in UPDATE, DELETE and DO UPDATE, for a table outside and inside a lock
// domain.
func testStrictCheck(t *testing.T) {
	const (
		plainV  = `pg_catalog.current_setting(E'fence.token', true)`
		domainV = `COALESCE(NULLIF(pg_catalog.current_setting(E'fence.token.billing', true), E''), pg_catalog.current_setting(E'fence.token', true))`
		// In a lock domain, both settings set to different tokens fail first.
		gS       = `pg_catalog.current_setting(E'fence.token', true)`
		conflict = ` WHEN ` + domainV + ` OPERATOR(pg_catalog.<>) ` + gS + ` AND ` + gS + ` OPERATOR(pg_catalog.<>) E''` +
			` THEN pg_catalog.format(E'pgfence 22023: both fence.token.billing and fence.token are set, to different tokens (%L and %L), for a write to guarded table "accounts" in lock domain "billing"', ` +
			domainV + `, ` + gS + `)::pg_catalog.int8`
	)
	cases := []struct {
		domain, v, cast, gate string
	}{
		{"", plainV, plainV + `::pg_catalog.int8`,
			`CASE WHEN coalesce(` + plainV + `, E'') OPERATOR(pg_catalog.=) E''` +
				` THEN (E'pgfence 55000: no fencing token is set for this write to guarded table "accounts"; set fence.token first' OPERATOR(pg_catalog.||) coalesce(` + plainV + `, E''))::pg_catalog.int8` +
				` WHEN pg_catalog.btrim(` + plainV + `, E' \t\n\r\f\x0B+-0123456789') OPERATOR(pg_catalog.<>) E''` +
				` THEN (E'pgfence 22023: fence.token must be an integer fencing token for a write to guarded table "accounts", got: ' OPERATOR(pg_catalog.||) ` + plainV + `)::pg_catalog.int8` +
				` ELSE ` + plainV + `::pg_catalog.int8 END IS NOT NULL`},
		{"billing", domainV, domainV + `::pg_catalog.int8`,
			`CASE` + conflict + ` WHEN coalesce(` + domainV + `, E'') OPERATOR(pg_catalog.=) E''` +
				` THEN (E'pgfence 55000: no fencing token is set for this write to guarded table "accounts" in lock domain "billing"; set fence.token.billing or fence.token first' OPERATOR(pg_catalog.||) coalesce(` + domainV + `, E''))::pg_catalog.int8` +
				` WHEN pg_catalog.btrim(` + domainV + `, E' \t\n\r\f\x0B+-0123456789') OPERATOR(pg_catalog.<>) E''` +
				` THEN (E'pgfence 22023: fence.token.billing or fence.token must be an integer fencing token for a write to guarded table "accounts" in lock domain "billing", got: ' OPERATOR(pg_catalog.||) ` + domainV + `)::pg_catalog.int8` +
				` ELSE ` + domainV + `::pg_catalog.int8 END IS NOT NULL`},
	}
	for _, c := range cases {
		r, err := New(Config{Guards: []Guard{{Table: "accounts", Column: "fence_epoch", Domain: c.domain}}, TokenSetting: "fence.token"})
		if err != nil {
			t.Fatal(err)
		}
		g := r.guards[0]
		for _, e := range []struct{ name, got, want string }{{"TOKC", g.cast, c.cast}, {"GATE", g.gate, c.gate}} {
			if e.got != e.want {
				t.Errorf("%s in domain %q:\n%s\nwant:\n%s", e.name, c.domain, e.got, e.want)
			}
			if _, err := pg_query.Parse("SELECT " + e.got); err != nil {
				t.Errorf("%s in domain %q does not parse: %v", e.name, c.domain, err)
			}
			if strings.Count(e.got, "OPERATOR(") != strings.Count(e.got, "OPERATOR(pg_catalog.") {
				t.Errorf("%s in domain %q has an operator that is not schema-qualified", e.name, c.domain)
			}
		}
		// TOKC casts the whole token text, without parentheses.
		tree, err := pg_query.Parse("SELECT " + g.cast + ", " + c.v)
		if err != nil {
			t.Fatal(err)
		}
		tl := tree.Stmts[0].Stmt.GetSelectStmt().TargetList
		cast := stripLocations(tl[0].GetResTarget().Val).GetTypeCast()
		if cast == nil || !proto.Equal(stripLocations(cast.Arg), stripLocations(tl[1].GetResTarget().Val)) {
			t.Errorf("TOKC in domain %q is not a cast of the token text: %v", c.domain, tl[0])
		}
	}
}

func TestRewriteExample(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	res, err := r.Rewrite("UPDATE accounts SET balance = 10 WHERE id = 1", Simple, nil)
	if err != nil || res.Refusal != nil {
		t.Fatalf("Rewrite: %v %v", err, res.Refusal)
	}
	cast, gate := r.guards[0].cast, r.guards[0].gate
	probe := `SELECT pg_catalog.current_setting(E'fence.token', true), ` + flagTag + `, pg_catalog.current_setting(E'pgfence.stale_0', true), NULL::pg_catalog.text, NULL::pg_catalog.text, pg_catalog.set_config(E'pgfence.stale_0', E'', true)`
	stale := `pg_catalog.format(E'%s:%s', pg_catalog.now(), COALESCE(CAST("accounts"."fence_epoch" AS pg_catalog.text), E'?'))`
	want := `UPDATE accounts SET "fence_epoch" = ` + cast + `, balance = 10 WHERE (id = 1) AND (pg_catalog.int8le("accounts"."fence_epoch", ` + cast +
		`) OR ((id = 1) AND pg_catalog.set_config(E'pgfence.stale_0', ` + stale + `, true) IS NULL)) AND ` + gate + `;` + probe
	if res.SQL != want {
		t.Errorf("got:\n%s\nwant:\n%s", res.SQL, want)
	}
	if len(res.Fenced) != 1 || res.Fenced[0] != (Fenced{Table: "accounts", Kind: "UPDATE", Rollout: Enforce}) {
		t.Errorf("Fenced = %+v", res.Fenced)
	}
	if len(res.Probes) != 1 || res.Probes[0].Index != 1 || res.Probes[0].SQL != probe ||
		len(res.Probes[0].Tables) != 1 || res.Probes[0].Tables[0] != (ProbeTable{"accounts", Enforce, "", 0}) {
		t.Errorf("Probes = %+v", res.Probes)
	}
}

// TestFlagsPerGuard checks that each guard raises its own flag, numbered
// by its index, and that probes list a statement's tables in order.
func TestFlagsPerGuard(t *testing.T) {
	g, _ := ParseGuard("public.orders:version")
	a, _ := ParseGuard("accounts")
	o, _ := ParseGuard("audit")
	o.Rollout = Observe
	r, err := New(Config{Guards: []Guard{g, a, o}, TokenSetting: "app.tok"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Rewrite("WITH x AS (DELETE FROM accounts RETURNING 1), y AS (INSERT INTO audit VALUES (1) RETURNING 1) UPDATE orders SET v = 1", Prepared, nil)
	if err != nil || res.Refusal != nil {
		t.Fatalf("Rewrite: %v %+v", err, res.Refusal)
	}
	if !strings.Contains(res.SQL, `set_config(E'pgfence.stale_1', pg_catalog.format(E'%s:%s', pg_catalog.now(), COALESCE(CAST("accounts"."fence_epoch"`) ||
		!strings.Contains(res.SQL, `set_config(E'pgfence.stale_0', pg_catalog.format(E'%s:%s', pg_catalog.now(), COALESCE(CAST("orders"."version"`) {
		t.Errorf("flags: %s", res.SQL)
	}
	want := "SELECT pg_catalog.current_setting(E'app.tok', true), " + flagTag + ", pg_catalog.current_setting(E'pgfence.stale_1', true), NULL::pg_catalog.text, NULL::pg_catalog.text, " +
		"NULL::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.text, " +
		"pg_catalog.current_setting(E'pgfence.stale_0', true), NULL::pg_catalog.text, NULL::pg_catalog.text, pg_catalog.set_config(E'pgfence.stale_1', E'', true), pg_catalog.set_config(E'pgfence.stale_0', E'', true)"
	if len(res.Probes) != 1 || res.Probes[0].SQL != want || res.Probes[0].Index != -1 {
		t.Errorf("Probes = %+v", res.Probes)
	}
	if _, err := pg_query.Parse(want); err != nil {
		t.Error(err)
	}
}

func TestUnchangedIsSameString(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	in := "SELECT * FROM accounts"
	res, _ := r.Rewrite(in, Simple, nil)
	if res.SQL != in || res.Refusal != nil || res.Fenced != nil || res.Probes != nil {
		t.Errorf("Rewrite(%q) = %+v", in, res)
	}
}

func TestNULRefused(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	res, err := r.Rewrite("SELECT 1;\x00UPDATE accounts SET x = 1", Simple, nil)
	if err != nil || res.Refusal == nil || res.Refusal.Code != codeSyntax {
		t.Errorf("NUL byte: %+v, %v", res, err)
	}
}

func TestParseErrorMarker(t *testing.T) {
	const pre = `invalid input syntax for type bigint: "`
	cases := []struct {
		code, msg string
		want      Refusal
		ok        bool
	}{
		{"22P02", pre + `pgfence 55000: no fencing token is set for this write to guarded table "accounts"; set fence.token first"`,
			Refusal{"55000", `pgfence: no fencing token is set for this write to guarded table "accounts"; set fence.token first`,
				"SET fence.token = '<token>' (or SET LOCAL inside a transaction) before writing"}, true},
		{"22P02", pre + `pgfence 22023: app.tok must be an integer fencing token for a write to guarded table "a"": b", got: 12x"`,
			Refusal{"22023", `pgfence: app.tok must be an integer fencing token for a write to guarded table "a"": b", got: 12x`,
				"the token must be a whole number, e.g. SET app.tok = '42'"}, true},
		// The token itself may look like a marker or end in a quote.
		{"22P02", pre + `pgfence 22023: fence.token must be an integer fencing token for a write to guarded table "t", got: pgfence 55000: x""`,
			Refusal{"22023", `pgfence: fence.token must be an integer fencing token for a write to guarded table "t", got: pgfence 55000: x"`,
				"the token must be a whole number, e.g. SET fence.token = '42'"}, true},
		{"22P02", pre + `pgfence 42501: column "fence_epoch" of guarded table "accounts" holds the fencing epoch; no statement may assign it"`,
			Refusal{"42501", `pgfence: column "fence_epoch" of guarded table "accounts" holds the fencing epoch; no statement may assign it`, hintForgedEpoch}, true},
		{"22P02", pre + `pgfence 0A000: MERGE on guarded table "accounts" cannot be fenced yet"`,
			Refusal{"0A000", `pgfence: MERGE on guarded table "accounts" cannot be fenced yet`, hintMerge}, true},
		{"22P02", pre + `pgfence 0A000: COPY FROM on guarded table "accounts" cannot be fenced yet"`,
			Refusal{"0A000", `pgfence: COPY FROM on guarded table "accounts" cannot be fenced yet`, hintUnsupported}, true},
		{"22P02", pre + `pgfence 42601: syntax error at or near "x""`,
			Refusal{"42601", `pgfence: syntax error at or near "x"`, ""}, true},
		// A translated message with other quotation marks.
		{"22P02", `ungültige Eingabesyntax für Typ bigint: »pgfence 55000: no fencing token is set for this write to guarded table "t"; set fence.token first«`,
			Refusal{"55000", `pgfence: no fencing token is set for this write to guarded table "t"; set fence.token first`,
				"SET fence.token = '<token>' (or SET LOCAL inside a transaction) before writing"}, true},
		{"22P02", pre + `pgfence is great"`, Refusal{}, false},
		{"22P02", pre + `pgfence 5500: x"`, Refusal{}, false},
		{"22P02", pre + `abc"`, Refusal{}, false},
		{"22003", pre + `pgfence 55000: x"`, Refusal{}, false},
		{"22P02", "", Refusal{}, false},
	}
	for _, c := range cases {
		got, ok := ParseErrorMarker(c.code, c.msg)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseErrorMarker(%q, %q) =\n%+v, %v\nwant\n%+v, %v", c.code, c.msg, got, ok, c.want, c.ok)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	done := make(chan string)
	for i := 0; i < 8; i++ {
		go func() {
			res, _ := r.Rewrite("DELETE FROM accounts WHERE id = 1", Simple, nil)
			done <- res.SQL
		}()
	}
	first := <-done
	for i := 1; i < 8; i++ {
		if s := <-done; s != first {
			t.Error("concurrent rewrites differ")
		}
	}
}

func BenchmarkMayTouchMiss(b *testing.B) {
	r := mustNew(b, "fence.token", "accounts", "public.orders")
	sql := "SELECT u.id, u.name, p.total FROM users u JOIN payments p ON p.user_id = u.id WHERE u.id = $1 AND p.state = 'settled' ORDER BY p.created_at DESC LIMIT 50"
	b.ReportAllocs()
	for b.Loop() {
		if r.MayTouch(sql) {
			b.Fatal("hit")
		}
	}
}

func BenchmarkRewriteUpdate(b *testing.B) {
	r := mustNew(b, "fence.token", "accounts")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Rewrite("UPDATE accounts SET balance = balance - $1 WHERE id = $2", Prepared, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func TestMayTouchMissAllocs(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	if n := testing.AllocsPerRun(100, func() { r.MayTouch("SELECT * FROM users WHERE id = 1") }); n != 0 {
		t.Errorf("MayTouch allocates %v times", n)
	}
}

func TestMayWrite(t *testing.T) {
	cases := []struct {
		sql  string
		want bool
	}{
		{"SELECT abalance FROM accounts WHERE aid = 7", false},
		{"SELECT * FROM accounts FOR SHARE", false},
		{"", false},
		{"UPDATE accounts SET v = 1", true},
		{"uPdAtE accounts SET v = 1", true},
		{"insert into t values (1)", true},
		{"DELETE FROM t", true},
		{"MERGE INTO t USING s ON true WHEN MATCHED THEN DO NOTHING", true},
		{"TRUNCATE t", true},
		{"COPY t FROM STDIN", true},
		{"EXECUTE p(1)", true},
		{"SELECT * FROM t FOR UPDATE", true},
		{"SELECT 1;update t SET v = 1", true},
		{"SELECT 1/*x*/UPDATE t SET v = 1", true},
		{"SELECT x FROM t WHERE v = 1\nDELETE", true},
		// Conservative: a word counts in a literal or comment too, and after
		// a digit or "$".
		{"SELECT 'update' FROM t", true},
		{"SELECT 1 /* delete */", true},
		{"SELECT $$x$$update", true},
		{"SELECT 1update", true},
		// Inside a longer identifier it is not the keyword.
		{"SELECT copyright FROM t", false},
		{"SELECT * FROM updates", false},
		{"SELECT updated_at, last_update FROM t", false},
		{"SELECT x FROM t_delete, \"insert_log\"", false},
		{"SELECT update$1 FROM t", false},
		{"SELECT d\u00e9lete, \u00e9update FROM t", false},
		// Split spellings are not the keyword.
		{"SELECT upd/**/ate FROM t", false},
		{"SELECT inser", false},
		{"SELECT 1 -- execut", false},
	}
	for _, c := range cases {
		if got := MayWrite(c.sql); got != c.want {
			t.Errorf("MayWrite(%q) = %v, want %v", c.sql, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { mayWriteSink = MayWrite("SELECT abalance FROM accounts WHERE aid = 7") }); n != 0 {
		t.Errorf("MayWrite allocates %v times", n)
	}
}

func TestEndsTransaction(t *testing.T) {
	for sql, want := range map[string]bool{
		"COMMIT":                              true,
		"end":                                 true,
		"ROLLBACK":                            true,
		"abort work":                          true,
		"PREPARE TRANSACTION 'tx1'":           true,
		"UPDATE t SET x = 1; COMMIT":          true,
		"/* c */ rollback":                    true,
		"SELECT 1;;  commit":                  true,
		"PREPARE q AS SELECT 1":               false,
		"BEGIN":                               false,
		"UPDATE t SET committed = true":       false,
		"SELECT 'x; commit'":                  true, // conservative
		"SELECT ending FROM t":                false,
		"":                                    false,
		"SELECT 1; SELECT rollback_at FROM t": false,
	} {
		if got := EndsTransaction(sql); got != want {
			t.Errorf("EndsTransaction(%q) = %v, want %v", sql, got, want)
		}
	}
}

func TestMayInvalidate(t *testing.T) {
	for sql, want := range map[string]bool{
		"DEALLOCATE ALL":                                         true,
		"deallocate pgx_0":                                       true,
		"DISCARD ALL":                                            true,
		"SELECT 1; discard plans":                                true,
		"SELECT f('DISCARD')":                                    true, // conservative
		"UPDATE discarded_items SET n = 1":                       false,
		"SELECT x FROM t WHERE deallocated":                      false,
		"SELECT * FROM undiscard":                                false,
		"SELECT * FROM accounts WHERE id = $1":                   false,
		"SET search_path = tenant_7, public":                     true,
		`SET LOCAL "search_path" TO x`:                           true,
		"SELECT set_config('search_path', 'x', false)":           true,
		"reset\tALL":                                             true,
		"RESET search_path":                                      true,
		"UPDATE t SET my_search_path = 1":                        false,
		"SELECT resets FROM all_things":                          false,
		"SET ROLE tenant_7":                                      true,
		"set local role = tenant_7":                              true,
		"SET SESSION AUTHORIZATION alice":                        true,
		"RESET role":                                             true,
		"SET fence.token = '7'":                                  false,
		"UPDATE users SET role = 'admin'":                        false,
		"SET x = 1; UPDATE users SET role = 'admin'":             false,
		"BEGIN; SET LOCAL ROLE tenant_7":                         true,
		"BEGIN;\nreset all":                                      true,
		"SELECT 1;SET SESSION AUTHORIZATION alice":               true,
		"SELECT set_config('role', 'tenant_7', false)":           true,
		"SELECT pg_catalog.set_config ( 'ROLE', $1, true)":       true,
		"SELECT set_config('session_authorization', 'a', false)": true,
		"SELECT set_config($1, $2, false)":                       true, // any setting
		"SELECT set_config(E'role', 'x', false)":                 true,
		"SELECT set_config('ro\\le', 'x', false)":                true, // 'role' where backslashes escape
		"SELECT set_config('fence.token', '7', false)":           false,
		"SELECT set_config('rol', '7', false)":                   false,
		"SELECT set_config('roles', '7', false)":                 false,
		"SELECT set_config":                                      false,
		"SELECT set_config(":                                     true,
		"SELECT set_config('role":                                true,
		"UPDATE t SET set_config = 'role'":                       false,
		"ROLLBACK TO SAVEPOINT s1":                               true,
		"rollback work to s1":                                    true,
		"SELECT 1; ROLLBACK TRANSACTION TO s1":                   true,
		"COMMIT AND CHAIN":                                       true,
		"end and chain":                                          true,
		"ABORT AND CHAIN":                                        true,
		"ROLLBACK":                                               false, // the transaction status it ends with says so
		"COMMIT":                                                 false,
		"RELEASE SAVEPOINT s1":                                   false,
		"ROLLBACK PREPARED 'tx1'":                                false,
		"UPDATE t SET x = 1 WHERE y = 'to'":                      false,
		"UPDATE t SET chain = 1":                                 false,
		"SELECT commit_chain FROM t":                             false,
		"   ":                                                    false,
		"":                                                       false,
		";":                                                      false,
		"/* app=x */ SET ROLE r":                                 true,
		"-- note\nSET ROLE r":                                    true,
		"SELECT 1; /* a /* nested */ one */ RESET ALL":           true,
		"SELECT set_config /* x */ ('role', 'r', true)":          true,
		"/* SET ROLE r */ SELECT 1":                              false,
		"/* unterminated SET ROLE":                               false,
	} {
		if got := MayInvalidate(sql); got != want {
			t.Errorf("MayInvalidate(%q) = %v, want %v", sql, got, want)
		}
	}
}

// mayWriteSink keeps the compiler from dropping a measured call.
var mayWriteSink bool

// blank, the one reading of white space and comments that every scan of
// the package uses, reads them as Postgres's scanner does.
func TestBlank(t *testing.T) {
	for _, tc := range []struct {
		sql    string
		end    int
		closed bool
	}{
		{"x", 0, true},
		{" \t\n\r\f\vx", 6, true},
		{"-- c\nx", 5, true},
		{"-- c\rx", 5, true},
		{"-- to the end", 13, true},
		{"/* a */x", 7, true},
		{"/* a /* b */ c */ x", 18, true},
		{"/* a /* b */ x", 14, false},
		{"/* a */ -- b\n /* c */ x", 22, true},
		{"/*/ x", 5, false},
	} {
		if end, closed := blank(tc.sql, 0); end != tc.end || closed != tc.closed {
			t.Errorf("blank(%q) = %d, %v; want %d, %v", tc.sql, end, closed, tc.end, tc.closed)
		}
	}
	if !castFollows("'5' /* x */ ::interval", 3) || castFollows("'5' /* x ::interval", 3) || castFollows("'5' + 1", 3) {
		t.Error("castFollows does not read the blanks before :: as blank does")
	}
}

// TestStaleNotice: where the database has the backstop's helpers, a stale
// row raises its flag through pgfence.note_stale, which returns the value
// as set_config would (so the write's condition is the same), in row and
// lock-domain fencing alike; ParseStaleNotice reads its notice back.
func TestStaleNotice(t *testing.T) {
	g := []Guard{{Table: "accounts", Column: "e"}, {Table: "ledger", Column: "e", Domain: "billing"}}
	for _, notice := range []bool{false, true} {
		r, err := New(Config{Guards: g, TokenSetting: "fence.token", StaleNotice: notice})
		if err != nil {
			t.Fatal(err)
		}
		for _, sql := range []string{"UPDATE accounts SET x = 1 WHERE id = 1", "DELETE FROM ledger WHERE id = 2"} {
			res, err := r.Rewrite(sql, Prepared, nil)
			if err != nil || res.Refusal != nil {
				t.Fatalf("%s: %v %+v", sql, err, res.Refusal)
			}
			helper, setConfig := strings.Contains(res.SQL, "pgfence.note_stale("), strings.Contains(res.SQL, "set_config(E'pgfence.stale_") ||
				strings.Contains(res.SQL, "set_config(CASE WHEN")
			if helper != notice || setConfig == notice {
				t.Errorf("StaleNotice %v: %s\n%s", notice, sql, res.SQL)
			}
			if _, err := pg_query.Parse(res.SQL); err != nil {
				t.Errorf("%s: %v", res.SQL, err)
			}
		}
	}
	for _, c := range []struct {
		detail string
		guard  int
		kind   Stale
		winner string
		ok     bool
	}{
		{"pgfence.stale_3 2026-11-29 00:10:00.5+00:45", 3, StaleRow, "45", true},
		{"pgfence.dstale_0 2026-11-29 00:10:00+00:-9", 0, StaleDomain, "-9", true},
		{"pgfence.stale_1 2026-11-29 00:10:00+00:?", 1, StaleRow, "", true},
		{"pgfence.stale_x 2026:1", 0, NotStale, "", false},
		{"pgfence.stale_1", 0, NotStale, "", false},
		{"pgfence.noticed 1:2", 0, NotStale, "", false},
		{"pgfence.stale_-1 a:2", 0, NotStale, "", false},
		{"pgfence.stale_2 no-colon", 0, NotStale, "", false},
	} {
		guard, kind, winner, ok := ParseStaleNotice(c.detail)
		if guard != c.guard || kind != c.kind || winner != c.winner || ok != c.ok {
			t.Errorf("ParseStaleNotice(%q) = %d, %v, %q, %v; want %d, %v, %q, %v", c.detail, guard, kind, winner, ok, c.guard, c.kind, c.winner, c.ok)
		}
	}
}
