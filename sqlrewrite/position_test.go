package sqlrewrite

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// verifyPositions checks Result.Position on a rewrite of in: the edits it
// keeps make the output from the input, and positions spread over the
// output map, in order, to the same characters of the input or to 0, counted
// in runes and in bytes.
func verifyPositions(in string, res *Result) error {
	if got := apply(in, res.edits); got != res.SQL {
		return fmt.Errorf("the edits kept make %q, not the output %q", got, res.SQL)
	}
	for _, bytes := range []bool{false, true} {
		out := []rune(res.SQL)
		src := []rune(in)
		if bytes {
			out, src = bytesAsRunes(res.SQL), bytesAsRunes(in)
		}
		step := max(1, len(out)/64)
		last := 0
		for p := 1; p <= len(out)+1; p += step {
			q := res.Position(in, p, bytes)
			switch {
			case q == 0:
				continue
			case q <= last || q > len(src)+1:
				return fmt.Errorf("position %d of the output maps to %d (bytes %v), after %d, in an input of %d", p, q, bytes, last, len(src))
			case (p > len(out)) != (q > len(src)) || p <= len(out) && out[p-1] != src[q-1]:
				return fmt.Errorf("position %d of the output maps to %d of the input (bytes %v): different characters", p, q, bytes)
			}
			last = q
		}
	}
	return nil
}

func bytesAsRunes(s string) []rune {
	r := make([]rune, len(s))
	for i := range len(s) {
		r[i] = rune(s[i])
	}
	return r
}

// at is the 1-based character position of the first sub in s.
func at(s, sub string) int {
	i := strings.Index(s, sub)
	if i < 0 {
		return -1
	}
	return utf8.RuneCountInString(s[:i]) + 1
}

func TestPosition(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts", "ledger")
	for _, c := range []struct {
		name, sql string
		mode      Mode
		marks     []string // each maps from its place in the rewrite to its place in sql
	}{
		{"update", "UPDATE accounts SET nosuch = 0 WHERE id = 1", Simple, []string{"nosuch", "id = 1", "UPDATE"}},
		{"update, extended", "UPDATE accounts SET balance = 0 WHERE nosuch = 1", Prepared, []string{"nosuch", "balance"}},
		{"delete", "DELETE FROM accounts WHERE nosuch > 2", Simple, []string{"nosuch"}},
		{"insert", "INSERT INTO accounts (id, balance) VALUES (1, 'x')", Simple, []string{"'x'", "balance"}},
		{"insert select", "INSERT INTO accounts (id) SELECT nosuch FROM t", Prepared, []string{"nosuch"}},
		{"non-ASCII before", "UPDATE accounts SET note = 'häßlich' WHERE nosuch = 1", Simple, []string{"nosuch", "'häßlich'"}},
		{"two statements", "UPDATE accounts SET a = 1 WHERE id = 1; DELETE FROM ledger WHERE nosuch = 2", Simple, []string{"nosuch", "DELETE"}},
		{"CTE", "WITH d AS (DELETE FROM ledger WHERE x = 1 RETURNING id) UPDATE accounts SET a = 1 WHERE nosuch IN (SELECT id FROM d)", Simple, []string{"nosuch", "x = 1"}},
		{"untouched", "SELECT nosuch FROM accounts", Simple, []string{"nosuch"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := r.Rewrite(c.sql, c.mode, nil)
			if err != nil || res.Refusal != nil {
				t.Fatalf("Rewrite: %v %v", err, res.Refusal)
			}
			if err := verifyPositions(c.sql, res); err != nil {
				t.Fatal(err)
			}
			for _, m := range c.marks {
				if got, want := res.Position(c.sql, at(res.SQL, m), false), at(c.sql, m); got != want {
					t.Errorf("%q at %d of the rewrite: maps to %d, want %d", m, at(res.SQL, m), got, want)
				}
			}
			if res.SQL == c.sql {
				return
			}
			// The epoch column pgfence adds is not the client's: no position.
			if p := at(res.SQL, `"fence_epoch"`); p < 0 || res.Position(c.sql, p, false) != 0 {
				t.Errorf("position %d, in pgfence's text, maps to %d", p, res.Position(c.sql, p, false))
			}
			end := utf8.RuneCountInString(res.SQL) + 1
			if got := res.Position(c.sql, end+1, false); got != 0 {
				t.Errorf("a position past the end maps to %d", got)
			}
			if got := res.Position(c.sql, 0, false); got != 0 {
				t.Errorf("position 0 maps to %d", got)
			}
		})
	}
	ref, _ := r.Rewrite("UPDATE accounts SET fence_epoch = 1", Simple, nil)
	if ref.Refusal == nil || ref.Position("UPDATE accounts SET fence_epoch = 1", 1, false) != 0 {
		t.Errorf("a refusal's SQL is not the client's: %+v", ref)
	}
}

func TestTemplatePosition(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts")
	for _, c := range []struct {
		sql   string
		marks []string
	}{
		{"UPDATE accounts SET nosuch = 12345 WHERE id = 7", []string{"nosuch", "12345", "id"}},
		{"UPDATE accounts SET a = 1.5e3, b = 'é' WHERE nosuch = 123456789012", []string{"nosuch", "'é'", "1.5e3", "123456789012"}},
		{"DELETE FROM accounts WHERE id = 10000000000 AND nosuch", []string{"nosuch", "10000000000"}},
		{"INSERT INTO accounts (id, nosuch) VALUES (42, 'x')", []string{"'x'", "nosuch", "42"}},
		{"UPDATE accounts SET a=b.5 WHERE nosuch=1", []string{"nosuch", ".5"}}, // a space goes before $1
		// Strings: their quotes, doubled quotes and characters count.
		{"UPDATE accounts SET a = 'it''s ééé', b = '' WHERE nosuch = 5", []string{"'it''s ééé'", "nosuch", "5"}},
		{"UPDATE accounts SET a = '1 hour' WHERE nosuch = 5", []string{"nosuch", "5"}}, // an interval stays
	} {
		p, _ := Parameterize(c.sql)
		if p.SQL == "" {
			t.Fatalf("%q: not parameterized", c.sql)
		}
		res, ok, err := r.RewriteTemplate(p)
		if !ok || err != nil {
			t.Fatalf("%q: RewriteTemplate %v %v", c.sql, ok, err)
		}
		tp := p.Positions(res)
		if tp == nil {
			t.Fatalf("%q: no positions", c.sql)
		}
		for _, m := range c.marks {
			inRewrite := at(res.SQL, m)
			value := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(m, "'"), "'"), "''", "'")
			if i := indexOf(p.Values, value); i >= 0 { // a literal: the rewrite has its parameter
				inRewrite = at(res.SQL, fmt.Sprintf("$%d", i+1))
			}
			if got, want := tp.Position(inRewrite, p.Values, false), at(c.sql, m); got != want {
				t.Errorf("%q: %q at %d of %q maps to %d, want %d", c.sql, m, inRewrite, res.SQL, got, want)
			}
		}
		if got := tp.Position(1, p.Values[1:], false); got != 0 {
			t.Errorf("%q: with too few values, %d", c.sql, got)
		}
		if pos := at(res.SQL, `"fence_epoch"`); tp.Position(pos, p.Values, false) != 0 {
			t.Errorf("%q: pgfence's text maps to %d", c.sql, tp.Position(pos, p.Values, false))
		}
	}
}

func indexOf(values []string, v string) int {
	for i, x := range values {
		if x == v {
			return i
		}
	}
	return -1
}

// verifyTemplatePositions checks TemplatePositions on the template rewrite
// res of in: positions spread over res map, in order, to the same
// characters of in, or (from a parameter) to the first of its literal, or
// to 0.
func verifyTemplatePositions(in string, p Parameterized, res *Result) error {
	tp := p.Positions(res)
	if tp == nil {
		return fmt.Errorf("template %q: no positions", p.SQL)
	}
	literals := map[int]bool{} // rune positions of the literals' first characters
	var buf [16]textRange
	lx, ok := scanLiterals(in, buf[:0])
	if !ok {
		lx, _ = scanLiteralsPG(in)
	}
	for _, l := range lx.literals {
		literals[utf8.RuneCountInString(in[:l.start])+1] = true
	}
	out, src := []rune(res.SQL), []rune(in)
	step := max(1, len(out)/64)
	last := 0
	for pos := 1; pos <= len(out); pos += step {
		q := tp.Position(pos, p.Values, false)
		switch {
		case q == 0:
			continue
		case q < last || q > len(src):
			return fmt.Errorf("position %d of %q maps to %d, after %d, in %q", pos, res.SQL, q, last, in)
		case out[pos-1] != src[q-1] && !(strings.ContainsRune("$0123456789 ", out[pos-1]) && literals[q]):
			return fmt.Errorf("position %d of %q (%q) maps to %d of %q (%q)", pos, res.SQL, out[pos-1], q, in, src[q-1])
		}
		last = q
	}
	return nil
}

// FuzzTemplatePosition checks the positions of template rewrites of
// fuzzed texts (see verifyTemplatePositions).
func FuzzTemplatePosition(f *testing.F) {
	for _, s := range []string{
		"UPDATE accounts SET nosuch = 12345 WHERE id = 7",
		"UPDATE accounts SET a = 1.5e3, b = 'é' WHERE nosuch = 123456789012",
		"DELETE FROM accounts WHERE id = 10000000000 AND nosuch",
		"INSERT INTO accounts (id, nosuch) VALUES (42, 'x'), (7, /* 8 */ 9)",
		"UPDATE accounts SET a=b.5 WHERE nosuch=1",
		"update t set v = v + 5 where id = 7 -- 9",
		"WITH x AS (DELETE FROM t WHERE id = 1) UPDATE accounts SET a = 1 WHERE id = 2",
		"UPDATE accounts SET a = upper('é'), b = 'ü''s', c = nosuch WHERE d = 'x' AND e = 5",
	} {
		f.Add(s)
	}
	r := mustNew(f, "fence.token", "accounts", "t")
	f.Fuzz(func(t *testing.T, sql string) {
		p, res, ok, err := r.Template(sql) // strings, some kept, or numbers only
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if err := verifyTemplatePositions(sql, p, res); err != nil {
				t.Fatal(err)
			}
		}
	})
}
