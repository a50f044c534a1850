package sqlrewrite

import (
	"math/rand"
	"strings"
	"testing"
)

// analysisTexts are texts on the edges of what Analyze says, besides
// classifyTexts'.
var analysisTexts = []string{
	"SET fence.token = '42'", "set fence.token to 42;", "SET LOCAL fence.token = '1'", `SET "fence"."token" = '9'`,
	"SET fence.token.billing = '3'", "SET fence.token = '1'; SELECT 1", "/* c */ SET fence.token = '1'",
	"RESET fence.token", "reset fence.token.billing;", `RESET "fence.token"`, "RESET fence.token; SELECT 1",
	"RESET ALL", "DISCARD ALL", "SET work_mem = '1MB'", "SHOW fence.token", "show Fence.Token", "SHOW work_mem",
	"SET x.y = U&'\\0066ence'", "SELECT current_setting('fence.token')", "SELECT set_config('fence.token', '1', false)",
	"SELECT set_config('fence.token', '1', true)", "select set_config('a', E'\\n', false)", "SELECT 'pgfence.x'",
	"SET pgfence.stale_0 = 'x'", "select 1 -- pgfence\n", "SELECT set_config('pg'\n'fence.x', '1', false)",
	"BEGIN", "COMMIT", "BEGIN; UPDATE accounts SET v = 1; COMMIT; UPDATE accounts SET v = 2", "COMMIT; SELECT 1",
	"SELECT 1; SELECT 2", "SELECT 1;  \n", "SELECT f()", "SELECT 1 FROM accounts", "DROP TABLE accounts",
	"drop_me", "CREATE INDEX CONCURRENTLY i ON accounts (v)", "CREATE INDEX i ON accounts (v)",
	"VACUUM accounts", "SET x = 1; VACUUM", "prepare transaction 'p'; select 1", "select transaction from t; select 2",
	"COMMIT PREPARED 'x'; SELECT 1", "SELECT 1; ROLLBACK", "reset_val", "SELECT discard", "U&\"x\"",
}

// checkAnalyze checks that Analyze says, in its one pass, what the
// separate scans it replaces say of sql, each in its own, with and
// without a transaction pooler.
func checkAnalyze(t *testing.T, r *Rewriter, sql string) {
	t.Helper()
	ts, token := r.tokens, r.tokens.names[0]
	for _, pooled := range []bool{false, true} {
		a := r.Analyze(sql, pooled)
		if want := r.Classify(sql); a.Class != want {
			t.Fatalf("Analyze(%q, %v).Class = %07b, Classify says %07b", sql, pooled, a.Class, want)
		}
		set, ok := a.Setting()
		wantSet, wantOK := ts.Match(sql)
		if !wantOK && pooled {
			wantSet, wantOK = ts.MatchReset(sql)
		}
		if set != wantSet || ok != wantOK {
			t.Fatalf("Analyze(%q, %v).Setting() = %+v, %v; Match and MatchReset say %+v, %v", sql, pooled, set, ok, wantSet, wantOK)
		}
		if got, want := a.MayBeDDL(), MayBeDDL(sql, a.Class); got != want {
			t.Fatalf("Analyze(%q, %v).MayBeDDL() = %v, MayBeDDL says %v", sql, pooled, got, want)
		}
		if got, want := a.facts&fInternal != 0, oracleMayNameInternal(sql); got != want {
			t.Fatalf("Analyze(%q, %v) says InternalChange may = %v, its prefilter says %v", sql, pooled, got, want)
		}
		if !pooled {
			continue
		}
		if got, want := a.facts&fSessionChange != 0, oracleMayChangeSession(sql, token); got != want {
			t.Fatalf("Analyze(%q) says SessionChange may = %v, its prefilter says %v", sql, got, want)
		}
		want := ContainsFold(sql, token) || MayWrite(sql) || strings.IndexByte(sql, '(') >= 0
		if oracleWritesNothing(sql) {
			want = ContainsFold(sql, token) || oracleShowsToken(sql, token)
		}
		if got := a.MayUseToken(); got != want {
			t.Fatalf("Analyze(%q).MayUseToken() = %v, WritesNothing, ShowsToken and MayWrite say %v", sql, got, want)
		}
		if got, want := a.facts&fTxStarts != 0, !oracleOneStatement(sql) && oracleSpellsTxEnd(sql); got != want {
			t.Fatalf("Analyze(%q) says TxStarts may = %v, its prefilter says %v", sql, got, want)
		}
	}
}

// Analyze says what the scans it replaces said: on edge cases, the
// rewrite cases' texts, and random splices of their words.
func TestAnalyzeOracles(t *testing.T) {
	r := fuzzRewriterIn(t, 0, fuzzDomains)
	texts := append(classifyTexts(t), analysisTexts...)
	rnd := rand.New(rand.NewSource(1))
	var words []string
	for _, s := range texts {
		words = append(words, strings.Fields(s)...)
	}
	for range 20000 {
		var b strings.Builder
		for range 1 + rnd.Intn(8) {
			b.WriteString(words[rnd.Intn(len(words))])
			b.WriteByte(" ;_(\n'.\\"[rnd.Intn(8)])
		}
		texts = append(texts, b.String())
	}
	for _, sql := range texts {
		checkAnalyze(t, r, sql)
	}
}

func FuzzAnalyze(f *testing.F) {
	for _, s := range append(classifyTexts(f), analysisTexts...) {
		f.Add(s)
	}
	r := fuzzRewriterIn(f, 0, fuzzDomains)
	f.Fuzz(func(t *testing.T, sql string) { checkAnalyze(t, r, sql) })
}

// What Analyze says of each kind of text, as the policy asks it.
func TestAnalyze(t *testing.T) {
	r := fuzzRewriterIn(t, 0, fuzzDomains)
	const (
		internal = 1 << iota // InternalChange refuses it
		session              // SessionChange finds a change for the session
		useToken             // MayUseToken
		ddl                  // MayBeDDL
		txStarts             // TxStarts finds statements that start a transaction
	)
	// The plain SET and RESET of a token setting are changes for the
	// session to SessionChange: the policy asks Setting first.
	for _, tc := range []struct {
		sql   string
		class Class
		set   TokenSet // Setting, behind a pooler
		plain bool     // Setting holds without a pooler too (a SET)
		facts int      // behind a pooler
	}{
		{sql: "SELECT 1"},
		{sql: "SELECT v FROM accounts WHERE id = 1", class: Touches},
		{sql: "UPDATE accounts SET v = 1", class: Writes | Touches, facts: useToken},
		{sql: "insert into other values (1)", class: Writes, facts: useToken},
		{sql: "EXECUTE q", class: Writes | Executes, facts: useToken},
		{sql: "SELECT f()", facts: useToken},
		{sql: "DEALLOCATE ALL", class: Invalidates},
		{sql: "COMMIT", class: EndsTx},
		{sql: "CREATE TABLE t (x int)", class: ChangesTables, facts: ddl | useToken},
		{sql: "DROP TABLE accounts", class: Touches, facts: ddl},
		{sql: "SET client_encoding = 'LATIN1'", class: ChangesReading},
		{sql: "RESET ALL", class: Invalidates | ChangesReading, facts: session},
		{sql: "DISCARD ALL", class: Invalidates | ChangesReading, facts: session},
		{sql: "SET fence.token = '42'", set: TokenSet{Name: "fence.token", Value: "42"}, plain: true, facts: session | useToken},
		{sql: "set local FENCE.TOKEN to 7;", set: TokenSet{Name: "fence.token", Value: "7", Local: true}, plain: true, facts: useToken},
		{sql: `SET "fence"."token".billing = '3'`, set: TokenSet{Name: "fence.token.billing", Value: "3"}, plain: true, facts: session | useToken},
		{sql: "RESET fence.token", set: TokenSet{Name: "fence.token", Reset: true}, facts: session | useToken},
		{sql: "SET fence.token = '1'; SELECT 1", facts: session | useToken},
		{sql: "/* c */ SET fence.token = '1'", facts: session | useToken},
		{sql: "SET fence.token = DEFAULT", facts: session | useToken},
		{sql: "SELECT set_config('fence.token', '1', false)", facts: session | useToken},
		{sql: "SELECT set_config('fence.token', '1', true)", facts: useToken},
		{sql: "SHOW fence.token", facts: useToken},
		{sql: "SHOW work_mem"},
		{sql: "SET pgfence.stale_0 = '1'", class: Touches, facts: internal | useToken}, // "fence" in it may spell the token
		{sql: "SELECT set_config('pgfence.tx.fence.token', '1', true)", class: Touches, facts: internal | useToken},
		{sql: "SELECT 1; COMMIT; SELECT 2", class: EndsTx, facts: txStarts},
		{sql: "SELECT 1; SELECT 'commit'"},
	} {
		for _, pooled := range []bool{false, true} {
			a := r.Analyze(tc.sql, pooled)
			if a.Class != tc.class {
				t.Errorf("Analyze(%q, %v).Class = %07b, want %07b", tc.sql, pooled, a.Class, tc.class)
			}
			set, ok := a.Setting()
			want := tc.set
			if !pooled && !tc.plain {
				want = TokenSet{}
			}
			if set != want || ok != (want.Name != "") {
				t.Errorf("Analyze(%q, %v).Setting() = %+v, %v; want %+v", tc.sql, pooled, set, ok, want)
			}
			if got := a.InternalChange() != nil; got != (tc.facts&internal != 0) {
				t.Errorf("Analyze(%q, %v).InternalChange refuses: %v", tc.sql, pooled, got)
			}
			if got := a.MayBeDDL(); got != (tc.facts&ddl != 0) {
				t.Errorf("Analyze(%q, %v).MayBeDDL() = %v", tc.sql, pooled, got)
			}
			if !pooled {
				continue
			}
			if _, got, _ := a.SessionChange(); got != (tc.facts&session != 0) {
				t.Errorf("Analyze(%q).SessionChange says %v", tc.sql, got)
			}
			if got := a.MayUseToken(); got != (tc.facts&useToken != 0) {
				t.Errorf("Analyze(%q).MayUseToken() = %v", tc.sql, got)
			}
			if starts, _ := a.TxStarts(); (len(starts) > 0) != (tc.facts&txStarts != 0) {
				t.Errorf("Analyze(%q).TxStarts() = %v", tc.sql, starts)
			}
		}
	}
}

// Analyze allocates nothing, behind a transaction pooler or not, but for
// a SET of a token setting whose name has a quoted part, which Postgres's
// parser confirms (see TokenSettings.Match).
func TestAnalyzeAllocs(t *testing.T) {
	r := fuzzRewriterIn(t, 0, fuzzDomains)
	for _, sql := range []string{
		"SELECT a.id, b.v FROM accounts a JOIN other b USING (id) WHERE a.x = 'execute' AND b.y = 2; COMMIT",
		"UPDATE accounts SET v = 1 WHERE id = 2", "SET fence.token = '1'", "RESET fence.token", "SHOW work_mem",
	} {
		for _, pooled := range []bool{false, true} {
			if n := testing.AllocsPerRun(100, func() { analysisSink = r.Analyze(sql, pooled) }); n != 0 {
				t.Errorf("Analyze(%q, %v) allocates %v times", sql, pooled, n)
			}
		}
	}
}

var analysisSink Analysis

// BenchmarkAnalyze compares Analyze with the separate scans it replaced
// (oracle_test.go's, and Classify and Match), as the policy made them
// for each text without a transaction pooler and behind one.
func BenchmarkAnalyze(b *testing.B) {
	g, err := ParseGuard("pgbench_accounts")
	if err != nil {
		b.Fatal(err)
	}
	r, err := New(Config{Guards: []Guard{g}, TokenSetting: "fence.token"})
	if err != nil {
		b.Fatal(err)
	}
	const token = "fence.token"
	separate := func(sql string, pooled bool) bool {
		ok := oracleMayNameInternal(sql)
		if pooled {
			_, m := r.tokens.Match(sql)
			_, mr := r.tokens.MatchReset(sql)
			ok = ok != (m || mr || oracleMayChangeSession(sql, token))
		}
		cl := r.Classify(sql)
		_, m := r.tokens.Match(sql)
		ok = ok != m
		if pooled {
			ok = ok != (ContainsFold(sql, token) || oracleWritesNothing(sql) && oracleShowsToken(sql, token) ||
				MayWrite(sql) || strings.IndexByte(sql, '(') >= 0 || !oracleOneStatement(sql) && oracleSpellsTxEnd(sql))
		}
		return ok != cl.Has(Writes)
	}
	for _, tc := range []struct{ name, sql string }{
		{"update", "UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = 567890;"},
		{"select", "SELECT abalance FROM pgbench_branches WHERE bid = $1"},
		{"set-token", "SET fence.token = '1000'"},
	} {
		for _, pooled := range []bool{false, true} {
			mode := "plain"
			if pooled {
				mode = "pooled"
			}
			b.Run(tc.name+"/"+mode+"/analyze", func(b *testing.B) {
				for b.Loop() {
					analysisSink = r.Analyze(tc.sql, pooled)
				}
			})
			b.Run(tc.name+"/"+mode+"/separate", func(b *testing.B) {
				for b.Loop() {
					boolSink = separate(tc.sql, pooled)
				}
			})
		}
	}
}

var boolSink bool

// Asked of an analysis made without a transaction pooler, what only the
// pooled path looks for fails closed: it is read on its own, or true.
func TestAnalyzeUnpooledFailsClosed(t *testing.T) {
	r := fuzzRewriterIn(t, 0, fuzzDomains)
	for _, sql := range []string{"SELECT 1", "SELECT set_config('fence.token', '1', false)", "SELECT 1; COMMIT; SELECT 2"} {
		a := r.Analyze(sql, false)
		if !a.MayUseToken() {
			t.Errorf("Analyze(%q, false).MayUseToken() = false, want true", sql)
		}
		form, ok, _ := a.SessionChange()
		wantForm, wantOK, _ := r.tokens.SessionChange(sql)
		if form != wantForm || ok != wantOK {
			t.Errorf("Analyze(%q, false).SessionChange() = %q, %v; want %q, %v", sql, form, ok, wantForm, wantOK)
		}
		starts, _ := a.TxStarts()
		want, _ := TxStarts(sql)
		if len(starts) != len(want) {
			t.Errorf("Analyze(%q, false).TxStarts() = %v, want %v", sql, starts, want)
		}
	}
}
