package sqlrewrite

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// Parameterized writes: see the package documentation (doc.go).

// Type OIDs of numeric literals.
const (
	oidInt8    = 20
	oidInt4    = 23
	oidNumeric = 1700
)

// Parameterized is a text with its literals replaced by parameters.
type Parameterized struct {
	// SQL is the text with $1, $2, ... in place of its literals, in text
	// order; everything else is as written (but for a space before a
	// parameter that would otherwise continue an identifier).
	SQL string
	// Types are the parameters' type OIDs: the types Postgres gives the
	// numeric literals (int4, int8 or numeric), and 0 (left to Postgres to
	// infer) for a string.
	Types []uint32
	// Values are the literals' values: a number as written, which its type
	// reads back as the same value, and a string without its quotes. They
	// share the input's memory unless a string had a doubled quote.
	Values []string
	// spaced are the indexes of the parameters with a space put before
	// them (rare, so usually nil): Positions needs to know.
	spaced []int
}

// maxParams bounds the literals a text may have to be parameterized (the
// protocol allows 65535; a long multi-row VALUES list gains little).
const maxParams = 1000

// keeping keeps the strings whose indexes are in keep (see parameterize).
func keeping(keep []int) func(int) bool {
	return func(i int) bool { return slices.Contains(keep, i) }
}

// numbersOnly keeps every string: the template for a text whose template
// with strings RewriteTemplate refused for another reason than a string's
// place (one it does not parse, say).
func numbersOnly(int) bool { return true }

// Strings reports whether p has a string literal taken out.
func (p Parameterized) Strings() bool {
	return slices.Contains(p.Types, 0)
}

// parameterize scans sql, the text of a simple-protocol Query. writes
// reports whether it holds a write keyword outside literals and comments,
// or does not scan: a text without one is one Rewrite passes unchanged.
// p.SQL is set when sql is a candidate for running as a prepared statement
// bound to p.Values: one statement that inserts, updates or deletes, with
// no parameters of its own, whose numeric literals all have plain decimal
// forms (plain strings are taken out too, where plainStringValue allows,
// and keep does not report their index), and without the clauses where a
// parameter does not mean what a literal does: ORDER BY and GROUP BY (a
// literal there is a column position), DISTINCT ON (likewise), and ON
// CONFLICT (an arbiter index's predicate cannot be proved from a
// parameter). RewriteTemplate makes the final decision, on the parse tree.
func parameterize(sql string, keep func(i int) bool) (p Parameterized, writes bool) {
	if !MayWrite(sql) {
		return p, false
	}
	return parameterizeWrite(sql, keep)
}

// parameterizeWrite is parameterize for a text that spells a write keyword.
func parameterizeWrite(sql string, keep func(i int) bool) (p Parameterized, writes bool) {
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
	return parameterized(sql, lx.outsideTarget(), keep), true
}

// conflict notes the CONFLICT keyword at sql[at], in a text len long: the
// ON CONFLICT target starts there (the first one: a column named conflict
// before it only keeps more literals in the text).
func (lx *lexed) conflict(at, len int) {
	if lx.target.end == 0 {
		lx.target = textRange{at + 1, len}
	}
}

// do notes the DO keyword at sql[at]: the ON CONFLICT target ends there.
func (lx *lexed) do(at, len int) {
	if lx.target.end == len && lx.target.start > 0 {
		lx.target.end = at
	}
}

// outsideTarget returns the literals that are not in the ON CONFLICT
// target, in place.
func (lx *lexed) outsideTarget() []textRange {
	if lx.target.end == 0 {
		return lx.literals
	}
	out := lx.literals[:0]
	for _, l := range lx.literals {
		if l.start < lx.target.start || l.start >= lx.target.end {
			out = append(out, l)
		}
	}
	return out
}

// textRange is where a token is in a text: sql[start:end].
type textRange struct{ start, end int }

// lexed is what parameterize needs to know of a text's tokens.
type lexed struct {
	writes   bool        // a write keyword (see writeKeywords)
	dml      bool        // INSERT, UPDATE or DELETE
	refuse   bool        // a token that rules a template out: see parameterize
	literals []textRange // the numeric and plain string literals to take out, in text order
	// target is the ON CONFLICT target (from CONFLICT to DO, or to the end
	// of the text), whose literals stay in the text: an arbiter index's
	// expressions and predicate are matched against them, which a
	// parameter would not match. from is 0 until CONFLICT is seen.
	target textRange

	prev      tokKind // the last token but comments: see plainString
	prevTaken bool    // it is a string in literals
}

// scanLiteralsPG lexes sql with pg_query's scanner (Postgres's own).
func scanLiteralsPG(sql string) (lx lexed, ok bool) {
	counted("parse", sql)
	scan, err := pg_query.Scan(sql)
	if err != nil {
		return lx, false
	}
	toks := scan.Tokens
	lx.writes = hasWriteKeyword(toks)
	for _, t := range toks {
		start, end := int(t.Start), int(t.End)
		switch {
		case t.Token == pg_query.Token_SQL_COMMENT || t.Token == pg_query.Token_C_COMMENT:
		case t.Token == pg_query.Token_SCONST && sql[start] == '\'':
			single, _ := quotedToken(sql, start, '\'', false)
			lx.literals = lx.plainString(lx.literals, sql, start, end, single == end)
		case t.Token == pg_query.Token_SCONST || t.Token == pg_query.Token_USCONST ||
			t.Token == pg_query.Token_BCONST || t.Token == pg_query.Token_XCONST:
			lx.token(tokString)
		case t.Token == pg_query.Token_IDENT && sql[start] != '"' || t.KeywordKind != pg_query.KeywordKind_NO_KEYWORD:
			lx.word(sql[start:end])
		case t.Token == pg_query.Token_IDENT || t.Token == pg_query.Token_UIDENT:
			lx.token(tokWord)
		default:
			lx.token(tokOther)
		}
		switch t.Token {
		case pg_query.Token_ICONST, pg_query.Token_FCONST:
			lx.literals = append(lx.literals, textRange{start, end})
		case pg_query.Token_INSERT, pg_query.Token_UPDATE, pg_query.Token_DELETE_P:
			lx.dml = true
		case pg_query.Token_CONFLICT:
			lx.conflict(start, len(sql))
		case pg_query.Token_DO:
			lx.do(start, len(sql))
		case pg_query.Token_PARAM, pg_query.Token_ORDER, pg_query.Token_GROUP_P, pg_query.Token_DISTINCT:
			lx.refuse = true
		case pg_query.Token_ASCII_59: // ';': one statement only
			lx.refuse = lx.refuse || !onlyTrailing(toks, t)
		}
	}
	return lx, true
}

// parameterized replaces the literals of sql with $1, $2, ..., a string
// only if plainStringValue allows and keep does not say otherwise (see
// parameterize); it returns the zero Parameterized if a number has a form
// literalType refuses.
func parameterized(sql string, literals []textRange, keep func(i int) bool) Parameterized {
	n := len(literals)
	p := Parameterized{Types: make([]uint32, 0, n), Values: make([]string, 0, n)}
	var b strings.Builder
	b.Grow(len(sql) + 2*n)
	last, full := 0, -1 // full: the index in parameterize's template
	for _, l := range literals {
		lit := sql[l.start:l.end]
		var oid uint32
		if lit[0] == '\'' {
			v, ok := plainStringValue(sql, l)
			if !ok {
				continue // it stays in the text
			}
			if full++; keep != nil && keep(full) {
				continue
			}
			lit = v
		} else if full, oid = full+1, literalType(lit); oid == 0 || narrowerNegated(lit) {
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

// plainStringValue returns the value of the plain string literal at l in
// sql; ok is false when it must stay in the text: when an interval could
// be read from it (a digit, and no word but interval units) and no cast
// follows it to say what it is (see the top of this file), or when it is
// not UTF-8 (Postgres rejects such a Query as a whole, before parsing it).
func plainStringValue(sql string, l textRange) (v string, ok bool) {
	v = sql[l.start+1 : l.end-1]
	if mayBeInterval(v) && !castFollows(sql, l.end) || !utf8.ValidString(v) {
		return "", false
	}
	if strings.Contains(v, "''") {
		v = strings.ReplaceAll(v, "''", "'")
	}
	return v, true
}

// mayBeInterval reports whether Postgres might read v as an interval: it
// has a digit, and each run of ASCII letters in it is a unit or a word
// interval input knows (compared, as Postgres does, by its first 10
// letters), or ISO 8601 designators (P1Y2M3DT4H), and it does not start
// as a date does.
func mayBeInterval(v string) bool {
	if startsAsDate(strings.TrimLeft(v, " \t\n\r\f\v")) {
		return false
	}
	digit := false
	for i := 0; i < len(v); {
		c := v[i] | 0x20
		if c < 'a' || c > 'z' {
			digit = digit || isDigit(v[i])
			i++
			continue
		}
		j := i
		for j < len(v) && 'a' <= v[j]|0x20 && v[j]|0x20 <= 'z' {
			j++
		}
		if !intervalWord(v[i:min(j, i+10)]) {
			return false
		}
		i = j
	}
	return digit
}

// startsAsDate reports whether v starts with digits, a "-" and digits and
// a "-" (2024-01-31), or digits and a "/" (01/31/2024). Interval input
// rejects such a field (it takes one "-", years-months) whatever fields
// the type declares, so a date or timestamp is read by an interval column
// (with an error) alike as a literal and as a parameter.
func startsAsDate(v string) bool {
	digits := func(i int) int {
		for i < len(v) && isDigit(v[i]) {
			i++
		}
		return i
	}
	i := digits(0)
	if i == 0 || i == len(v) {
		return false
	}
	if v[i] == '/' {
		return true
	}
	if v[i] != '-' {
		return false
	}
	j := digits(i + 1)
	return j > i+1 && j < len(v) && v[j] == '-'
}

// intervalWord reports whether w (ASCII letters) is a word of interval
// input: a unit, "ago", "infinity", or ISO 8601 designators.
func intervalWord(w string) bool {
	w = strings.ToLower(w)
	if strings.Trim(w, "pymwdths") == "" {
		return true
	}
	switch w {
	case "ago", "infinity", "c", "cent", "centuries", "century", "d", "day", "days",
		"dec", "decade", "decades", "decs", "h", "hour", "hours", "hr", "hrs", "invalid",
		"m", "microsecon", "mil", "millennia", "millennium", "millisecon", "mils",
		"min", "mins", "minute", "minutes", "mon", "mons", "month", "months",
		"ms", "msec", "msecond", "mseconds", "msecs", "s", "sec", "second", "seconds", "secs",
		"timezone", "us", "usec", "usecond", "useconds", "usecs",
		"w", "week", "weeks", "y", "year", "years", "yr", "yrs":
		return true
	}
	return false
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

// narrowerNegated reports whether Postgres types the integer literal lit
// narrower behind a minus sign, which its grammar folds into the constant
// before typing it (doNegate): -2147483648 is an int4 where 2147483648 is
// an int8, and -9223372036854775808 an int8 where 9223372036854775808 is a
// numeric. A parameter in the literal's place, negated in the text, keeps
// the wider type, and its arithmetic means something else (integer
// division becomes numeric, an overflow no longer fails), so a text with
// either value keeps its literals.
func narrowerNegated(lit string) bool {
	switch strings.TrimLeft(lit, "0") {
	case "2147483648", "9223372036854775808":
		return true
	}
	return false
}

// RewriteTemplate rewrites p.SQL as the text of a prepared statement (Mode
// Prepared) for a simple-protocol Query to run bound to p.Values. ok is
// false when the Query must be rewritten as sent instead: p.SQL is not one
// INSERT, UPDATE or DELETE without RETURNING that the rewrite fences, or a
// parameter stands where Postgres needs a constant (a type modifier, as in
// numeric(10,2)) or a string's parameter where it may not mean what the
// literal did (see stringParamsSafe), or the text is refused.
func (r *Rewriter) RewriteTemplate(p Parameterized) (res *Result, ok bool, err error) {
	if r.maxParse > 0 && len(p.SQL) > r.maxParse {
		return nil, false, nil // rewritten as sent: refused there
	}
	tree, err := pg_query.Parse(p.SQL)
	if err != nil || len(tree.Stmts) != 1 || !returnsNoRows(tree.Stmts[0].Stmt) || paramInTypmod(tree) ||
		!stringParamsSafe(tree, p.Types) {
		return nil, false, nil
	}
	res, err = r.Rewrite(p.SQL, Prepared, nil)
	if err != nil || res.Refusal != nil || res.SessionDependent || !res.NoRows || res.SQL == p.SQL || len(res.Probes) != 1 {
		return nil, false, err
	}
	for _, f := range res.Fenced {
		switch f.Kind {
		case "UPDATE", "DELETE", "INSERT", "UPSERT":
		default:
			return nil, false, nil
		}
	}
	return res, true, nil
}

// TemplatePlanner plans a template for BindLiterals: ok when it has a plan
// (a rewrite to prepare and bind), else the indexes of the strings to keep
// in the text and try again (StringsToKeep), or nil. The policy's planner
// keeps what it learns in its caches; Rewriter.Template's plans afresh.
type TemplatePlanner interface {
	PlanTemplate(p Parameterized) (ok bool, keep []int)
}

// BindLiterals is the one way a simple-protocol Query comes to run bound to
// its literals, for the proxy's policy and pgfence rewrite alike: the
// template with every literal a parameter; where that has no plan but
// names strings a parameter may not stand for, the same with those strings
// left in the text; else, if it had strings, the template with only its
// numbers taken out. It returns the template that has a plan (ok), and
// writes false, trying nothing, when sql spells no write keyword.
func BindLiterals(sql string, cl Class, pl TemplatePlanner) (p Parameterized, ok, writes bool) {
	if !cl.Has(Writes) {
		return p, false, false
	}
	if p, writes = parameterizeWrite(sql, nil); p.SQL == "" {
		return p, false, writes
	}
	ok, keep := pl.PlanTemplate(p)
	if ok || !p.Strings() {
		return p, ok, true
	}
	// The text spells a write keyword (cl): its templates are made without
	// classifying it again.
	if keep != nil {
		if q, _ := parameterizeWrite(sql, keeping(keep)); q.SQL != "" {
			if ok, _ := pl.PlanTemplate(q); ok {
				return q, true, true
			}
		}
	}
	if q, _ := parameterizeWrite(sql, numbersOnly); q.SQL != "" {
		if ok, _ := pl.PlanTemplate(q); ok {
			return q, true, true
		}
	}
	return p, false, true
}

// Template is what the proxy does with sql, a simple-protocol Query
// (BindLiterals, planning each template afresh): the template it prepares
// and binds sql's literals to, and the template's rewrite. ok is false
// when sql is rewritten as sent.
func (r *Rewriter) Template(sql string) (p Parameterized, res *Result, ok bool, err error) {
	tp := &templatePlanner{r: r}
	p, ok, _ = BindLiterals(sql, Classify(sql), tp)
	if !ok {
		return p, nil, false, tp.err
	}
	return p, tp.res, true, nil
}

// templatePlanner plans templates with RewriteTemplate, keeping the last
// plan and the first error.
type templatePlanner struct {
	r   *Rewriter
	res *Result
	err error
}

func (tp *templatePlanner) PlanTemplate(p Parameterized) (bool, []int) {
	res, ok, err := tp.r.RewriteTemplate(p)
	if err != nil {
		if tp.err == nil {
			tp.err = err
		}
		return false, nil
	}
	if ok {
		tp.res = res
		return true, nil
	}
	return false, StringsToKeep(p)
}

// stringParamsSafe reports whether every untyped parameter (a string
// literal's) in tree stands where Postgres gives it the type it would give
// the literal: compared with a column (=, <>, <, LIKE, IS DISTINCT FROM,
// IN, BETWEEN and the like, the column on the other side), assigned to one
// (UPDATE's SET, INSERT's VALUES), or cast, but to an interval with fields
// (see the top of this file). Both then resolve as the column's or the
// cast's type. Anywhere else (a function's argument, a SELECT list) a
// literal left unresolved is text where a parameter is an error, or the
// two pick different functions.
func stringParamsSafe(tree *pg_query.ParseResult, types []uint32) bool {
	return len(unsafeStrings(tree, types)) == 0
}

// StringsToKeep returns the indexes of p's string parameters that stand
// where a parameter may not mean what the literal did (see
// stringParamsSafe), for ParameterizeKeeping to leave in the text; nil
// when there are none or p.SQL does not parse.
func StringsToKeep(p Parameterized) []int {
	if !p.Strings() {
		return nil
	}
	tree, err := pg_query.Parse(p.SQL)
	if err != nil {
		return nil
	}
	return unsafeStrings(tree, p.Types)
}

// unsafeStrings returns the indexes of the untyped parameters in tree that
// stringParamsSafe does not find safe.
func unsafeStrings(tree *pg_query.ParseResult, types []uint32) []int {
	if !slices.Contains(types, 0) {
		return nil
	}
	safe := make([]bool, len(types))
	mark := func(n *pg_query.Node) {
		if r := n.GetParamRef(); r != nil && r.Number >= 1 && int(r.Number) <= len(safe) {
			safe[r.Number-1] = true
		}
	}
	column := func(n *pg_query.Node) bool {
		c := n.GetColumnRef()
		return c != nil && len(c.Fields) > 0 && c.Fields[len(c.Fields)-1].GetAStar() == nil
	}
	eachMessage(tree.ProtoReflect(), func(m proto.Message) {
		switch m := m.(type) {
		case *pg_query.A_Expr:
			switch m.Kind {
			case pg_query.A_Expr_Kind_AEXPR_OP, pg_query.A_Expr_Kind_AEXPR_LIKE, pg_query.A_Expr_Kind_AEXPR_ILIKE,
				pg_query.A_Expr_Kind_AEXPR_DISTINCT, pg_query.A_Expr_Kind_AEXPR_NOT_DISTINCT:
				if m.Lexpr != nil && m.Rexpr != nil {
					if column(m.Lexpr) {
						mark(m.Rexpr)
					}
					if column(m.Rexpr) {
						mark(m.Lexpr)
					}
				}
			case pg_query.A_Expr_Kind_AEXPR_IN, pg_query.A_Expr_Kind_AEXPR_BETWEEN, pg_query.A_Expr_Kind_AEXPR_NOT_BETWEEN,
				pg_query.A_Expr_Kind_AEXPR_BETWEEN_SYM, pg_query.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM:
				if column(m.Lexpr) {
					for _, it := range m.Rexpr.GetList().GetItems() {
						mark(it)
					}
				}
			}
		case *pg_query.TypeCast:
			if !intervalWithFields(m.TypeName) {
				mark(m.Arg)
			}
		case *pg_query.UpdateStmt:
			for _, t := range m.TargetList {
				if rt := t.GetResTarget(); rt != nil && len(rt.Indirection) == 0 {
					mark(rt.Val)
				}
			}
		case *pg_query.InsertStmt:
			if sel := m.SelectStmt.GetSelectStmt(); sel != nil && sel.Op == pg_query.SetOperation_SETOP_NONE {
				for _, row := range sel.ValuesLists {
					for _, it := range row.GetList().GetItems() {
						mark(it)
					}
				}
			}
		}
	})
	var unsafe []int
	for i, t := range types {
		if t == 0 && !safe[i] {
			unsafe = append(unsafe, i)
		}
	}
	return unsafe
}

// intervalWithFields reports whether t is interval with fields or a
// precision (interval hour, interval(3)), which reads a literal cast to it
// unlike a parameter.
func intervalWithFields(t *pg_query.TypeName) bool {
	if t == nil || len(t.Typmods) == 0 || len(t.Names) == 0 {
		return false
	}
	return t.Names[len(t.Names)-1].GetString_().GetSval() == "interval"
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
