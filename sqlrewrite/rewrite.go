package sqlrewrite

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// write is one guarded write found in a top-level statement.
type write struct {
	kind   string // Fenced.Kind
	guard  *guardInfo
	pos    int  // byte offset, for text order
	nested bool // not the top-level statement itself
	// node is the UpdateStmt, DeleteStmt or InsertStmt whose text gets the
	// fence; nil when the write passes untouched (Observe, allowed forms,
	// forms the table's backstop fences, EXECUTE).
	node proto.Message
	// backstop is Fenced.Backstop: a form the rewriter cannot fence passes
	// untouched because the table's database backstop fences it.
	backstop bool
}

// plan is what to do with one top-level statement.
type plan struct {
	writes  []*write // text order
	probe   bool     // a probe follows the statement
	copyIn  bool     // the statement is COPY ... FROM
	prepare string   // the name, when the statement PREPAREs a guarded write
	fence   bool     // some write's text gets a fence
	// domains are the lock domains whose WITH queries the statement's
	// top-level query outer gets, in index order.
	domains []*domainInfo
	outer   proto.Message
}

// Rewrite fences every write of a guarded table in sql, wherever it is
// nested, and adds a probe after each top-level statement that writes one;
// or it refuses the whole text if any statement writes a guarded table in a
// way pgfence cannot fence. s, which may be nil, says what the session has
// PREPAREd. Rewrite returns an error only for internal failures; refusals
// are in Result.Refusal.
func (r *Rewriter) Rewrite(sql string, mode Mode, s Session) (*Result, error) {
	cl := r.Classify(sql)
	if untouched(cl, s) {
		return &Result{SQL: sql}, nil
	}
	return r.rewrite(sql, mode, s, cl, MayBeDDL(sql, cl))
}

// RewriteAnalyzed is Rewrite for a text that a is r's analysis of (sql
// may be a copy of it), so that it is not scanned again.
func (r *Rewriter) RewriteAnalyzed(sql string, mode Mode, s Session, a *Analysis) (*Result, error) {
	if untouched(a.Class, s) {
		return &Result{SQL: sql}, nil
	}
	return r.rewrite(sql, mode, s, a.Class, a.MayBeDDL())
}

// untouched reports whether a text of class cl, in a session s, can
// neither name a guarded table nor EXECUTE a prepared write.
func untouched(cl Class, s Session) bool {
	return !cl.Has(Touches) && (s == nil || !cl.Has(Executes))
}

// rewrite is Rewrite of a text of class cl that may name a guarded table
// or EXECUTE a prepared write; ddl says whether it may be DDL (MayBeDDL).
func (r *Rewriter) rewrite(sql string, mode Mode, s Session, cl Class, ddl bool) (*Result, error) {
	if !cl.Has(Writes) && !ddl {
		return &Result{SQL: sql}, nil
	}
	if strings.IndexByte(sql, 0) >= 0 {
		// The parser would stop at the NUL and leave the rest unchecked.
		return refused(syntaxError("query text contains a NUL byte")), nil
	}
	if r.maxParse > 0 && len(sql) > r.maxParse {
		return refused(tooLarge(len(sql), r.maxParse)), nil
	}
	// The scanner costs a quarter of the parser: a text without a write
	// keyword (a SELECT naming a guarded table) needs no more.
	counted("parse", sql)
	scan, err := pg_query.Scan(sql)
	if err == nil && !hasKeyword(scan.Tokens, writeKeywords[:]) && (!ddl || !hasKeyword(scan.Tokens, ddlKeywords[:])) {
		return &Result{SQL: sql}, nil
	}
	counted("parse", sql)
	tree, err := pg_query.Parse(sql)
	if err != nil {
		// The server's grammar may read it (see skew.go): fail closed, and
		// say why.
		return refused(r.unparsable(err)), nil
	}
	res := &Result{SQL: sql}
	plans := make([]*plan, len(tree.Stmts))
	writes := false
	names := &preparedNames{session: s}
	for i, raw := range tree.Stmts {
		p, ref := r.plan(raw.Stmt, names)
		if ref != nil {
			return refused(ref), nil
		}
		plans[i] = p
		names.track(inner(raw.Stmt), p)
		writes = writes || len(p.writes) > 0
	}
	res.SessionDependent = names.asked
	if !writes {
		return res, nil
	}
	res.NoRows = len(tree.Stmts) == 1 && returnsNoRows(tree.Stmts[0].Stmt)
	if scan == nil {
		return nil, errors.New("sqlrewrite: text that parsed did not scan")
	}
	return r.build(res, tree.Stmts, plans, mode, scan.Tokens)
}

// writeKeywords are the keywords of every statement the rewriter fences,
// refuses or probes (see visit): a text without any of them, outside its
// literals, identifiers and comments, passes unchanged.
var writeKeywords = [...]pg_query.Token{
	pg_query.Token_INSERT, pg_query.Token_UPDATE, pg_query.Token_DELETE_P, pg_query.Token_MERGE,
	pg_query.Token_TRUNCATE, pg_query.Token_COPY, pg_query.Token_EXECUTE,
}

// writeRelation is the table an UPDATE, DELETE or INSERT writes, nil for
// any other node.
func writeRelation(m proto.Message) *pg_query.RangeVar {
	switch n := m.(type) {
	case *pg_query.UpdateStmt:
		return n.Relation
	case *pg_query.DeleteStmt:
		return n.Relation
	case *pg_query.InsertStmt:
		return n.Relation
	}
	return nil
}

// returnsNoRows reports whether a statement is an INSERT, UPDATE or DELETE
// without RETURNING.
func returnsNoRows(n *pg_query.Node) bool {
	switch s := inner(n).(type) {
	case *pg_query.InsertStmt:
		return len(s.ReturningList) == 0
	case *pg_query.UpdateStmt:
		return len(s.ReturningList) == 0
	case *pg_query.DeleteStmt:
		return len(s.ReturningList) == 0
	}
	return false
}

func refused(ref *Refusal) *Result {
	return &Result{SQL: refusalSQL(ref), Refusal: ref}
}

// preparedNames knows which SQL-level prepared statements write guarded
// tables: those the text itself PREPAREs (or DEALLOCATEs) before an
// EXECUTE, else those the Session reports.
type preparedNames struct {
	session Session
	local   map[string][]*guardInfo // PREPAREd or DEALLOCATEd earlier in the text
	dropAll bool                    // DEALLOCATE ALL earlier in the text
	asked   bool                    // the Session was asked
}

// lookup returns the guarded tables EXECUTE name writes.
func (n *preparedNames) lookup(r *Rewriter, name string) []*guardInfo {
	if gs, ok := n.local[name]; ok || n.dropAll {
		return gs
	}
	if n.session == nil {
		return nil
	}
	n.asked = true
	var gs []*guardInfo
	for _, t := range n.session.PreparedWrite(name) {
		if g := r.guardNamed(t); g != nil && !slices.Contains(gs, g) {
			gs = append(gs, g)
		}
	}
	return gs
}

// track notes a top-level PREPARE or DEALLOCATE.
func (n *preparedNames) track(top proto.Message, p *plan) {
	switch t := top.(type) {
	case *pg_query.PrepareStmt:
		if n.local == nil {
			n.local = map[string][]*guardInfo{}
		}
		n.local[t.Name] = p.tables()
	case *pg_query.DeallocateStmt:
		if t.Isall || t.Name == "" {
			n.local, n.dropAll = nil, true
			return
		}
		if n.local == nil {
			n.local = map[string][]*guardInfo{}
		}
		n.local[t.Name] = nil
	}
}

// plan finds the guarded writes in one top-level statement.
func (r *Rewriter) plan(stmt *pg_query.Node, names *preparedNames) (*plan, *Refusal) {
	top := inner(stmt)
	p := &plan{}
	var ref *Refusal
	walk(stmt.ProtoReflect(), nil, func(m proto.Message, anc []proto.Message) {
		if ref == nil {
			ref = r.visit(p, m, m != top, storedContext(anc), names)
		}
	})
	if ref != nil {
		return nil, ref
	}
	slices.SortStableFunc(p.writes, func(a, b *write) int { return cmp.Compare(a.pos, b.pos) })
	if ref := r.planDomains(p, top); ref != nil {
		return nil, ref
	}
	if len(p.writes) > 0 {
		switch t := top.(type) {
		case *pg_query.PrepareStmt:
			p.prepare = t.Name // the probe follows each EXECUTE instead
		case *pg_query.ExplainStmt:
			p.probe = explainAnalyze(t)
		case *pg_query.CopyStmt:
			p.probe, p.copyIn = true, t.IsFrom
		default:
			p.probe = true
		}
	}
	return p, nil
}

// visit checks one message of a statement's tree; nested says it is not
// the top-level statement, stored is the rule, function body or view that
// would keep it for later, if any.
func (r *Rewriter) visit(p *plan, m proto.Message, nested bool, stored proto.Message, names *preparedNames) *Refusal {
	add := func(kind string, g *guardInfo, rv *pg_query.RangeVar, node proto.Message) *write {
		w := &write{kind: kind, guard: g, pos: int(rv.GetLocation()), nested: nested, node: node}
		p.writes = append(p.writes, w)
		p.fence = p.fence || node != nil
		return w
	}
	switch n := m.(type) {
	case *pg_query.AlterTableStmt, *pg_query.RenameStmt, *pg_query.CreateTrigStmt, *pg_query.DropStmt, *pg_query.CreateFunctionStmt,
		*pg_query.AlterFunctionStmt, *pg_query.AlterOwnerStmt, *pg_query.AlterObjectSchemaStmt:
		return r.visitDDL(m)
	case *pg_query.UpdateStmt:
		return r.visitUpdateDelete("UPDATE", n.Relation, n.WhereClause, n.TargetList, m, stored, add)
	case *pg_query.DeleteStmt:
		return r.visitUpdateDelete("DELETE", n.Relation, n.WhereClause, nil, m, stored, add)
	case *pg_query.InsertStmt:
		g, ref := r.writeGuardFor(n.Relation)
		kind, oc := "INSERT", n.OnConflictClause
		if oc != nil && oc.Action == pg_query.OnConflictAction_ONCONFLICT_UPDATE {
			kind = "UPSERT"
		}
		switch {
		case g == nil || ref != nil:
			return ref
		case stored != nil:
			return storedWrite(kind, stored, g)
		case g.Rollout == Observe:
			add(kind, g, n.Relation, nil)
		case assigns(n.Cols, g.Column) || oc != nil && assigns(oc.TargetList, g.Column):
			return forgedEpoch(g)
		case n.SelectStmt != nil && len(n.Cols) == 0:
			return noColumnList(g)
		default:
			if ref := r.writeInCondition("INSERT ... ON CONFLICT DO UPDATE", g, oc.GetWhereClause()); ref != nil {
				return ref
			}
			add(kind, g, n.Relation, m)
		}
	case *pg_query.MergeStmt:
		g, ref := r.writeGuardFor(n.Relation)
		switch {
		case g == nil || ref != nil:
			return ref
		case stored != nil:
			return storedWrite("MERGE", stored, g)
		case g.Rollout == Observe:
			add("MERGE", g, n.Relation, nil)
		case !r.backstopped(g, n.Relation):
			return unsupported("MERGE", g, hintMerge)
		case mergeAssigns(n, g.Column):
			// The backstop would overwrite the epoch with the token anyway,
			// but an explicit assignment is refused as in UPDATE and INSERT.
			// A WHEN NOT MATCHED THEN INSERT without a column list (or
			// DEFAULT VALUES) passes: it names no column, and the backstop
			// stamps whatever lands in the epoch column.
			return forgedEpoch(g)
		default:
			// The MERGE's own text is left as it is: the backstop fences
			// its target's rows. Writes elsewhere in the statement (its
			// data-modifying WITH queries) are visited on their own and
			// fenced in the text as ever.
			add("MERGE", g, n.Relation, nil).backstop = true
		}
	case *pg_query.TruncateStmt:
		for _, rel := range n.Relations {
			rv := rel.GetRangeVar()
			g, ref := r.writeGuardFor(rv)
			switch {
			case g == nil || ref != nil:
				if ref != nil {
					return ref
				}
			case stored != nil:
				if ref := storedWrite("TRUNCATE", stored, g); ref != nil {
					return ref
				}
			case g.Rollout == Observe || r.allow.Truncate:
				add("TRUNCATE", g, rv, nil)
			default:
				return unsupported("TRUNCATE", g, "use DELETE, which pgfence fences")
			}
		}
	case *pg_query.CopyStmt:
		if !n.IsFrom {
			return nil
		}
		g, ref := r.writeGuardFor(n.Relation)
		switch {
		case g == nil || ref != nil:
			return ref
		case stored != nil:
			return storedWrite("COPY FROM", stored, g)
		case g.Rollout == Observe:
			add("COPY FROM", g, n.Relation, nil)
		case r.backstopped(g, n.Relation):
			// Its column list is not checked for the epoch column: COPY
			// fills every column without one, and a list (pg_dump writes
			// one) only describes the data; the backstop stamps the token
			// over whatever the data holds.
			add("COPY FROM", g, n.Relation, nil).backstop = true
		case r.allow.CopyFrom:
			add("COPY FROM", g, n.Relation, nil)
		default:
			return unsupported("COPY FROM", g, "load the rows with INSERT, which pgfence fences")
		}
	case *pg_query.ExecuteStmt:
		for _, g := range names.lookup(r, n.Name) {
			add("EXECUTE", g, nil, nil)
		}
	}
	return nil
}

func (r *Rewriter) visitUpdateDelete(kind string, rv *pg_query.RangeVar, where *pg_query.Node, set []*pg_query.Node,
	m, stored proto.Message, add func(string, *guardInfo, *pg_query.RangeVar, proto.Message) *write) *Refusal {
	g, ref := r.writeGuardFor(rv)
	switch {
	case g == nil || ref != nil:
		return ref
	case stored != nil:
		return storedWrite(kind, stored, g)
	case g.Rollout == Observe:
		if where.GetCurrentOfExpr() != nil {
			kind = "CURRENT OF"
		}
		add(kind, g, rv, nil)
	case assigns(set, g.Column):
		return forgedEpoch(g)
	case where.GetCurrentOfExpr() != nil:
		switch {
		case r.backstopped(g, rv):
			add("CURRENT OF", g, rv, nil).backstop = true
		case r.allow.CurrentOf:
			add("CURRENT OF", g, rv, nil)
		default:
			return positioned(kind, g)
		}
	default:
		if ref := r.writeInCondition(kind, g, where); ref != nil {
			return ref
		}
		add(kind, g, rv, m)
	}
	return nil
}

// writeInCondition refuses a fenced write nested in the condition of
// another: the fence repeats the condition, so each such level would double
// the text, and Postgres rejects a data-modifying WITH below the top level
// of a statement anyway.
func (r *Rewriter) writeInCondition(kind string, g *guardInfo, cond *pg_query.Node) *Refusal {
	if cond == nil {
		return nil
	}
	var found *guardInfo
	eachMessage(cond.ProtoReflect(), func(m proto.Message) {
		if ng, _ := r.guardFor(writeRelation(m)); found == nil && ng != nil && ng.Rollout != Observe {
			found = ng
		}
	})
	if found == nil {
		return nil
	}
	return unsupported("a write nested in the condition of "+kind, found,
		"Postgres only runs a data-modifying WITH at the top level of a statement; move it there")
}

// tables lists the guards a statement writes, each once, in text order.
func (p *plan) tables() []*guardInfo {
	var out []*guardInfo
	for _, w := range p.writes {
		if !slices.Contains(out, w.guard) {
			out = append(out, w.guard)
		}
	}
	return out
}

// mergeAssigns reports whether a WHEN clause of a MERGE assigns column:
// names it in UPDATE SET or in INSERT's column list.
func mergeAssigns(n *pg_query.MergeStmt, column string) bool {
	for _, c := range n.MergeWhenClauses {
		if assigns(c.GetMergeWhenClause().GetTargetList(), column) {
			return true
		}
	}
	return false
}

// backstopped reports whether the database backstop fences the writes to
// rv, whose guard is g: g has Backstop, and so does every other guard the
// name matches (an unqualified name may be any of them; fail closed).
func (r *Rewriter) backstopped(g *guardInfo, rv *pg_query.RangeVar) bool {
	if !g.Backstop {
		return false
	}
	for i := range r.guards {
		if o := &r.guards[i]; !o.Backstop && refersTo(rv, o) {
			return false
		}
	}
	return true
}

// refersTo reports whether a table reference may name g's table: an
// unqualified name, or a guard without a schema, matches in any schema.
func refersTo(rv *pg_query.RangeVar, g *guardInfo) bool {
	return rv.Relname == g.Table && (g.Schema == "" || rv.Schemaname == "" || rv.Schemaname == g.Schema)
}

// assigns reports whether a SET or column list names column.
func assigns(targets []*pg_query.Node, column string) bool {
	for _, n := range targets {
		if n.GetResTarget().GetName() == column {
			return true
		}
	}
	return false
}

// guardFor returns the guard a table reference names, if any. An unqualified
// name matches a guard in any schema: search_path decides which table it
// is, so it is treated as guarded (fail closed), and refused when the
// guards it matches are fenced differently.
func (r *Rewriter) guardFor(rv *pg_query.RangeVar) (*guardInfo, *Refusal) {
	if rv == nil {
		return nil, nil
	}
	var found *guardInfo
	for i := range r.guards {
		g := &r.guards[i]
		if !refersTo(rv, g) {
			continue
		}
		if found == nil {
			found = g
			continue
		}
		differ := ""
		switch {
		case found.Column != g.Column:
			differ = "epoch columns"
		case found.Rollout != g.Rollout:
			differ = "rollouts"
		case found.AllowMissingToken != g.AllowMissingToken:
			differ = "missing-token policies"
		case found.Domain != g.Domain:
			differ = "lock domains"
		default:
			continue
		}
		return nil, &Refusal{
			Code:    codeUnsupported,
			Message: fmt.Sprintf("pgfence: table \"%s\" matches guarded tables \"%s\" and \"%s\", which have different %s", nameIdent(rv.Relname), found.name, g.name, differ),
			Hint:    "qualify the table name with its schema",
		}
	}
	return found, nil
}

// writeGuardFor is guardFor for the table a statement writes: a write
// to a guarded table that cannot be fenced (Guard.Unfenceable) is refused,
// as is one whose unqualified name may stand for such a table (search_path
// decides; fail closed). Observe tables fence nothing, and are let
// through.
func (r *Rewriter) writeGuardFor(rv *pg_query.RangeVar) (*guardInfo, *Refusal) {
	g, ref := r.guardFor(rv)
	if g == nil || ref != nil || !r.unfenceable {
		return g, ref
	}
	for i := range r.guards {
		if o := &r.guards[i]; o.Unfenceable != "" && o.Rollout != Observe && refersTo(rv, o) {
			return nil, unfenceable(o)
		}
	}
	return g, nil
}

// guardNamed returns the guard whose Name() is name, or nil.
func (r *Rewriter) guardNamed(name string) *guardInfo {
	for i := range r.guards {
		if r.guards[i].name == name {
			return &r.guards[i]
		}
	}
	return nil
}
