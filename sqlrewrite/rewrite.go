package sqlrewrite

import (
	"fmt"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// target is a top-level UPDATE or DELETE of a guarded table, to be fenced.
type target struct {
	kind     string // "UPDATE" or "DELETE"
	guard    *guardInfo
	rel      *pg_query.RangeVar
	firstSet int // byte offset of the first SET target (UPDATE only)
	hasWhere bool
	hasRet   bool
}

// Rewrite fences every top-level UPDATE and DELETE of a guarded table in
// sql, or refuses the whole text if any statement writes a guarded table in
// a way pgfence cannot fence. It returns an error only for internal
// failures; refusals are in Result.Refusal.
func (r *Rewriter) Rewrite(sql string, mode Mode) (*Result, error) {
	if !r.MayTouch(sql) {
		return &Result{SQL: sql}, nil
	}
	if strings.IndexByte(sql, 0) >= 0 {
		// The parser would stop at the NUL and leave the rest unchecked.
		return refused(syntaxError("query text contains a NUL byte")), nil
	}
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return refused(syntaxError(err.Error())), nil
	}
	targets := make([]*target, len(tree.Stmts))
	fencing := false
	for i, raw := range tree.Stmts {
		t, ref := r.check(raw.Stmt)
		if ref != nil {
			return refused(ref), nil
		}
		targets[i] = t
		fencing = fencing || t != nil
	}
	if !fencing {
		return &Result{SQL: sql}, nil
	}
	return r.fence(sql, tree.Stmts, targets, mode)
}

func refused(ref *Refusal) *Result {
	return &Result{SQL: refusalSQL(ref), Refusal: ref}
}

// check decides what to do with one top-level statement: fence it (a
// target), refuse it, or leave it alone (nil, nil).
func (r *Rewriter) check(stmt *pg_query.Node) (*target, *Refusal) {
	top := inner(stmt)
	var t *target
	for _, w := range writesIn(stmt) {
		found, ref := r.checkWrite(w, top, w == top)
		if ref != nil {
			return nil, ref
		}
		if found != nil {
			t = found
		}
	}
	return t, nil
}

// checkWrite checks one statement that may write a table; isTop says it is
// the top-level statement itself.
func (r *Rewriter) checkWrite(w, top proto.Message, isTop bool) (*target, *Refusal) {
	switch n := w.(type) {
	case *pg_query.UpdateStmt:
		return r.checkUpdate(n, top, isTop)
	case *pg_query.DeleteStmt:
		g, ref := r.guardFor(n.Relation)
		if g == nil || ref != nil {
			return nil, ref
		}
		if !isTop {
			return nil, nested("DELETE", top, g)
		}
		if n.WhereClause.GetCurrentOfExpr() != nil {
			return nil, positioned("DELETE", g)
		}
		return &target{kind: "DELETE", guard: g, rel: n.Relation,
			hasWhere: n.WhereClause != nil, hasRet: len(n.ReturningList) > 0}, nil
	case *pg_query.InsertStmt:
		return nil, r.checkInsert(n, top, isTop)
	case *pg_query.MergeStmt:
		g, ref := r.guardFor(n.Relation)
		if g == nil || ref != nil {
			return nil, ref
		}
		form := "MERGE"
		if !isTop {
			form, _ = nestedForm("MERGE", top)
		}
		return nil, unsupported(form, g, "use top-level INSERT, UPDATE and DELETE statements instead of MERGE")
	case *pg_query.TruncateStmt:
		for _, rel := range n.Relations {
			if g, ref := r.guardFor(rel.GetRangeVar()); ref != nil || g != nil {
				return nil, orUnsupported(ref, "TRUNCATE", g, "use a top-level DELETE, which pgfence fences")
			}
		}
	case *pg_query.CopyStmt:
		if !n.IsFrom {
			return nil, nil
		}
		if g, ref := r.guardFor(n.Relation); g != nil || ref != nil {
			return nil, orUnsupported(ref, "COPY FROM", g, "load the rows with INSERT instead")
		}
	}
	return nil, nil
}

func (r *Rewriter) checkUpdate(n *pg_query.UpdateStmt, top proto.Message, isTop bool) (*target, *Refusal) {
	g, ref := r.guardFor(n.Relation)
	if g == nil || ref != nil {
		return nil, ref
	}
	if assigns(n.TargetList, g.Column) {
		return nil, forgedEpoch(g)
	}
	if !isTop {
		return nil, nested("UPDATE", top, g)
	}
	if n.WhereClause.GetCurrentOfExpr() != nil {
		return nil, positioned("UPDATE", g)
	}
	t := &target{kind: "UPDATE", guard: g, rel: n.Relation,
		hasWhere: n.WhereClause != nil, hasRet: len(n.ReturningList) > 0, firstSet: -1}
	for _, rt := range n.TargetList {
		if loc := int(rt.GetResTarget().GetLocation()); t.firstSet < 0 || loc < t.firstSet {
			t.firstSet = loc
		}
	}
	return t, nil
}

// checkInsert lets a plain INSERT into a guarded table through, unless it
// assigns the epoch or can update existing rows (ON CONFLICT DO UPDATE),
// which would be an unfenced write.
func (r *Rewriter) checkInsert(n *pg_query.InsertStmt, top proto.Message, isTop bool) *Refusal {
	g, ref := r.guardFor(n.Relation)
	if g == nil || ref != nil {
		return ref
	}
	oc := n.OnConflictClause
	if assigns(n.Cols, g.Column) || oc != nil && assigns(oc.TargetList, g.Column) {
		return forgedEpoch(g)
	}
	if !isTop {
		return nested("INSERT", top, g)
	}
	if oc != nil && oc.Action == pg_query.OnConflictAction_ONCONFLICT_UPDATE {
		return unsupported("INSERT ... ON CONFLICT DO UPDATE", g,
			"use INSERT ... ON CONFLICT DO NOTHING, then a top-level UPDATE for the rows that already exist")
	}
	return nil
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
// is, so it is treated as guarded (fail closed).
func (r *Rewriter) guardFor(rv *pg_query.RangeVar) (*guardInfo, *Refusal) {
	if rv == nil {
		return nil, nil
	}
	var found *guardInfo
	for i := range r.guards {
		g := &r.guards[i]
		if rv.Relname != g.Table || g.Schema != "" && rv.Schemaname != "" && rv.Schemaname != g.Schema {
			continue
		}
		if found != nil && found.Column != g.Column {
			return nil, &Refusal{
				Code:    codeUnsupported,
				Message: fmt.Sprintf("pgfence: table \"%s\" matches guarded tables \"%s\" and \"%s\", which have different epoch columns", nameIdent(rv.Relname), found.name, g.name),
				Hint:    "qualify the table name with its schema",
			}
		}
		if found == nil {
			found = g
		}
	}
	return found, nil
}

func positioned(kind string, g *guardInfo) *Refusal {
	return unsupported("positioned "+kind+" (WHERE CURRENT OF)", g,
		"fetch the row's key with the cursor and "+kind+" ... WHERE <key> = <value> instead")
}

func nested(kind string, top proto.Message, g *guardInfo) *Refusal {
	form, hint := nestedForm(kind, top)
	return unsupported(form, g, hint)
}

// nestedForm names a write nested in the top-level statement top.
func nestedForm(kind string, top proto.Message) (form, hint string) {
	asTop := "run the " + kind + " as a top-level statement"
	switch top.(type) {
	case *pg_query.ExplainStmt:
		return "EXPLAIN " + kind, asTop + ", without EXPLAIN"
	case *pg_query.PrepareStmt:
		return "PREPARE ... AS " + kind, "prepare it with the extended protocol (Parse) instead, or " + asTop
	case *pg_query.RuleStmt:
		return "CREATE RULE ... DO " + kind, "a rule would write the guarded table without the fence; " + asTop + " instead"
	case *pg_query.SelectStmt, *pg_query.InsertStmt, *pg_query.UpdateStmt, *pg_query.DeleteStmt, *pg_query.MergeStmt:
		return kind + " inside WITH", asTop + ", not inside WITH (its own WITH may only read)"
	}
	return kind + " inside " + stmtKind(top), asTop
}

// orUnsupported returns ref if guardFor refused, else the unsupported refusal.
func orUnsupported(ref *Refusal, form string, g *guardInfo, hint string) *Refusal {
	if ref != nil {
		return ref
	}
	return unsupported(form, g, hint)
}
