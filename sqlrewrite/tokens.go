package sqlrewrite

import (
	"fmt"
	"slices"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// stmtTokens are the scanner tokens of one top-level statement with the
// paren/bracket depth at each, counted from the statement's start. A
// bracket has the depth outside it.
type stmtTokens struct {
	toks  []*pg_query.ScanToken
	depth []int
}

func stmtTokensOf(all []*pg_query.ScanToken, raw *pg_query.RawStmt, sqlLen int) stmtTokens {
	start, end := int(raw.StmtLocation), sqlLen
	if raw.StmtLen > 0 {
		end = start + int(raw.StmtLen)
	}
	lo, _ := slices.BinarySearchFunc(all, start, func(t *pg_query.ScanToken, at int) int { return int(t.Start) - at })
	hi, _ := slices.BinarySearchFunc(all, end, func(t *pg_query.ScanToken, at int) int { return int(t.Start) - at })
	st := stmtTokens{toks: all[lo:hi], depth: make([]int, hi-lo)}
	d := 0
	for i, t := range st.toks {
		switch t.Token {
		case ')', ']':
			d--
		}
		st.depth[i] = d
		switch t.Token {
		case '(', '[':
			d++
		}
	}
	return st
}

// at is the index of the token starting at byte offset off, or -1.
func (st stmtTokens) at(off int) int {
	i, ok := slices.BinarySearchFunc(st.toks, off, func(t *pg_query.ScanToken, at int) int { return int(t.Start) - at })
	if !ok {
		return -1
	}
	return i
}

func (st stmtTokens) start(i int) int { return int(st.toks[i].Start) }
func (st stmtTokens) end(i int) int   { return int(st.toks[i].End) }

func (st stmtTokens) comment(i int) bool {
	k := st.toks[i].Token
	return k == pg_query.Token_SQL_COMMENT || k == pg_query.Token_C_COMMENT
}

// lastCode is the index of the last non-comment token before index limit,
// or -1.
func (st stmtTokens) lastCode(limit int) int {
	for i := limit - 1; i >= 0; i-- {
		if !st.comment(i) {
			return i
		}
	}
	return -1
}

// nextCode is the index of the first non-comment token at or after index
// from and before limit, or -1.
func (st stmtTokens) nextCode(from, limit int) int {
	for i := from; i < limit; i++ {
		if !st.comment(i) {
			return i
		}
	}
	return -1
}

// span is where the clauses of one statement are, a top-level one or one
// nested in WITH, EXPLAIN, PREPARE, COPY... Its keywords are the tokens at
// the depth of its target relation after that relation, up to the ')'
// closing the innermost paren group around it or the top-level
// statement's end.
type span struct {
	stmtTokens
	rel   int // index of the target relation's first token
	stop  int // index one past the statement's last token
	level int // paren depth of the statement's own keywords
}

func (st stmtTokens) spanOf(rv *pg_query.RangeVar) (span, error) {
	i := st.at(int(rv.Location))
	if i < 0 {
		return span{}, fmt.Errorf("sqlrewrite: no token at the target relation's offset %d", rv.Location)
	}
	sp := span{stmtTokens: st, rel: i, stop: len(st.toks), level: st.depth[i]}
	if p := st.lastCode(i); !rv.Inh && p >= 0 && st.toks[p].Token == '(' {
		sp.level-- // ONLY (t)
	}
	for k := i + 1; k < len(st.toks); k++ {
		if st.depth[k] < sp.level {
			sp.stop = k
			break
		}
	}
	return sp, nil
}

// keyword reports whether token i is kind at the statement's level used as
// a keyword: not a column label after AS or '.', where Postgres accepts
// even reserved words.
func (sp span) keyword(i int, kind pg_query.Token) bool {
	if sp.toks[i].Token != kind || sp.depth[i] != sp.level {
		return false
	}
	p := sp.lastCode(i)
	return p < 0 || sp.toks[p].Token != pg_query.Token_AS && sp.toks[p].Token != '.'
}

// first is the index of the first kind keyword in [from, to), or -1.
func (sp span) first(kind pg_query.Token, from, to int) int {
	for i := from; i < to; i++ {
		if sp.keyword(i, kind) {
			return i
		}
	}
	return -1
}

// lastBefore is the index of the last kind keyword at or after index from
// that starts before byte offset before, or -1.
func (sp span) lastBefore(kind pg_query.Token, from, before int) int {
	found := -1
	for i := from; i < sp.stop && sp.start(i) < before; i++ {
		if sp.keyword(i, kind) {
			found = i
		}
	}
	return found
}

// closing is the index of the first token in [from, to) that is kind (a
// closing bracket or a comma) at depth level, or -1.
func (sp span) closing(kind pg_query.Token, level, from, to int) int {
	for i := from; i < to; i++ {
		if sp.toks[i].Token == kind && sp.depth[i] == level {
			return i
		}
	}
	return -1
}
