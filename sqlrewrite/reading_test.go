package sqlrewrite

import (
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

func TestReadsAlike(t *testing.T) {
	for _, c := range []struct {
		sql  string
		want bool
	}{
		// No backslash: ASCII is read alike in every client encoding.
		{"UPDATE t SET v = 'x' WHERE id = 1", true},
		{"", true},
		{"SELECT 'it''s'", true},
		// A byte of 0x80 or more may be part of another character in
		// another encoding (SJIS, BIG5, GBK, GB18030, UHC second bytes).
		{"UPDATE t SET v = 'é' WHERE id = 1", false},
		{"UPDATE t SET v = 'x' -- é", false},
		{"UPDATE \"tä\" SET v = 1", false},
		{"SELECT E'Á\\'; UPDATE t SET v = 1 --'", false},
		// A backslash inside a '...' literal is an escape with
		// standard_conforming_strings off.
		{`SELECT 'a\', '; UPDATE t SET v = 1 --'`, false},
		{`UPDATE t SET v = 'C:\dir' WHERE id = 1`, false},
		{`UPDATE t SET v = N'a\b'`, false},
		{`UPDATE t SET v = U&'d\0061t'`, false},
		{`UPDATE t SET v = U&'d!0061t' UESCAPE '\'`, false},
		{`UPDATE t SET v = B'1\'`, false},   // careful: bit strings take no escapes
		{`UPDATE t SET v = x'1\'`, false},   // nor hexadecimal ones
		{`UPDATE t SET v = 'a' '\'`, false}, // a second literal
		{"UPDATE t SET v = 'a'\n'\\b'", false},
		{`UPDATE t SET v = E'a' || 'b\'`, false},
		// Postgres 14 reads 1e'x' as 1 and E'x' (later ones reject it): an
		// E'...' literal whose backslash is an escape either way.
		{`SELECT 1e'\''`, true},
		// Elsewhere a backslash is read alike.
		{`UPDATE t SET v = E'a\'b' WHERE id = 1`, true},
		{`UPDATE t SET v = e'a\\' WHERE id = 1`, true},
		{`UPDATE t SET v = E'\'' || 'x'`, true},
		{`UPDATE t SET v = $$a\$$ WHERE id = 1`, true},
		{`UPDATE t SET v = $q$it's \ $q$ WHERE id = 1`, true},
		{`UPDATE t SET v = $q$ $x$ \ $$ $q$ || 'y'`, true},
		{`UPDATE t SET "a\b" = 1`, true},
		{`UPDATE t SET "a""\" = 1`, true},
		{"UPDATE t SET v = 1 -- it's a \\ comment\nWHERE id = 1", true},
		{"UPDATE t SET v = 1 /* it's a \\ /* nested */ comment */ WHERE id = 1", true},
		{`SELECT a\b FROM t`, true}, // an operator, or a syntax error: alike
		{`SELECT $1 \ 2`, true},
		{`SELECT a$b$ FROM t WHERE x = '\'`, false}, // a$b$ is a name, not a tag
		{`SELECT a$b$ FROM t WHERE x = E'\''`, true},
		// An identifier ending in e is not an E prefix.
		{`SELECT somee'\'`, false},
		{`SELECT e '\'`, false},
		// Unterminated: not worth being right about.
		{`SELECT E'\`, false},
		{`SELECT $$ \`, false},
		{`SELECT 1 /* \`, false},
		{`SELECT "a\`, false},
		{`SELECT 'a\`, false},
	} {
		if got := ReadsAlike(c.sql); got != c.want {
			t.Errorf("ReadsAlike(%q) = %v, want %v", c.sql, got, c.want)
		}
	}
}

// Every text without a backslash and with ASCII only reads alike; with a
// byte of 0x80 or more none does.
func FuzzReadsAlike(f *testing.F) {
	for _, s := range []string{"SELECT 1", "UPDATE t SET v = 'x'", "é", `E'\''`, `'\'`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		got := ReadsAlike(sql)
		if !isASCIIText(sql) && got {
			t.Fatalf("ReadsAlike(%q) with a byte of 0x80 or more", sql)
		}
		noBackslash := true
		for i := 0; i < len(sql); i++ {
			noBackslash = noBackslash && sql[i] != '\\'
		}
		if noBackslash && isASCIIText(sql) && !got {
			t.Fatalf("ReadsAlike(%q) = false for ASCII without a backslash", sql)
		}
	})
}

// ReadsAlike against Postgres's own scanner (pg_query, which reads with
// standard_conforming_strings on): whatever it says reads alike has no
// backslash inside a string constant but an E'...' or dollar-quoted one.
func FuzzReadsAlikeScanner(f *testing.F) {
	for _, s := range []string{
		`SELECT 'a\', '; UPDATE t SET v = 1 --'`, `SELECT E'a\'b', $$\$$, "x\y" -- \`,
		"SELECT 'a'\n'\\b'", `SELECT U&'\0061'`, `SELECT b'1\'`, `SELECT 1e'\''`, `SELECT a$b$ 'x\'`,
		`SELECT $q$ $x$ \ $$ $q$ || 'y'`, "SELECT 1 /* \\ /* */ '\\' */ 'x'", `SELECT n'\'`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		if !ReadsAlike(sql) {
			return
		}
		scan, err := pg_query.Scan(sql)
		if err != nil {
			return // Postgres rejects it in either reading
		}
		for _, tok := range scan.Tokens {
			switch tok.Token {
			case pg_query.Token_SCONST, pg_query.Token_USCONST, pg_query.Token_BCONST, pg_query.Token_XCONST:
			default:
				continue
			}
			text := sql[tok.Start:tok.End]
			if text[0]|0x20 != 'e' && text[0] != '$' && strings.IndexByte(text, '\\') >= 0 {
				t.Fatalf("ReadsAlike(%q), but Postgres reads the string %q, with a backslash, at %d", sql, text, tok.Start)
			}
		}
	})
}
