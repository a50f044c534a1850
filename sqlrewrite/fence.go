package sqlrewrite

import (
	"fmt"
	"slices"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// edit inserts text into the client's SQL at byte offset at. Fencing only
// ever inserts; the client's bytes all stay, in order.
type edit struct {
	at   int
	text string
}

// fence splices the fence into each target statement and, in Simple mode,
// a probe after it.
func (r *Rewriter) fence(sql string, stmts []*pg_query.RawStmt, targets []*target, mode Mode) (*Result, error) {
	scan, err := pg_query.Scan(sql)
	if err != nil {
		return nil, fmt.Errorf("sqlrewrite: scanning text that parsed: %w", err)
	}
	res := &Result{}
	var edits []edit
	for i, t := range targets {
		if t == nil {
			continue
		}
		st := stmtTokensOf(scan.Tokens, stmts[i], len(sql))
		es, err := r.fenceEdits(sql, st, t)
		if err != nil {
			return nil, err
		}
		edits = append(edits, es...)
		f := Fenced{Table: t.guard.name, Kind: t.kind, ProbeIndex: -1}
		if mode == Simple {
			// Right after the statement's last token: never after a
			// trailing -- comment, and before the client's own ';'.
			edits = append(edits, edit{int(st.toks[st.lastCode(len(st.toks))].End), ";" + r.probe})
			f.ProbeIndex = i + len(res.Fenced) + 1
		}
		res.Fenced = append(res.Fenced, f)
	}
	res.SQL = apply(sql, edits)
	return res, nil
}

// fenceEdits returns the edits that fence one UPDATE or DELETE:
//
//	SET C = TOK, ...                       (UPDATE only)
//	WHERE (COND) AND (REF.C <= TOK OR ((COND) AND <flag stale>)) AND TOK IS NOT NULL
//	WHERE (REF.C <= TOK OR <flag stale>) AND TOK IS NOT NULL      (no WHERE)
//
// A row with an epoch above the token is left alone, and the stale flag is
// raised only for rows the client's own COND matched. TOK IS NOT NULL is a
// pseudo-constant qual, so a missing token errors even when no row matches.
func (r *Rewriter) fenceEdits(sql string, st stmtTokens, t *target) ([]edit, error) {
	c, err := st.clauses(t)
	if err != nil {
		return nil, err
	}
	g := t.guard
	var edits []edit
	if c.set >= 0 {
		edits = append(edits, edit{c.set, " " + g.column + " = " + g.token + ","})
	}
	epochOK := t.ref() + "." + g.column + " OPERATOR(pg_catalog.<=) " + g.token
	stale := "pg_catalog.set_config(" + quoteLiteral(staleSetting) + ", " + quoteLiteral("1") + ", true) IS NULL"
	notNull := " AND " + g.token + " IS NOT NULL"
	if c.glued {
		notNull += " " // "... IS NOT NULL RETURNING", not "NULLRETURNING"
	}
	if c.condStart < 0 {
		return append(edits, edit{c.condEnd, " WHERE (" + epochOK + " OR " + stale + ")" + notNull}), nil
	}
	cond := sql[c.condStart:c.condEnd]
	return append(edits,
		edit{c.condStart, "("},
		edit{c.condEnd, ") AND (" + epochOK + " OR ((" + cond + ") AND " + stale + "))" + notNull},
	), nil
}

// clauses are the byte offsets where a fence goes into one statement.
type clauses struct {
	set       int  // end of the SET keyword; -1 for DELETE
	condStart int  // start of the WHERE condition; -1 without WHERE
	condEnd   int  // end of the condition, or where a WHERE would end
	glued     bool // RETURNING follows condEnd without a space
}

// clauses finds the SET, WHERE and RETURNING keywords of t at paren depth 0
// after the target name, so subqueries and strings cannot mislead it, and
// checks them against the parse tree.
func (st stmtTokens) clauses(t *target) (clauses, error) {
	relLoc := int(t.rel.Location)
	c := clauses{set: -1, condStart: -1}
	where := st.first(pg_query.Token_WHERE, relLoc)
	ret := st.first(pg_query.Token_RETURNING, relLoc)
	if (where >= 0) != t.hasWhere || (ret >= 0) != t.hasRet {
		return c, fmt.Errorf("sqlrewrite: tokens disagree with the parse tree for %s at byte %d", t.kind, relLoc)
	}
	if t.kind == "UPDATE" {
		// The last SET before the first target: an alias may be spelled set.
		set := st.lastBefore(pg_query.Token_SET, relLoc, t.firstSet)
		if set < 0 {
			return c, fmt.Errorf("sqlrewrite: no SET keyword for UPDATE at byte %d", relLoc)
		}
		c.set = int(st.toks[set].End)
	}
	limit := len(st.toks) // COND ends before a top-level RETURNING
	if ret >= 0 {
		limit = ret
	}
	end := st.lastCode(limit)
	if end < 0 || where >= 0 && end <= where {
		return c, fmt.Errorf("sqlrewrite: no condition end for %s at byte %d", t.kind, relLoc)
	}
	c.condEnd = int(st.toks[end].End)
	c.glued = ret >= 0 && int(st.toks[ret].Start) == c.condEnd
	if where >= 0 {
		c.condStart = int(st.toks[where+1].Start) // comments right after WHERE stay in COND
	}
	return c, nil
}

// ref is how the statement's WHERE names the target row: its alias, else
// its (qualified, if the client qualified it) name.
func (t *target) ref() string {
	if a := t.rel.GetAlias().GetAliasname(); a != "" {
		return quoteIdent(a)
	}
	if t.rel.Schemaname != "" {
		return quoteIdent(t.rel.Schemaname) + "." + quoteIdent(t.rel.Relname)
	}
	return quoteIdent(t.rel.Relname)
}

// apply performs edits, in offset order (stable for equal offsets).
func apply(sql string, edits []edit) string {
	slices.SortStableFunc(edits, func(a, b edit) int { return a.at - b.at })
	var b strings.Builder
	n := len(sql)
	for _, e := range edits {
		n += len(e.text)
	}
	b.Grow(n)
	prev := 0
	for _, e := range edits {
		b.WriteString(sql[prev:e.at])
		b.WriteString(e.text)
		prev = e.at
	}
	b.WriteString(sql[prev:])
	return b.String()
}

// stmtTokens are the scanner tokens of one statement with the paren/bracket
// depth at each, counted from the statement's start.
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

// first is the index of the first top-level kind token starting at or after
// from, or -1.
func (st stmtTokens) first(kind pg_query.Token, from int) int {
	for i, t := range st.toks {
		if t.Token == kind && st.depth[i] == 0 && int(t.Start) >= from {
			return i
		}
	}
	return -1
}

// lastBefore is the index of the last top-level kind token starting in
// [from, before), or -1.
func (st stmtTokens) lastBefore(kind pg_query.Token, from, before int) int {
	found := -1
	for i, t := range st.toks {
		if t.Token == kind && st.depth[i] == 0 && int(t.Start) >= from && int(t.Start) < before {
			found = i
		}
	}
	return found
}

// lastCode is the index of the last non-comment token before index limit,
// or -1.
func (st stmtTokens) lastCode(limit int) int {
	for i := limit - 1; i >= 0; i-- {
		if k := st.toks[i].Token; k != pg_query.Token_SQL_COMMENT && k != pg_query.Token_C_COMMENT {
			return i
		}
	}
	return -1
}
