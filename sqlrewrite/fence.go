package sqlrewrite

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// edit replaces del bytes of the client's SQL at byte offset at with text.
// Fencing inserts, except that DEFAULT VALUES loses its DEFAULT.
type edit struct {
	at   int
	del  int
	text string
}

// build fences the writes the plans found, adds the probes and fills in
// res; tokens are the text's, from the scanner.
func (r *Rewriter) build(res *Result, stmts []*pg_query.RawStmt, plans []*plan, mode Mode, tokens []*pg_query.ScanToken) (*Result, error) {
	sql := res.SQL
	var edits []edit
	for i, p := range plans {
		if len(p.writes) == 0 {
			continue
		}
		st := stmtTokensOf(tokens, stmts[i], len(sql))
		for _, w := range p.writes {
			res.Fenced = append(res.Fenced, Fenced{Table: w.guard.name, Kind: w.kind, Rollout: w.guard.Rollout, Nested: w.nested, Backstop: w.backstop})
		}
		tables := p.tables()
		if p.prepare != "" {
			pw := PreparedWrite{Name: p.prepare}
			for _, g := range tables {
				pw.Tables = append(pw.Tables, g.name)
			}
			res.Prepared = append(res.Prepared, pw)
		}
		if p.fence {
			es, err := r.fenceStmt(sql, st, p.writes)
			if err != nil {
				return nil, err
			}
			edits = append(edits, es...)
		}
		if len(p.domains) > 0 {
			e, err := r.domainEdit(sql, st, p)
			if err != nil {
				return nil, err
			}
			edits = append(edits, e)
		}
		if !p.probe || p.copyIn && mode != Simple {
			// In the extended protocol the proxy would send the probe
			// right after the Execute, which puts the server in copy-in
			// mode, where any message but the copy's is a protocol
			// violation: a COPY FROM there goes without it (the backstop,
			// which alone lets it through, counts its rejects).
			continue
		}
		pr := Probe{Index: -1, SQL: r.probeSQL(tables)}
		for _, g := range tables {
			pr.Tables = append(pr.Tables, ProbeTable{Table: g.name, Rollout: g.Rollout, Domain: g.Domain, Guard: g.index})
		}
		if mode == Simple {
			last := st.lastCode(len(st.toks))
			if last < 0 {
				return nil, fmt.Errorf("sqlrewrite: statement %d has no tokens", i)
			}
			// Right after the statement's last token: never after a
			// trailing -- comment, and before the client's own ';'.
			edits = append(edits, edit{at: st.end(last), text: ";" + pr.SQL})
			pr.Index = i + len(res.Probes) + 1
		}
		res.Probes = append(res.Probes, pr)
	}
	slices.SortStableFunc(edits, func(a, b edit) int { return a.at - b.at })
	res.SQL, res.edits = apply(sql, edits), edits
	return res, nil
}

// probeSQL reads the token, the transaction's tag (flagTag) and, per
// table, the stale flag, the domain stale flag and the domain's token, and
// clears the flags (the layout Probe.Outcome reads, which takes a flag for
// raised only if it holds the tag). Observe tables raise no flag, and
// tables not fenced by a lock domain no domain flag and have no token of
// their own: their columns are NULL.
func (r *Rewriter) probeSQL(tables []*guardInfo) string {
	var b strings.Builder
	b.WriteString("SELECT pg_catalog.current_setting(" + quoteLiteral(r.setting) + ", true), " + flagTag)
	for _, g := range tables {
		if g.Rollout == Observe {
			b.WriteString(", NULL::pg_catalog.text")
		} else {
			b.WriteString(", pg_catalog.current_setting(" + g.flag + ", true)")
		}
		if g.domainFenced() {
			b.WriteString(", pg_catalog.current_setting(" + g.dflag + ", true)")
		} else {
			b.WriteString(", NULL::pg_catalog.text")
		}
		if g.domain != nil {
			b.WriteString(", " + g.domain.text)
		} else {
			b.WriteString(", NULL::pg_catalog.text")
		}
	}
	for _, g := range tables {
		if g.Rollout != Observe {
			b.WriteString(", pg_catalog.set_config(" + g.flag + ", " + quoteLiteral("") + ", true)")
		}
		if g.domainFenced() {
			b.WriteString(", pg_catalog.set_config(" + g.dflag + ", " + quoteLiteral("") + ", true)")
		}
	}
	return b.String()
}

// fenceStmt returns the edits that fence the writes of one top-level
// statement. The innermost go first: a fence repeats its statement's
// condition, and a write nested in that condition must be fenced in the
// copy too.
func (r *Rewriter) fenceStmt(sql string, st stmtTokens, writes []*write) ([]edit, error) {
	type job struct {
		w  *write
		sp span
	}
	var jobs []job
	for _, w := range writes {
		if w.node == nil {
			continue
		}
		sp, err := st.spanOf(writeRelation(w.node))
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, job{w, sp})
	}
	slices.SortStableFunc(jobs, func(a, b job) int { return cmp.Compare(b.sp.level, a.sp.level) })
	var edits []edit
	for _, j := range jobs {
		var es []edit
		var err error
		switch n := j.w.node.(type) {
		case *pg_query.UpdateStmt:
			es, err = r.fenceUpdate(sql, j.sp, n, j.w.guard, edits)
		case *pg_query.DeleteStmt:
			es, err = r.fenceDelete(sql, j.sp, n, j.w.guard, edits)
		case *pg_query.InsertStmt:
			es, err = r.fenceInsert(sql, j.sp, n, j.w.guard, edits)
		}
		if err != nil {
			return nil, err
		}
		edits = append(edits, es...)
	}
	return edits, nil
}

// fenceUpdate fences an UPDATE:
//
//	SET C = <set value>, ...
//	WHERE (COND) AND <fence>            (see fenceWhere)
func (r *Rewriter) fenceUpdate(sql string, sp span, n *pg_query.UpdateStmt, g *guardInfo, done []edit) ([]edit, error) {
	firstSet := -1
	for _, rt := range n.TargetList {
		if loc := int(rt.GetResTarget().GetLocation()); firstSet < 0 || loc < firstSet {
			firstSet = loc
		}
	}
	// The last SET before the first target: an alias may be spelled set.
	set := sp.lastBefore(pg_query.Token_SET, sp.rel+1, firstSet)
	if set < 0 {
		return nil, fmt.Errorf("sqlrewrite: no SET keyword for UPDATE at byte %d", n.Relation.Location)
	}
	ref := refOf(n.Relation)
	limit, err := sp.returning(n.ReturningList)
	if err != nil {
		return nil, err
	}
	where, err := r.fenceWhere(sql, sp, g, ref, set+1, limit, n.WhereClause != nil, false, done)
	if err != nil {
		return nil, err
	}
	return append(where, edit{at: sp.end(set), text: " " + g.column + " = " + g.setValue(ref) + ","}), nil
}

func (r *Rewriter) fenceDelete(sql string, sp span, n *pg_query.DeleteStmt, g *guardInfo, done []edit) ([]edit, error) {
	limit, err := sp.returning(n.ReturningList)
	if err != nil {
		return nil, err
	}
	return r.fenceWhere(sql, sp, g, refOf(n.Relation), sp.rel+1, limit, n.WhereClause != nil, false, done)
}

// returning is the index of the statement's RETURNING keyword, or its end
// without one.
func (sp span) returning(list []*pg_query.Node) (int, error) {
	if len(list) == 0 {
		return sp.stop, nil
	}
	loc := int(list[0].GetResTarget().GetLocation())
	ret := sp.lastBefore(pg_query.Token_RETURNING, sp.rel+1, loc)
	if ret < 0 {
		return 0, fmt.Errorf("sqlrewrite: no RETURNING keyword before byte %d", loc)
	}
	return ret, nil
}

// fenceWhere fences the WHERE of an UPDATE, a DELETE or an ON CONFLICT DO
// UPDATE whose WHERE keyword, if any, is in tokens [from, limit) and whose
// condition ends before limit. With T the guard's token expression, OK the
// epoch check REF.C <= T and FLAG setting its stale flag:
//
//	Enforce:       WHERE (COND) AND (OK OR ((COND) AND FLAG IS NULL)) AND GATE
//	allow-missing: WHERE (COND) AND (T IS NULL OR OK OR ((COND) AND FLAG IS NULL))
//	Shadow:        WHERE (COND) AND (T IS NULL OR OK OR ((COND) AND FLAG IS NOT NULL))
//
// and without a client WHERE the same without the (COND) AND parts. A row
// with an epoch above the token is left alone (Enforce) or written and
// flagged (Shadow, as set_config returns its value), and the flag is raised
// only for rows the client's own COND matched, whatever order the planner
// evaluates the quals in. Enforce (strict) uses TOKC and GATE (see
// strictCheck): OK is pg_catalog.int8le(REF.C, TOKC), and GATE is a
// pseudo-constant qual, so a missing or malformed token errors even when
// no row matches. checked leaves GATE out, where the token has been
// checked before the WHERE can run: an ON CONFLICT DO UPDATE only runs for
// a row the INSERT has stamped (see rowStamp), and GATE there would be
// evaluated again for every conflicting row (a prepared three-row upsert
// ran at 0.90 of the fence by hand with it, 0.96 without, straight to
// Postgres).
//
// In a lock domain (Enforce only), OK also needs the domain claimed, and
// FLAG raises the domain flag when it was not, else the stale flag; all in
// one qual, whose parts the planner keeps in order:
//
//	OK:   (EXISTS (SELECT 1 FROM "pgfence_domain_K") AND REF.C <= T)
//	FLAG: pg_catalog.set_config(CASE WHEN EXISTS (SELECT 1 FROM "pgfence_domain_K") THEN <stale flag> ELSE <domain flag> END,
//	                            CASE WHEN EXISTS (...) THEN <greatest stale epoch> ELSE <domain's token> END, true)
//
// A flag's value is what beat the token (see staleValue, domainRaise).
func (r *Rewriter) fenceWhere(sql string, sp span, g *guardInfo, ref string, from, limit int, hasWhere, checked bool, done []edit) ([]edit, error) {
	where := sp.first(pg_query.Token_WHERE, from, limit)
	if (where >= 0) != hasWhere {
		return nil, fmt.Errorf("sqlrewrite: tokens disagree with the parse tree about the WHERE after byte %d", sp.start(sp.rel))
	}
	last := sp.lastCode(limit)
	if last < sp.rel || where >= 0 && last <= where {
		return nil, fmt.Errorf("sqlrewrite: no condition end after byte %d", sp.start(sp.rel))
	}
	condEnd := sp.end(last)
	// A function call, not the operator: see strictCheck.
	epochOK := "pg_catalog.int8le(" + ref + "." + g.column + ", " + g.cast + ")"
	if g.Rollout == Shadow || g.AllowMissingToken {
		epochOK = ref + "." + g.column + " OPERATOR(pg_catalog.<=) " + g.tok
	}
	raise := g.raise(g.flag, g.staleValue(ref))
	if g.domainFenced() {
		epochOK, raise = "("+g.domain.exists+" AND "+epochOK+")", g.domainRaise(ref)
	}
	stale, lead, gate := raise+" IS NULL", epochOK, " AND "+g.gate
	if checked {
		gate = ""
	}
	switch {
	case g.Rollout == Shadow:
		stale, lead, gate = raise+" IS NOT NULL", g.tok+" IS NULL OR "+epochOK, ""
	case g.AllowMissingToken:
		lead, gate = g.tok+" IS NULL OR "+epochOK, ""
	}
	if where < 0 {
		return []edit{{at: condEnd, text: pad(sql, condEnd, " WHERE ("+lead+" OR "+stale+")"+gate)}}, nil
	}
	condStart := sp.start(where + 1) // comments right after WHERE stay in COND
	cond := applyRange(sql, condStart, condEnd, done)
	return []edit{
		{at: condStart, text: "("},
		{at: condEnd, text: pad(sql, condEnd, ") AND ("+lead+" OR (("+cond+") AND "+stale+"))"+gate)},
	}, nil
}

// raise is the expression that raises flag to value, and returns value:
// set_config's, or, where the database has it (Config.StaleNotice), the
// backstop's helper, which also raises a notice saying so.
func (g *guardInfo) raise(flag, value string) string {
	if g.notice {
		return "pgfence.note_stale(" + flag + ", " + value + ")"
	}
	return "pg_catalog.set_config(" + flag + ", " + value + ", true)"
}

// unknownEpoch stands in a stale flag for an epoch pgfence cannot know (a
// NULL epoch, a lock domain without its row): the flag must never be set
// to NULL, as set_config would then return NULL and let the row be written.
const unknownEpoch = "?"

// staleValue is what a stale row of ref sets the guard's stale flag to
// (see flagValue): its epoch, as text, so that the probe can say which
// epoch beat the token (the last stale row's, when there are several). It
// only runs for stale rows, and is kept short: Postgres 15.18 has a crash
// that longer Parse texts make likelier (see TestNoNamedParseInFailedBlock).
func (g *guardInfo) staleValue(ref string) string {
	return flagValue(g.epochText(ref))
}

// epochText is the epoch of ref's row as text, unknownEpoch for NULL.
func (g *guardInfo) epochText(ref string) string {
	return "COALESCE(CAST(" + ref + "." + g.column + " AS pg_catalog.text), " + quoteLiteral(unknownEpoch) + ")"
}

// flagValue is what a flag is raised to: the start of the transaction as
// text (flagTag), then ':' and v, what beat the token. A client can set a
// flag too, with a name pgfence cannot see in its text (computed, or in a
// function): the probe only takes a flag that holds its own transaction's
// start, which no value set in an earlier transaction holds (see
// probeSQL). Both read the time with the session's DateStyle and
// TimeZone, which the client cannot change between a write and its probe
// but from inside the write. It is as short as it can be, as staleValue
// must be.
func flagValue(v string) string {
	return "pg_catalog.format(E'%s:%s', pg_catalog.now(), " + v + ")"
}

// flagTag is the tag flagValue puts in front of a flag's value, as the
// probe reads it: the transaction's start, which Postgres sends as text
// (the probe's results are text) as format's %s writes it.
const flagTag = "pg_catalog.now()"

// setValue is what an UPDATE (or DO UPDATE) sets the epoch to: the token
// (Enforce: the plain cast TOKC, as GATE has already failed the statement
// for a token it cannot cast), the token or else the row's epoch
// (allow-missing), or the greater of the row's epoch and the token,
// GREATEST ignoring a NULL token (Shadow).
func (g *guardInfo) setValue(ref string) string {
	switch {
	case g.Rollout == Shadow:
		return "GREATEST(" + ref + "." + g.column + ", " + g.tok + ")"
	case g.AllowMissingToken:
		return "COALESCE(" + g.tok + ", " + ref + "." + g.column + ")"
	}
	return g.cast
}

// fenceInsert stamps the rows an INSERT adds with the epoch column, and
// fences its ON CONFLICT DO UPDATE like an UPDATE:
//
//	INSERT INTO t (a) VALUES (1), (2)  ->  INSERT INTO t (a, C) VALUES (1, V), (2, V)
//	INSERT INTO t (a) SELECT x FROM s  ->  INSERT INTO t (a, C) SELECT x, V FROM s
//	INSERT INTO t (a) <set operation>  ->  INSERT INTO t (a, C) SELECT pgfence_rows.*, V FROM (<set operation>) AS pgfence_rows
//	INSERT INTO t DEFAULT VALUES       ->  INSERT INTO t (C) VALUES (V)
//
// A set operation has already resolved its unknown-typed literals to text,
// so selecting from it keeps its meaning; a plain SELECT's literals would
// not stay unknown in a subquery, so it gets the value in its own target
// list.
func (r *Rewriter) fenceInsert(sql string, sp span, n *pg_query.InsertStmt, g *guardInfo, done []edit) ([]edit, error) {
	var edits []edit
	bodyEnd, err := sp.returning(n.ReturningList)
	if err != nil {
		return nil, err
	}
	retEnd := bodyEnd
	on := -1
	if oc := n.OnConflictClause; oc != nil {
		if on = sp.at(int(oc.Location)); on < 0 || !sp.keyword(on, pg_query.Token_ON) {
			return nil, fmt.Errorf("sqlrewrite: no ON keyword at byte %d", oc.Location)
		}
		bodyEnd = on
	}
	sel := n.SelectStmt.GetSelectStmt()
	if sel == nil {
		if n.SelectStmt != nil || len(n.Cols) > 0 {
			return nil, fmt.Errorf("sqlrewrite: INSERT at byte %d has an unexpected source", n.Relation.Location)
		}
		def := sp.first(pg_query.Token_DEFAULT, sp.rel+1, bodyEnd)
		vals := -1
		if def >= 0 {
			vals = sp.nextCode(def+1, bodyEnd)
		}
		if vals < 0 || !sp.keyword(vals, pg_query.Token_VALUES) {
			return nil, fmt.Errorf("sqlrewrite: no DEFAULT VALUES in INSERT at byte %d", n.Relation.Location)
		}
		edits = append(edits,
			edit{at: sp.start(def), del: sp.end(def) - sp.start(def), text: "(" + g.column + ")"},
			edit{at: sp.end(vals), text: " (" + g.insert + ")"})
	} else {
		es, err := r.stampSelect(sql, sp, n, sel, g, bodyEnd)
		if err != nil {
			return nil, err
		}
		edits = append(edits, es...)
	}
	if oc := n.OnConflictClause; oc != nil && oc.Action == pg_query.OnConflictAction_ONCONFLICT_UPDATE {
		firstSet := -1
		for _, rt := range oc.TargetList {
			if loc := int(rt.GetResTarget().GetLocation()); firstSet < 0 || loc < firstSet {
				firstSet = loc
			}
		}
		set := sp.lastBefore(pg_query.Token_SET, on, firstSet)
		if set < 0 {
			return nil, fmt.Errorf("sqlrewrite: no SET keyword for ON CONFLICT DO UPDATE at byte %d", oc.Location)
		}
		ref := refOf(n.Relation)
		edits = append(edits, edit{at: sp.end(set), text: " " + g.column + " = " + g.setValue(ref) + ","})
		// The DO UPDATE of a row runs after the row's epoch value, the first
		// of which checked the token (see rowStamp): it needs no GATE.
		where, err := r.fenceWhere(sql, sp, g, ref, set+1, retEnd, oc.WhereClause != nil, true, done)
		if err != nil {
			return nil, err
		}
		edits = append(edits, where...)
	}
	return edits, nil
}

// stampSelect adds the epoch column to an INSERT's column list and its
// value to the rows of its source, which ends before token bodyEnd.
func (r *Rewriter) stampSelect(sql string, sp span, n *pg_query.InsertStmt, sel *pg_query.SelectStmt, g *guardInfo, bodyEnd int) ([]edit, error) {
	if len(n.Cols) == 0 {
		return nil, fmt.Errorf("sqlrewrite: INSERT at byte %d has no column list", n.Relation.Location)
	}
	lastCol := sp.at(int(n.Cols[len(n.Cols)-1].GetResTarget().GetLocation()))
	closeCols := -1
	if lastCol >= 0 {
		closeCols = sp.closing(')', sp.level, lastCol, bodyEnd)
	}
	if closeCols < 0 {
		return nil, fmt.Errorf("sqlrewrite: no end of the column list of INSERT at byte %d", n.Relation.Location)
	}
	edits := []edit{{at: sp.start(closeCols), text: ", " + g.column}}
	body := closeCols + 1
	if n.Override != pg_query.OverridingKind_OVERRIDING_NOT_SET {
		v := sp.first(pg_query.Token_VALUE_P, body, bodyEnd)
		if v < 0 {
			return nil, fmt.Errorf("sqlrewrite: no OVERRIDING ... VALUE in INSERT at byte %d", n.Relation.Location)
		}
		body = v + 1
	}
	start := sp.nextCode(body, bodyEnd)
	if start < 0 {
		return nil, fmt.Errorf("sqlrewrite: no source rows in INSERT at byte %d", n.Relation.Location)
	}
	// The source's own level: inside any parens that open it.
	level := sp.level
	for k := start; k >= 0 && sp.toks[k].Token == '('; k = sp.nextCode(k+1, bodyEnd) {
		level++
	}
	src := span{stmtTokens: sp.stmtTokens, rel: start, stop: bodyEnd, level: level}
	plain := sel.Op == pg_query.SetOperation_SETOP_NONE
	switch {
	case plain && len(sel.ValuesLists) > 0:
		return src.stampValues(edits, sel, g, n)
	case plain && len(sel.TargetList) > 0 && sel.TargetList[len(sel.TargetList)-1].GetResTarget().GetLocation() >= 0:
		return src.stampTargets(sql, edits, sel, g, n)
	}
	// A set operation, TABLE t or an empty target list: select from it.
	last := sp.lastCode(bodyEnd)
	return append(edits,
		edit{at: sp.start(start), text: pad(sql, sp.start(start), "SELECT pgfence_rows.*, "+g.insert+" FROM (")},
		edit{at: sp.end(last), text: pad(sql, sp.end(last), ") AS pgfence_rows")}), nil
}

// stampValues adds V before the ')' of each VALUES row.
func (src span) stampValues(edits []edit, sel *pg_query.SelectStmt, g *guardInfo, n *pg_query.InsertStmt) ([]edit, error) {
	vals := src.first(pg_query.Token_VALUES, src.rel, src.stop)
	rows := 0
	for k := -1; vals >= 0; {
		if k < 0 {
			k = src.nextCode(vals+1, src.stop)
		}
		if k < 0 || src.toks[k].Token != '(' || src.depth[k] != src.level {
			break
		}
		closeRow := src.closing(')', src.level, k+1, src.stop)
		if closeRow < 0 {
			break
		}
		edits = append(edits, edit{at: src.start(closeRow), text: ", " + g.rowStamp(rows)})
		rows++
		k = src.nextCode(closeRow+1, src.stop)
		if k < 0 || src.toks[k].Token != ',' || src.depth[k] != src.level {
			break
		}
		k = src.nextCode(k+1, src.stop)
	}
	if vals < 0 || rows != len(sel.ValuesLists) {
		return nil, fmt.Errorf("sqlrewrite: found %d VALUES rows in INSERT at byte %d, the parse tree has %d", rows, n.Relation.Location, len(sel.ValuesLists))
	}
	return edits, nil
}

// rowStamp is the epoch value of row i (from 0) of an INSERT's VALUES
// list. The first row reads and checks the token (V); the others, under a
// strict guard, stamp what needs no check: outside a lock domain the cast
// of the setting (TOKC), as the UPDATE does, and in one the claimed token
// (see fenceByDomain). Postgres computes VALUES rows in order, so a
// missing or malformed token has failed the statement at the first row
// with pgfence's error before a later row casts it, and a token the check
// passed casts to the same number. That spares Postgres the check per row.
func (g *guardInfo) rowStamp(i int) string {
	if i > 0 && g.insertLater != "" {
		return g.insertLater
	}
	return g.insert
}

// stampTargets adds V after the last target of a plain SELECT: before the
// first clause keyword at the SELECT's level after that target's start.
func (src span) stampTargets(sql string, edits []edit, sel *pg_query.SelectStmt, g *guardInfo, n *pg_query.InsertStmt) ([]edit, error) {
	loc := int(sel.TargetList[len(sel.TargetList)-1].GetResTarget().GetLocation())
	t := src.at(loc)
	if t < 0 || t < src.rel || t >= src.stop || src.depth[t] != src.level {
		return nil, fmt.Errorf("sqlrewrite: no last target at byte %d in INSERT at byte %d", loc, n.Relation.Location)
	}
	stop := src.stop
	for k := t + 1; k < src.stop; k++ {
		if src.depth[k] < src.level {
			stop = k
			break
		}
		if src.endsTargets(k) {
			stop = k
			break
		}
	}
	last := src.lastCode(stop)
	if last < t {
		return nil, fmt.Errorf("sqlrewrite: no end of the last target in INSERT at byte %d", n.Relation.Location)
	}
	return append(edits, edit{at: src.end(last), text: pad(sql, src.end(last), ", "+g.insert)}), nil
}

// endsTargets reports whether token k starts the clause after a SELECT's
// target list.
func (src span) endsTargets(k int) bool {
	switch src.toks[k].Token {
	case pg_query.Token_FROM:
		// Not the FROM of IS [NOT] DISTINCT FROM.
		if !src.keyword(k, pg_query.Token_FROM) {
			return false
		}
		if p := src.lastCode(k); p >= 0 && src.toks[p].Token == pg_query.Token_DISTINCT {
			if pp := src.lastCode(p); pp >= 0 {
				switch src.toks[pp].Token {
				case pg_query.Token_IS, pg_query.Token_NOT, pg_query.Token_NOT_LA:
					return false
				}
			}
		}
		return true
	case pg_query.Token_GROUP_P:
		// Not WITHIN GROUP.
		p := src.lastCode(k)
		return src.keyword(k, pg_query.Token_GROUP_P) && (p < 0 || src.toks[p].Token != pg_query.Token_WITHIN)
	case pg_query.Token_WHERE, pg_query.Token_HAVING, pg_query.Token_WINDOW, pg_query.Token_ORDER,
		pg_query.Token_LIMIT, pg_query.Token_OFFSET, pg_query.Token_FETCH, pg_query.Token_FOR,
		pg_query.Token_INTO, pg_query.Token_ON, pg_query.Token_RETURNING:
		return src.keyword(k, src.toks[k].Token)
	}
	return false
}

// refOf is how a statement's WHERE names the target row: its alias, else
// its (qualified, if the client qualified it) name.
func refOf(rv *pg_query.RangeVar) string {
	if a := rv.GetAlias().GetAliasname(); a != "" {
		return quoteIdent(a)
	}
	if rv.Schemaname != "" {
		return quoteIdent(rv.Schemaname) + "." + quoteIdent(rv.Relname)
	}
	return quoteIdent(rv.Relname)
}

// pad puts a space around text inserted at byte offset at where it would
// otherwise run into the client's neighbouring token.
func pad(sql string, at int, text string) string {
	if text == "" {
		return text
	}
	if at > 0 && wordByte(sql[at-1]) && wordByte(text[0]) {
		text = " " + text
	}
	if at < len(sql) && wordByte(sql[at]) && wordByte(text[len(text)-1]) {
		text += " "
	}
	return text
}

func wordByte(c byte) bool { return isIdentCont(c) || c == '"' || c == '\'' }

// apply performs edits, in offset order (stable for equal offsets).
func apply(sql string, edits []edit) string {
	return applyRange(sql, 0, len(sql), edits)
}

// applyRange returns sql[from:to] with the edits that fall inside it.
func applyRange(sql string, from, to int, edits []edit) string {
	var in []edit
	for _, e := range edits {
		if e.at >= from && e.at+e.del <= to {
			in = append(in, e)
		}
	}
	slices.SortStableFunc(in, func(a, b edit) int { return a.at - b.at })
	var b strings.Builder
	n := to - from
	for _, e := range in {
		n += len(e.text)
	}
	b.Grow(n)
	prev := from
	for _, e := range in {
		b.WriteString(sql[prev:e.at])
		b.WriteString(e.text)
		prev = e.at + e.del
	}
	b.WriteString(sql[prev:to])
	return b.String()
}
