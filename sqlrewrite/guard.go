package sqlrewrite

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// DefaultColumn is the epoch column a guard uses when its spec names none.
const DefaultColumn = "fence_epoch"

// maxIdentLen is NAMEDATALEN-1: Postgres truncates longer identifiers, so a
// longer guard name could never match a table and would fail open.
const maxIdentLen = 63

const guardForm = `TABLE[:COLUMN] or SCHEMA.TABLE[:COLUMN], e.g. accounts, public.accounts or "Accounts":fence_epoch`

// ParseGuard parses "TABLE[:COLUMN]" where TABLE may be "schema.table".
// Identifiers follow SQL rules: unquoted ones are lower-cased, "Quoted" ones
// are kept as written with "" standing for one ".
func ParseGuard(spec string) (Guard, error) {
	p := identParser{s: strings.TrimSpace(spec)}
	names, err := p.names()
	if err == nil && len(names) > 2 {
		err = errors.New("a table name has at most two parts, schema.table")
	}
	g := Guard{Column: DefaultColumn}
	if err == nil && p.more() {
		if p.s[p.i] != ':' {
			err = fmt.Errorf("unexpected %q at byte %d", p.s[p.i], p.i)
		} else {
			p.i++
			g.Column, err = p.ident()
			if err == nil && p.more() {
				err = fmt.Errorf("unexpected %q after the column name", p.s[p.i:])
			}
		}
	}
	if err != nil {
		return Guard{}, fmt.Errorf("invalid guard spec '%s': %v; expected %s", spec, err, guardForm)
	}
	g.Table = names[len(names)-1]
	if len(names) == 2 {
		g.Schema = names[0]
	}
	return g, nil
}

// Name is the guard's table as SQL would name it: "table" or
// "schema.table", each part double-quoted only when it has to be.
func (g Guard) Name() string {
	if g.Schema == "" {
		return nameIdent(g.Table)
	}
	return nameIdent(g.Schema) + "." + nameIdent(g.Table)
}

// Label is how messages and metrics name the guard's table: As, else Name.
func (g Guard) Label() string {
	if g.As != "" {
		return g.As
	}
	return g.Name()
}

// validateNames reports what makes a guard's names unusable.
func (g Guard) validateNames() error {
	for _, part := range []struct{ what, name string }{
		{"schema", g.Schema}, {"table", g.Table}, {"column", g.Column},
	} {
		switch {
		case part.name == "" && part.what != "schema":
			return fmt.Errorf("guard %q has an empty %s name", g.Name(), part.what)
		case len(part.name) > maxIdentLen:
			return fmt.Errorf("guard %q: %s name is longer than %d bytes; Postgres would truncate it", g.Name(), part.what, maxIdentLen)
		case strings.IndexByte(part.name, 0) >= 0 || !utf8.ValidString(part.name):
			return fmt.Errorf("guard %q: %s name is not valid UTF-8 text", g.Name(), part.what)
		}
	}
	return nil
}

// identParser reads a config-file identifier chain. It is for guard specs
// only; client SQL is never tokenised by hand.
type identParser struct {
	s string
	i int
}

func (p *identParser) more() bool { return p.i < len(p.s) }

// names reads ident ('.' ident)*.
func (p *identParser) names() ([]string, error) {
	var out []string
	for {
		name, err := p.ident()
		if err != nil {
			return nil, err
		}
		out = append(out, name)
		if !p.more() || p.s[p.i] != '.' {
			return out, nil
		}
		p.i++
	}
}

// ident reads one quoted or unquoted identifier.
func (p *identParser) ident() (string, error) {
	var name string
	switch {
	case !p.more():
		return "", errors.New("missing a name at the end")
	case p.s[p.i] == '"':
		var err error
		if name, err = p.quoted(); err != nil {
			return "", err
		}
	case isIdentStart(p.s[p.i]):
		start := p.i
		for p.more() && isIdentCont(p.s[p.i]) {
			p.i++
		}
		name = asciiLower(p.s[start:p.i])
	default:
		return "", fmt.Errorf("unexpected %q at byte %d", p.s[p.i], p.i)
	}
	if len(name) > maxIdentLen {
		return "", fmt.Errorf("name %q is longer than %d bytes", name, maxIdentLen)
	}
	return name, nil
}

func (p *identParser) quoted() (string, error) {
	var b strings.Builder
	for p.i++; p.more(); p.i++ {
		c := p.s[p.i]
		if c != '"' {
			b.WriteByte(c)
			continue
		}
		if p.i+1 < len(p.s) && p.s[p.i+1] == '"' {
			b.WriteByte('"')
			p.i++
			continue
		}
		p.i++
		if b.Len() == 0 {
			return "", errors.New(`empty quoted name ""`)
		}
		return b.String(), nil
	}
	return "", errors.New("unterminated quoted name")
}

// Unquoted identifier bytes as Postgres's scanner accepts them; bytes >= 0x80
// are parts of multibyte letters.
func isIdentStart(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c >= 0x80
}

func isIdentCont(c byte) bool {
	return isIdentStart(c) || '0' <= c && c <= '9' || c == '$'
}

// asciiLower folds like Postgres does for UTF-8: ASCII letters only.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// nameIdent quotes name only if it would not read back as itself unquoted:
// it has characters an unquoted name cannot have, or Postgres's scanner
// says it is a keyword that cannot be a table name.
func nameIdent(name string) string {
	if name == "" || !isIdentStart(name[0]) || name != asciiLower(name) {
		return quoteIdent(name)
	}
	for i := 0; i < len(name); i++ {
		if !isIdentCont(name[i]) {
			return quoteIdent(name)
		}
	}
	res, err := pg_query.Scan(name)
	if err != nil || len(res.Tokens) != 1 {
		return quoteIdent(name)
	}
	switch res.Tokens[0].KeywordKind {
	case pg_query.KeywordKind_NO_KEYWORD, pg_query.KeywordKind_UNRESERVED_KEYWORD, pg_query.KeywordKind_COL_NAME_KEYWORD:
		return name
	}
	return quoteIdent(name)
}

// quoteIdent double-quotes an identifier.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// quoteLiteral makes an E'...' string literal, which reads the same whatever
// standard_conforming_strings is.
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return `E'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}
