package sqlrewrite

import (
	"strings"
	"testing"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// Grammar version skew (see skew.go): what pgfence's parser cannot read is
// refused with a clear 42601 only when it may write a guarded table; any
// other text passes untouched, for the server to run or refuse.
func TestGrammarSkew(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	const generic = `if the statement uses a word that became a keyword in PostgreSQL 16 or 17 as a name, write that name in double quotes, as "system_user", ` +
		`which every PostgreSQL version reads as a name; if the statement is wrong on your server too, correct it`
	for _, tc := range []struct {
		name, sql string
		// want is "unchanged", "rewritten" or "refused".
		want string
		// perr is the parser's error the refusal quotes, hint its hint.
		perr, hint string
	}{
		{name: "system_user column of a guarded table",
			sql: "UPDATE accounts SET system_user = 'x' WHERE id = 1", want: "refused",
			perr: `syntax error at or near "system_user"`,
			hint: `if system_user is a name in this statement, write it in double quotes, "system_user", which every PostgreSQL version reads as a name; if the statement is wrong on your server too, correct it`},
		{name: "upper case: the hint quotes the folded name",
			sql: "UPDATE accounts SET SYSTEM_USER = 'x' WHERE id = 1", want: "refused",
			perr: `syntax error at or near "SYSTEM_USER"`,
			hint: `if SYSTEM_USER is a name in this statement, write it in double quotes, "system_user", which every PostgreSQL version reads as a name; if the statement is wrong on your server too, correct it`},
		{name: "quoted, it is fenced",
			sql: `UPDATE accounts SET "system_user" = 'x' WHERE id = 1`, want: "rewritten"},
		{name: "a column-name keyword is still a column name",
			sql: "UPDATE accounts SET json_table = 'x' WHERE id = 1", want: "rewritten"},
		{name: "in a later statement",
			sql: "SELECT 1; UPDATE accounts SET system_user = 'x'", want: "refused",
			perr: `syntax error at or near "system_user"`},
		{name: "SQL's SYSTEM_USER, in another table's write that reads a guarded table",
			sql: "UPDATE other SET v = 1 WHERE system_user IN (SELECT val FROM accounts)", want: "unchanged"},
		{name: "a 15-only function call on a write that names a guarded table",
			sql: "UPDATE other SET v = json_value(v) FROM accounts", want: "refused",
			perr: `syntax error at or near ")"`, hint: generic},
		{name: "genuine syntax error on a guarded table",
			sql: "UPDATE accounts SET = 1", want: "refused",
			perr: `syntax error at or near "="`, hint: generic},
		{name: "what the scanner rejects too",
			sql: "UPDATE accounts SET val = 'it''s", want: "refused",
			perr: `unterminated quoted string at or near "'it''s"`, hint: generic},
		{name: "invalid UTF-8 is not repeated",
			sql: "UPDATE accounts SET \xff = 1", want: "refused",
			perr: "string field contains invalid UTF-8", hint: generic}, // pg_query's tree cannot hold it
		// The server runs or refuses these itself.
		{name: "system_user column of an unguarded table",
			sql: "UPDATE other SET system_user = 'x' WHERE id = 1", want: "unchanged"},
		{name: "genuine syntax error on an unguarded table",
			sql: "UPDATE other SET = 1", want: "unchanged"},
		{name: "no write keyword",
			sql: "SELECT system_user( FROM accounts", want: "unchanged"},
		// The reverse skew: pgfence reads what PostgreSQL 15 refuses, and
		// rewrites it as it reads it; the server refuses it as it would.
		{name: "JSON_TABLE in a fenced write",
			sql: "UPDATE accounts SET val = (SELECT x FROM JSON_TABLE('[1]', '$[*]' COLUMNS (x int PATH '$')) jt) WHERE id = 1", want: "rewritten"},
		{name: "MERGE ... RETURNING into another table",
			sql: "MERGE INTO other o USING accounts a ON o.id = a.id WHEN MATCHED THEN UPDATE SET v = 1 RETURNING *", want: "unchanged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []Mode{Simple, Prepared} {
				res, err := r.Rewrite(tc.sql, mode, nil)
				if err != nil {
					t.Fatal(err)
				}
				ref := skewOutcome(t, mode, tc.sql, res, tc.want)
				if ref == nil {
					continue
				}
				if ref.Code != codeSyntax {
					t.Errorf("code %s, want %s", ref.Code, codeSyntax)
				}
				if !utf8.ValidString(ref.Message) || !utf8.ValidString(res.SQL) {
					t.Errorf("invalid UTF-8 in the refusal: %q", ref.Message)
				}
				const what = "may write a guarded table"
				for _, want := range []string{"pgfence: cannot read this statement", what, "(" + parserGrammar + "): " + tc.perr + ";",
					"the server may read it differently", "system_user", `write such a name in double quotes ("system_user")`} {
					if !strings.Contains(ref.Message, want) {
						t.Errorf("message lacks %q:\n%s", want, ref.Message)
					}
				}
				if tc.hint != "" && ref.Hint != tc.hint {
					t.Errorf("hint:\n%s\nwant:\n%s", ref.Hint, tc.hint)
				}
				// The server raises the marker, which drops the hint:
				// reading the marker back gives all of it again.
				lit := refusalSQL(ref)
				if res.SQL != lit {
					t.Errorf("refusal SQL %q, want %q", res.SQL, lit)
				}
				text := lit[strings.Index(lit, "E'")+2 : strings.LastIndex(lit, "'")]
				text = strings.NewReplacer(`''`, `'`, `\\`, `\`).Replace(text)
				back, ok := ParseErrorMarker("22P02", `invalid input syntax for type bigint: "`+text+`"`)
				if !ok || back != *ref {
					t.Errorf("ParseErrorMarker round trip:\n%+v, %v\nwant\n%+v", back, ok, *ref)
				}
			}
		})
	}
}

// The exact error a client gets for the case of issue 27.
func TestUnparsableMessage(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	res, err := r.Rewrite("UPDATE accounts SET system_user = 'x' WHERE id = 1", Simple, nil)
	if err != nil || res.Refusal == nil {
		t.Fatalf("%+v, %v", res, err)
	}
	const want = `pgfence: cannot read this statement, which may write a guarded table, with pgfence's parser (PostgreSQL 17's grammar): ` +
		`syntax error at or near "system_user"; the server may read it differently (a word that became a keyword in PostgreSQL 16 or 17, ` +
		`such as system_user, is a plain name on older servers), but pgfence refuses what it cannot read rather than send it unfenced: ` +
		`write such a name in double quotes ("system_user")`
	if res.Refusal.Message != want {
		t.Errorf("message:\n%s\nwant:\n%s", res.Refusal.Message, want)
	}
	// Other 42601 refusals (a NUL byte) get no such hint.
	if h := markerHint(codeSyntax, "query text contains a NUL byte"); h != "" {
		t.Errorf("NUL byte hint %q", h)
	}
}

// skewWords are keywords here, other than unreserved ones: names that this
// parser cannot read where PostgreSQL 15 can. And the grammar is the one
// parserGrammar names: 16's system_user is reserved, 17's MERGE ...
// RETURNING parses.
func TestSkewWords(t *testing.T) {
	for w := range skewWords {
		res, err := pg_query.Scan(w)
		if err != nil || len(res.Tokens) != 1 {
			t.Fatalf("%s: %v", w, err)
		}
		switch k := res.Tokens[0].KeywordKind; k {
		case pg_query.KeywordKind_NO_KEYWORD, pg_query.KeywordKind_UNRESERVED_KEYWORD:
			t.Errorf("%s is %v, not a word pgfence cannot read as a name", w, k)
		}
	}
	if _, err := pg_query.Parse("UPDATE t SET system_user = 1"); err == nil {
		t.Error("system_user is a column name to this parser: not PostgreSQL 16 or later")
	}
	if _, err := pg_query.Parse("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE RETURNING *"); err != nil {
		t.Errorf("MERGE ... RETURNING does not parse: not PostgreSQL 17 or later: %v", err)
	}
	if !strings.Contains(parserGrammar, "PostgreSQL 17") || parserMajor != 17 {
		t.Errorf("parserGrammar %q, parserMajor %d", parserGrammar, parserMajor)
	}
	// PostgreSQL 18's syntax does not parse: when it does, the parser is
	// 18's, and parserMajor must say so.
	for _, sql := range []string{
		"UPDATE t SET v = 1 RETURNING WITH (OLD AS o, NEW AS n) o.v, n.v",
		"CREATE TABLE t (a int, b int GENERATED ALWAYS AS (a * 2) VIRTUAL)",
	} {
		if _, err := pg_query.Parse(sql); err == nil {
			t.Errorf("PostgreSQL 18's %q parses: bump parserGrammar and parserMajor", sql)
		}
	}
}

// On a server newer than the parser's grammar, what pgfence cannot read
// and may write a guarded table is refused as a version skew (0A000,
// naming both versions); on any other server, or an unknown one, as before
// (42601). What it can read is fenced alike on all, and what names no
// guarded table passes untouched.
func TestGrammarSkewNewerServer(t *testing.T) {
	const (
		returningWith = "UPDATE accounts SET val = 'x' WHERE id = 1 RETURNING WITH (OLD AS o, NEW AS n) o.val, n.val"
		virtual       = "ALTER TABLE accounts ADD COLUMN twice int GENERATED ALWAYS AS (id * 2) VIRTUAL"
		perr          = `syntax error at or near "WITH"`
	)
	for _, tc := range []struct {
		name    string
		server  int
		sql     string
		want    string // "unchanged", "rewritten", "skew" (0A000) or "syntax" (42601)
		message string // the whole message, for "skew"
	}{
		{name: "RETURNING WITH on 18", server: 180004, sql: returningWith, want: "skew",
			message: `pgfence: cannot read this statement, which may write a guarded table, with pgfence's parser (PostgreSQL 17's grammar): ` +
				perr + `; the server runs PostgreSQL 18.4, whose grammar is newer (a version skew): pgfence cannot fence what it cannot read, and refuses it rather than send it unfenced`},
		{name: "RETURNING WITH on a later 19", server: 190002, sql: returningWith, want: "skew",
			message: `pgfence: cannot read this statement, which may write a guarded table, with pgfence's parser (PostgreSQL 17's grammar): ` +
				perr + `; the server runs PostgreSQL 19.2, whose grammar is newer (a version skew): pgfence cannot fence what it cannot read, and refuses it rather than send it unfenced`},
		{name: "a VIRTUAL column added to a guarded table on 18", server: 180004, sql: virtual, want: "skew"},
		{name: "RETURNING WITH on 17", server: 170010, sql: returningWith, want: "syntax"},
		{name: "RETURNING WITH on 14", server: 140023, sql: returningWith, want: "syntax"},
		{name: "RETURNING WITH on an unknown server", server: 0, sql: returningWith, want: "syntax"},
		{name: "old and new as column references on 18", server: 180004, want: "rewritten",
			sql: "UPDATE accounts SET val = 'x' WHERE id = 1 RETURNING old.val, new.val, old.*, new.*"},
		{name: "DELETE RETURNING old on 18", server: 180004, want: "rewritten",
			sql: "DELETE FROM accounts WHERE id = 1 RETURNING old.val, new.val"},
		{name: "another table's RETURNING WITH on 18", server: 180004, want: "unchanged",
			sql: "UPDATE other SET val = 'x' RETURNING WITH (OLD AS o, NEW AS n) o.val, n.val"},
		{name: "a read of a guarded table on 18", server: 180004, want: "unchanged",
			sql: "SELECT val FROM accounts WHERE id = 1 WITH ORDINALITY garbage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := ParseGuard("accounts")
			if err != nil {
				t.Fatal(err)
			}
			r, err := New(Config{TokenSetting: "fence.token", Guards: []Guard{g}, ServerVersion: tc.server})
			if err != nil {
				t.Fatal(err)
			}
			for _, mode := range []Mode{Simple, Prepared} {
				res, err := r.Rewrite(tc.sql, mode, nil)
				if err != nil {
					t.Fatal(err)
				}
				ref := skewOutcome(t, mode, tc.sql, res, tc.want)
				if ref == nil {
					continue
				}
				if tc.want == "syntax" {
					if ref.Code != codeSyntax || strings.Contains(ref.Message, "version skew") {
						t.Errorf("mode %d: %s %q, want 42601 without the newer server's skew", mode, ref.Code, ref.Message)
					}
					continue
				}
				if ref.Code != codeUnsupported || ref.Hint != hintNewer || !strings.Contains(ref.Message, "version skew") {
					t.Errorf("mode %d: %s %q (hint %q), want 0A000 naming the skew", mode, ref.Code, ref.Message, ref.Hint)
				}
				if tc.message != "" && ref.Message != tc.message {
					t.Errorf("message:\n%s\nwant:\n%s", ref.Message, tc.message)
				}
				// The server raises the marker, which drops the hint:
				// reading the marker back gives all of it again.
				lit := refusalSQL(ref)
				text := lit[strings.Index(lit, "E'")+2 : strings.LastIndex(lit, "'")]
				text = strings.NewReplacer(`''`, `'`, `\\`, `\`).Replace(text)
				back, ok := ParseErrorMarker("22P02", `invalid input syntax for type bigint: "`+text+`"`)
				if !ok || back != *ref {
					t.Errorf("ParseErrorMarker round trip:\n%+v, %v\nwant\n%+v", back, ok, *ref)
				}
			}
		})
	}
	if !strings.HasPrefix(hintNewer, "write the statement in syntax that PostgreSQL 17 reads too") {
		t.Errorf("hint %q", hintNewer)
	}
}

// skewOutcome checks res, sql's rewrite in mode, for the outcomes
// "unchanged" and "rewritten" (returning nil); for any other want res
// must be a refusal, which it returns for the caller to check.
func skewOutcome(t *testing.T, mode Mode, sql string, res *Result, want string) *Refusal {
	t.Helper()
	ref := res.Refusal
	switch want {
	case "unchanged":
		if ref != nil || res.SQL != sql {
			t.Fatalf("mode %d: not passed untouched: %+v", mode, res)
		}
		return nil
	case "rewritten":
		if ref != nil || res.SQL == sql || len(res.Fenced) == 0 {
			t.Fatalf("mode %d: not fenced: %+v", mode, res)
		}
		return nil
	}
	if ref == nil {
		t.Fatalf("mode %d: not refused: %q", mode, res.SQL)
	}
	return ref
}
