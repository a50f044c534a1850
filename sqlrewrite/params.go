package sqlrewrite

import (
	"slices"
	"strconv"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// A simple-protocol write carries its values as literals, so its text, and
// with it the fenced rewrite Postgres must parse and plan, changes with
// every execution. Parameterize takes the numeric literals out: what is left
// is the same for every execution, so the proxy can prepare its rewrite
// once per session and bind each execution's values to it, as a driver
// using the extended protocol would.
//
// Only numeric literals move. Postgres types each by its text alone (an
// integer that fits int4 is int4, then int8, else numeric; one with a point
// or exponent is numeric), so a parameter declared with that type means
// exactly what the literal did. A string literal's type comes from its
// context, which an unknown-typed parameter does not always share, so
// strings stay in the text.

// Type OIDs of numeric literals.
const (
	oidInt8    = 20
	oidInt4    = 23
	oidNumeric = 1700
)

// Parameterized is a text with its numeric literals replaced by parameters.
type Parameterized struct {
	// SQL is the text with $1, $2, ... in place of its numeric literals, in
	// text order; everything else is as written (but for a space before a
	// parameter that would otherwise continue an identifier).
	SQL string
	// Types are the parameters' type OIDs: the types Postgres gives the
	// literals (int4, int8 or numeric).
	Types []uint32
	// Values are the literals as written, which every one of those types
	// reads back as the same value. They share the input's memory.
	Values []string
	// spaced are the indexes of the parameters with a space put before
	// them (rare, so usually nil): Positions needs to know.
	spaced []int
}

// maxParams bounds the literals a text may have to be parameterized (the
// protocol allows 65535; a long multi-row VALUES list gains little).
const maxParams = 1000

// Parameterize scans sql, the text of a simple-protocol Query. writes
// reports whether it holds a write keyword outside literals and comments,
// or does not scan: a text without one is one Rewrite passes unchanged.
// p.SQL is set when sql is a candidate for running as a prepared statement
// bound to p.Values: one statement that inserts, updates or deletes, with
// no parameters of its own, whose numeric literals all have plain decimal
// forms, and without the clauses where a parameter does not mean what a
// literal does: ORDER BY and GROUP BY (a literal there is a column
// position), DISTINCT ON (likewise), and ON CONFLICT (an arbiter index's
// predicate cannot be proved from a parameter). RewriteTemplate makes the
// final decision, on the parse tree.
func Parameterize(sql string) (p Parameterized, writes bool) {
	if !MayWrite(sql) {
		return p, false
	}
	var buf [16]textRange
	lx, ok := scanLiterals(sql, buf[:0])
	if !ok {
		// Something scanLiterals does not read exactly: ask Postgres's scanner.
		if lx, ok = scanLiteralsPG(sql); !ok {
			return p, true
		}
	}
	switch {
	case !lx.writes:
		return p, false
	case lx.refuse || !lx.dml || len(lx.literals) > maxParams:
		return p, true
	}
	return parameterized(sql, lx.literals), true
}

// textRange is where a token is in a text: sql[start:end].
type textRange struct{ start, end int }

// lexed is what Parameterize needs to know of a text's tokens.
type lexed struct {
	writes   bool        // a write keyword (see writeKeywords)
	dml      bool        // INSERT, UPDATE or DELETE
	refuse   bool        // a token that rules a template out: see Parameterize
	literals []textRange // the numeric literals, in text order
}

// scanLiteralsPG lexes sql with pg_query's scanner (Postgres's own).
func scanLiteralsPG(sql string) (lx lexed, ok bool) {
	scan, err := pg_query.Scan(sql)
	if err != nil {
		return lx, false
	}
	toks := scan.Tokens
	lx.writes = hasWriteKeyword(toks)
	for _, t := range toks {
		switch t.Token {
		case pg_query.Token_ICONST, pg_query.Token_FCONST:
			lx.literals = append(lx.literals, textRange{int(t.Start), int(t.End)})
		case pg_query.Token_INSERT, pg_query.Token_UPDATE, pg_query.Token_DELETE_P:
			lx.dml = true
		case pg_query.Token_PARAM, pg_query.Token_ORDER, pg_query.Token_GROUP_P,
			pg_query.Token_DISTINCT, pg_query.Token_CONFLICT:
			lx.refuse = true
		case pg_query.Token_ASCII_59: // ';': one statement only
			lx.refuse = lx.refuse || !onlyTrailing(toks, t)
		}
	}
	return lx, true
}

// parameterized replaces the literals of sql with $1, $2, ...; it returns
// the zero Parameterized if one of them has a form literalType refuses.
func parameterized(sql string, literals []textRange) Parameterized {
	n := len(literals)
	p := Parameterized{Types: make([]uint32, 0, n), Values: make([]string, 0, n)}
	var b strings.Builder
	b.Grow(len(sql) + 2*n)
	last := 0
	for _, l := range literals {
		lit := sql[l.start:l.end]
		oid := literalType(lit)
		if oid == 0 {
			return Parameterized{}
		}
		p.Types = append(p.Types, oid)
		p.Values = append(p.Values, lit)
		b.WriteString(sql[last:l.start])
		if l.start > 0 && isIdentCont(sql[l.start-1]) {
			b.WriteByte(' ') // "INSERT.5" must not become the identifier "INSERT$1"
			p.spaced = append(p.spaced, len(p.Values)-1)
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(len(p.Values)))
		last = l.end
	}
	b.WriteString(sql[last:])
	p.SQL = b.String()
	return p
}

// onlyTrailing reports whether semicolon t ends the text: nothing but more
// semicolons and comments follow it.
func onlyTrailing(toks []*pg_query.ScanToken, t *pg_query.ScanToken) bool {
	i := slices.Index(toks, t)
	for _, u := range toks[i+1:] {
		switch u.Token {
		case pg_query.Token_ASCII_59, pg_query.Token_SQL_COMMENT, pg_query.Token_C_COMMENT:
		default:
			return false
		}
	}
	return true
}

// literalType returns the type Postgres gives a numeric literal, or 0 for a
// form other than plain decimal digits with an optional point and exponent
// (hexadecimal, octal, binary and underscore-separated integers are left to
// Postgres, whose version may not know them).
func literalType(lit string) uint32 {
	digits, point, exp := 0, false, false
	for i := 0; i < len(lit); i++ {
		switch c := lit[i]; {
		case '0' <= c && c <= '9':
			digits++
		case c == '.' && !point && !exp:
			point = true
		case (c == 'e' || c == 'E') && !exp && digits > 0:
			exp = true
			if i+1 < len(lit) && (lit[i+1] == '+' || lit[i+1] == '-') {
				i++
			}
			if i+1 == len(lit) {
				return 0
			}
		default:
			return 0
		}
	}
	switch {
	case digits == 0:
		return 0
	case point || exp:
		return oidNumeric
	}
	if _, err := strconv.ParseInt(lit, 10, 32); err == nil {
		return oidInt4
	}
	if _, err := strconv.ParseInt(lit, 10, 64); err == nil {
		return oidInt8
	}
	return oidNumeric
}

// RewriteTemplate rewrites p.SQL as the text of a prepared statement (Mode
// Prepared) for a simple-protocol Query to run bound to p.Values. ok is
// false when the Query must be rewritten as sent instead: p.SQL is not one
// INSERT, UPDATE or DELETE without RETURNING that the rewrite fences, or a
// parameter stands where Postgres needs a constant (a type modifier, as in
// numeric(10,2)), or the text is refused.
func (r *Rewriter) RewriteTemplate(p Parameterized) (res *Result, ok bool, err error) {
	tree, err := pg_query.Parse(p.SQL)
	if err != nil || len(tree.Stmts) != 1 || !returnsNoRows(tree.Stmts[0].Stmt) || paramInTypmod(tree) {
		return nil, false, nil
	}
	res, err = r.Rewrite(p.SQL, Prepared, nil)
	if err != nil || res.Refusal != nil || res.SessionDependent || !res.NoRows || res.SQL == p.SQL || len(res.Probes) != 1 {
		return nil, false, err
	}
	for _, f := range res.Fenced {
		switch f.Kind {
		case "UPDATE", "DELETE", "INSERT":
		default:
			return nil, false, nil
		}
	}
	return res, true, nil
}

// paramInTypmod reports whether a parameter is a type modifier somewhere in
// tree: Postgres accepts only constants there.
func paramInTypmod(tree *pg_query.ParseResult) bool {
	found := false
	eachMessage(tree.ProtoReflect(), func(m proto.Message) {
		if t, isType := m.(*pg_query.TypeName); isType {
			for _, mod := range t.Typmods {
				if mod.GetAConst() == nil {
					found = true
				}
			}
		}
	})
	return found
}
