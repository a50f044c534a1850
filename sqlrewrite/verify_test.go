package sqlrewrite

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// verify checks a Rewrite result against its input, by rules written out
// again here rather than shared with the rewriter:
//
//   - a refusal is the refusal statement and nothing else;
//   - otherwise the output parses, and with every fence taken off (which
//     must be there, in the right shape, on every UPDATE, DELETE and INSERT
//     of an Enforce or Shadow table outside a rule, function body or view,
//     nested or not) each statement means exactly what the input's did;
//   - every such write to an Enforce table in a lock domain also checks its
//     domain, whose WITH query comes first in the WITH list of the
//     statement's top-level query (once per domain), and no client WITH
//     query there or below is named like one;
//   - statements that write no such table are byte-identical;
//   - a probe (with the right SQL and tables) follows each top-level
//     statement that writes a guarded table, and nothing else is added;
//   - Fenced, Prepared and SessionDependent agree with the input;
//   - error positions in the output map back to the same characters of the
//     input (see verifyPositions).
func verify(r *Rewriter, in string, mode Mode, s Session, res *Result) error {
	if res.Refusal != nil {
		if res.SQL != refusalSQL(res.Refusal) || len(res.Fenced)+len(res.Probes)+len(res.Prepared) > 0 {
			return fmt.Errorf("refusal result carries other SQL or results: %+v", res)
		}
		if n, err := countStmts(res.SQL); err != nil || n != 1 {
			return fmt.Errorf("refusal SQL %q: %d statements, %v", res.SQL, n, err)
		}
		return nil
	}
	if err := verifyPositions(in, res); err != nil {
		return err
	}
	v := &verifier{r: r}
	inTree, inErr := pg_query.Parse(in)
	if inErr != nil {
		if res.SQL != in || len(res.Fenced)+len(res.Probes) > 0 {
			return fmt.Errorf("input does not parse (%v) but was not refused", inErr)
		}
		return nil
	}
	var want []stmtWrites
	execs := false
	local := map[string][]string{} // PREPAREd earlier in the text; nil after DEALLOCATE
	dropAll := false
	known := func(name string) []string {
		if t, ok := local[name]; ok || dropAll {
			return t
		}
		execs = true // asks the Session
		if s == nil {
			return nil
		}
		return s.PreparedWrite(name)
	}
	for _, raw := range inTree.Stmts {
		w := v.writes(raw.Stmt, known)
		if c := raw.Stmt.GetCopyStmt(); c != nil && c.IsFrom && mode != Simple {
			w.probe = false // the server is in copy-in mode right after its Execute
		}
		want = append(want, w)
		switch t := raw.Stmt.Node.(type) {
		case *pg_query.Node_PrepareStmt:
			local[t.PrepareStmt.Name] = []string{}
			for _, g := range w.tables {
				local[t.PrepareStmt.Name] = append(local[t.PrepareStmt.Name], g.name)
			}
		case *pg_query.Node_DeallocateStmt:
			if t.DeallocateStmt.Isall {
				local, dropAll = map[string][]string{}, true
			} else {
				local[t.DeallocateStmt.Name] = nil
			}
		}
	}
	if err := v.checkLists(want, res); err != nil {
		return err
	}
	if want := s != nil && execs; res.SessionDependent != want {
		return fmt.Errorf("SessionDependent is %v, want %v", res.SessionDependent, want)
	}
	outTree, err := pg_query.Parse(res.SQL)
	if err != nil {
		return fmt.Errorf("output does not parse: %v\n%s", err, res.SQL)
	}
	outs := outTree.Stmts
	probeAt := map[int]Probe{}
	if mode == Simple {
		for _, p := range res.Probes {
			probeAt[p.Index] = p
		}
	}
	if len(outs) != len(inTree.Stmts)+len(probeAt) {
		return fmt.Errorf("output has %d statements for %d input statements and %d probes", len(outs), len(inTree.Stmts), len(probeAt))
	}
	j, probes := 0, 0
	for i, raw := range inTree.Stmts {
		if _, ok := probeAt[j]; ok {
			return fmt.Errorf("probe at index %d does not follow a guarded write", j)
		}
		out := outs[j]
		j++
		w := want[i]
		if w.fenced == 0 {
			if a, b := codeText(stmtText(in, raw)), codeText(stmtText(res.SQL, out)); a != b {
				return fmt.Errorf("statement without a fenced write changed:\n%q\n%q", a, b)
			}
		} else if err := v.checkFence(raw.Stmt, out.Stmt, w); err != nil {
			return fmt.Errorf("%v\nin:  %s\nout: %s", err, stmtText(in, raw), stmtText(res.SQL, out))
		}
		if !w.probe {
			continue
		}
		if probes >= len(res.Probes) {
			return fmt.Errorf("statement %d needs a probe; Probes has %d", i, len(res.Probes))
		}
		p := res.Probes[probes]
		probes++
		if err := v.checkProbe(p, w.tables); err != nil {
			return fmt.Errorf("probe %d: %v", probes-1, err)
		}
		if mode == Prepared {
			if p.Index != -1 {
				return fmt.Errorf("probe index %d in Prepared mode", p.Index)
			}
			continue
		}
		if p.Index != j {
			return fmt.Errorf("probe index %d, want %d", p.Index, j)
		}
		if txt := codeText(stmtText(res.SQL, outs[j])); txt != p.SQL {
			return fmt.Errorf("statement %d is not the probe: %q", j, txt)
		}
		j++
	}
	if probes != len(res.Probes) {
		return fmt.Errorf("%d probes, want %d", len(res.Probes), probes)
	}
	return nil
}

// verifier checks the results of one Rewriter.
type verifier struct {
	r *Rewriter
}

// exprCache holds parsed expected expressions by text.
var exprCache sync.Map

// stmtWrites is what the verifier finds in one input statement.
type stmtWrites struct {
	fenced  int      // writes whose text must carry a fence
	writes  []string // "table kind" per guarded write, sorted
	tables  []*guardInfo
	probe   bool
	prepare string
	// domains holds each lock domain the statement's fenced writes check.
	domains map[string]bool
}

// domainIndex is the number of a lock domain: the order in which the
// guards first name it.
func (v *verifier) domainIndex(name string) int {
	var seen []string
	for _, g := range v.r.guards {
		if g.Domain != "" && !slices.Contains(seen, g.Domain) {
			seen = append(seen, g.Domain)
		}
	}
	return slices.Index(seen, name)
}

// domainChecked reports whether fenced writes to g check its lock domain.
func domainChecked(g *guardInfo) bool { return g.Domain != "" && g.Rollout == Enforce }

// guardOf matches a table reference to a guard: the first guard with its
// name, in any schema if the reference is unqualified.
func (v *verifier) guardOf(rv *pg_query.RangeVar) *guardInfo {
	if rv == nil {
		return nil
	}
	for i := range v.r.guards {
		g := &v.r.guards[i]
		if rv.Relname == g.Table && (g.Schema == "" || rv.Schemaname == "" || rv.Schemaname == g.Schema) {
			return g
		}
	}
	return nil
}

// backstopOf is " backstop" when a MERGE, COPY FROM or CURRENT OF of rv,
// whose guard is g, passes because the database backstop fences it: g is
// not Observe, and every guard the reference may name has Backstop; else
// "".
func (v *verifier) backstopOf(g *guardInfo, rv *pg_query.RangeVar) string {
	if g == nil || g.Rollout == Observe {
		return ""
	}
	for i := range v.r.guards {
		o := &v.r.guards[i]
		if rv.Relname == o.Table && (o.Schema == "" || rv.Schemaname == "" || rv.Schemaname == o.Schema) && !o.Backstop {
			return ""
		}
	}
	return " backstop"
}

// writes lists the guarded writes of one input statement.
func (v *verifier) writes(stmt *pg_query.Node, known func(string) []string) stmtWrites {
	var w stmtWrites
	type found struct {
		g   *guardInfo
		pos int32
	}
	var all []found
	add := func(g *guardInfo, pos int32, kind string, fenced bool) {
		if g == nil {
			return
		}
		w.writes = append(w.writes, g.name+" "+kind)
		all = append(all, found{g, pos})
		if fenced {
			w.fenced++
			if domainChecked(g) {
				if w.domains == nil {
					w.domains = map[string]bool{}
				}
				w.domains[g.Domain] = true
			}
		}
	}
	var visit func(m protoreflect.Message, stored bool)
	visit = func(m protoreflect.Message, stored bool) {
		switch n := m.Interface().(type) {
		case *pg_query.RuleStmt, *pg_query.CreateFunctionStmt, *pg_query.ViewStmt:
			stored = true
		case *pg_query.CreateTableAsStmt:
			stored = stored || n.Objtype == pg_query.ObjectType_OBJECT_MATVIEW
		case *pg_query.ExecuteStmt:
			var done []*guardInfo
			for _, name := range known(n.Name) {
				for i := range v.r.guards {
					if g := &v.r.guards[i]; g.name == name && !slices.Contains(done, g) {
						add(g, 0, "EXECUTE", false)
						done = append(done, g)
						break
					}
				}
			}
		}
		if !stored {
			v.writeOf(m.Interface(), add)
		}
		m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
			switch {
			case fd.Message() == nil:
			case fd.IsList():
				for i := 0; i < val.List().Len(); i++ {
					visit(val.List().Get(i).Message(), stored)
				}
			default:
				visit(val.Message(), stored)
			}
			return true
		})
	}
	visit(stmt.ProtoReflect(), false)
	slices.Sort(w.writes)
	slices.SortStableFunc(all, func(a, b found) int { return int(a.pos - b.pos) })
	for _, f := range all {
		if !slices.Contains(w.tables, f.g) {
			w.tables = append(w.tables, f.g)
		}
	}
	top := inner(stmt)
	if len(w.tables) > 0 {
		switch t := top.(type) {
		case *pg_query.PrepareStmt:
			w.prepare = t.Name
		case *pg_query.ExplainStmt:
			w.probe = explainAnalyze(t) // EXPLAIN without ANALYZE writes nothing
		default:
			w.probe = true
		}
	}
	return w
}

func (v *verifier) writeOf(m proto.Message, add func(*guardInfo, int32, string, bool)) {
	fenceable := func(g *guardInfo) bool { return g != nil && g.Rollout != Observe }
	var rv *pg_query.RangeVar
	var where *pg_query.Node
	kind := "UPDATE"
	switch n := m.(type) {
	case *pg_query.UpdateStmt:
		rv, where = n.Relation, n.WhereClause
	case *pg_query.DeleteStmt:
		rv, where, kind = n.Relation, n.WhereClause, "DELETE"
	case *pg_query.InsertStmt:
		kind = "INSERT"
		if n.OnConflictClause.GetAction() == pg_query.OnConflictAction_ONCONFLICT_UPDATE {
			kind = "UPSERT"
		}
		g := v.guardOf(n.Relation)
		add(g, n.Relation.Location, kind, fenceable(g))
		return
	case *pg_query.MergeStmt:
		g := v.guardOf(n.Relation)
		add(g, n.Relation.Location, "MERGE"+v.backstopOf(g, n.Relation), false)
		return
	case *pg_query.TruncateStmt:
		for _, rel := range n.Relations {
			add(v.guardOf(rel.GetRangeVar()), rel.GetRangeVar().Location, "TRUNCATE", false)
		}
		return
	case *pg_query.CopyStmt:
		if n.IsFrom {
			g := v.guardOf(n.Relation)
			add(g, n.Relation.Location, "COPY FROM"+v.backstopOf(g, n.Relation), false)
		}
		return
	default:
		return
	}
	g := v.guardOf(rv)
	if where.GetCurrentOfExpr() != nil {
		add(g, rv.Location, "CURRENT OF"+v.backstopOf(g, rv), false)
		return
	}
	add(g, rv.Location, kind, fenceable(g))
}

// checkLists compares Fenced, Prepared and the probes' count with what the
// verifier found.
func (v *verifier) checkLists(want []stmtWrites, res *Result) error {
	var writes []string
	var prepared []string
	probes := 0
	for _, w := range want {
		writes = append(writes, w.writes...)
		if w.prepare != "" {
			names := []string{w.prepare}
			for _, g := range w.tables {
				names = append(names, g.name)
			}
			prepared = append(prepared, strings.Join(names, " "))
		}
		if w.probe {
			probes++
		}
	}
	var got []string
	for _, f := range res.Fenced {
		if f.Backstop {
			got = append(got, f.Table+" "+f.Kind+" backstop")
		} else {
			got = append(got, f.Table+" "+f.Kind)
		}
		if g := v.r.guardNamed(f.Table); g == nil || g.Rollout != f.Rollout {
			return fmt.Errorf("Fenced %+v has the wrong rollout", f)
		}
	}
	slices.Sort(writes)
	slices.Sort(got)
	if !slices.Equal(writes, got) {
		return fmt.Errorf("Fenced lists %q, the input writes %q", got, writes)
	}
	var gotPrep []string
	for _, p := range res.Prepared {
		gotPrep = append(gotPrep, strings.Join(append([]string{p.Name}, p.Tables...), " "))
	}
	if !slices.Equal(prepared, gotPrep) {
		return fmt.Errorf("Prepared %q, want %q", gotPrep, prepared)
	}
	if len(res.Probes) != probes {
		return fmt.Errorf("%d probes, want %d", len(res.Probes), probes)
	}
	return nil
}

// checkProbe checks a probe's tables and SQL.
func (v *verifier) checkProbe(p Probe, tables []*guardInfo) error {
	if len(p.Tables) != len(tables) {
		return fmt.Errorf("tables %+v, want %d", p.Tables, len(tables))
	}
	sql := "SELECT pg_catalog.current_setting(" + quoteLiteral(v.r.setting) + ", true), " + flagTag
	clear := ""
	for i, g := range tables {
		if p.Tables[i] != (ProbeTable{Table: g.name, Rollout: g.Rollout, Domain: g.Domain, Guard: g.index}) {
			return fmt.Errorf("table %d is %+v, want %s", i, p.Tables[i], g.name)
		}
		flag := quoteLiteral(fmt.Sprintf("pgfence.stale_%d", g.index))
		dflag := quoteLiteral(fmt.Sprintf("pgfence.dstale_%d", g.index))
		if g.Rollout == Observe {
			sql += ", NULL::pg_catalog.text"
		} else {
			sql += ", pg_catalog.current_setting(" + flag + ", true)"
			clear += ", pg_catalog.set_config(" + flag + ", E'', true)"
		}
		if domainChecked(g) {
			sql += ", pg_catalog.current_setting(" + dflag + ", true)"
			clear += ", pg_catalog.set_config(" + dflag + ", E'', true)"
		} else {
			sql += ", NULL::pg_catalog.text"
		}
		if g.Domain != "" {
			sql += ", " + v.tokenText(g)
		} else {
			sql += ", NULL::pg_catalog.text"
		}
	}
	if p.SQL != sql+clear {
		return fmt.Errorf("SQL %q, want %q", p.SQL, sql+clear)
	}
	return nil
}

// checkFence takes the fences off out and compares what is left with in.
func (v *verifier) checkFence(in, out *pg_query.Node, w stmtWrites) error {
	in, out = stripLocations(in), stripLocations(out)
	if err := v.undomain(out, w); err != nil {
		return err
	}
	if err := v.unfence(out.ProtoReflect(), false); err != nil {
		return err
	}
	if !proto.Equal(in, out) {
		return fmt.Errorf("fenced statement means something else")
	}
	return nil
}

// undomain checks that the WITH list of the statement's top-level query
// (the one EXPLAIN, PREPARE, COPY, CREATE TABLE AS or DECLARE holds, if
// any) starts with the WITH queries of the lock domains the statement
// checks, in domain order, and removes them (with the WITH, if nothing
// else is in it); and that no other WITH query anywhere is named like
// them.
func (v *verifier) undomain(out *pg_query.Node, w stmtWrites) error {
	var names []string
	for d := range w.domains {
		names = append(names, d)
	}
	if len(names) == 0 {
		return nil // pgfence adds no WITH query: any name is the client's
	}
	slices.SortFunc(names, func(a, b string) int { return v.domainIndex(a) - v.domainIndex(b) })
	top := out
	for {
		var q *pg_query.Node
		switch n := top.Node.(type) {
		case *pg_query.Node_ExplainStmt:
			q = n.ExplainStmt.Query
		case *pg_query.Node_PrepareStmt:
			q = n.PrepareStmt.Query
		case *pg_query.Node_CopyStmt:
			q = n.CopyStmt.Query
		case *pg_query.Node_CreateTableAsStmt:
			q = n.CreateTableAsStmt.Query
		case *pg_query.Node_DeclareCursorStmt:
			q = n.DeclareCursorStmt.Query
		}
		if q == nil {
			break
		}
		top = q
	}
	var with **pg_query.WithClause
	switch n := top.Node.(type) {
	case *pg_query.Node_SelectStmt:
		with = &n.SelectStmt.WithClause
	case *pg_query.Node_InsertStmt:
		with = &n.InsertStmt.WithClause
	case *pg_query.Node_UpdateStmt:
		with = &n.UpdateStmt.WithClause
	case *pg_query.Node_DeleteStmt:
		with = &n.DeleteStmt.WithClause
	case *pg_query.Node_MergeStmt:
		with = &n.MergeStmt.WithClause
	}
	if with == nil || *with == nil || len((*with).Ctes) < len(names) {
		return fmt.Errorf("the top-level query has no WITH queries for lock domains %q", names)
	}
	ctes := (*with).Ctes
	for i, d := range names {
		if !proto.Equal(ctes[i], v.domainQuery(d)) {
			return fmt.Errorf("WITH query %d of the top-level query is not the one of lock domain %q", i, d)
		}
	}
	if (*with).Ctes = ctes[len(names):]; len((*with).Ctes) == 0 {
		if (*with).Recursive {
			return fmt.Errorf("a WITH RECURSIVE holds nothing but lock domain checks")
		}
		*with = nil
	}
	var err error
	eachMessage(out.ProtoReflect(), func(m proto.Message) {
		if c, ok := m.(*pg_query.CommonTableExpr); ok && err == nil && strings.HasPrefix(c.Ctename, "pgfence_domain_") {
			err = fmt.Errorf("WITH query %q besides the lock domain checks", c.Ctename)
		}
	})
	return err
}

// domainQuery is the WITH query that claims lock domain d, parsed: it
// claims with the token the settings' precedence picks, and with none
// when they conflict or are unset or empty.
func (v *verifier) domainQuery(d string) *pg_query.Node {
	ds := "pg_catalog.current_setting(" + quoteLiteral(v.r.setting+"."+d) + ", true)"
	gs := "pg_catalog.current_setting(" + quoteLiteral(v.r.setting) + ", true)"
	text := fmt.Sprintf(`WITH "pgfence_domain_%d" AS (UPDATE "pgfence"."domains" SET "token" = COALESCE(NULLIF(%[2]s, E''), %[3]s)::pg_catalog.int8`+
		` WHERE "domain" OPERATOR(pg_catalog.=) %[4]s AND pg_catalog.int8le("token", (CASE WHEN NULLIF(%[2]s, E'') IS NULL THEN NULLIF(%[3]s, E'')`+
		` WHEN NULLIF(%[3]s, E'') IS NULL OR %[2]s OPERATOR(pg_catalog.=) %[3]s THEN %[2]s END)::pg_catalog.int8) RETURNING "token") SELECT`,
		v.domainIndex(d), ds, gs, quoteLiteral(d))
	if c, ok := exprCache.Load(text); ok {
		return c.(*pg_query.Node)
	}
	tree, err := pg_query.Parse(text)
	if err != nil {
		panic(fmt.Sprintf("verifier WITH query %q: %v", text, err))
	}
	c := stripLocations(tree.Stmts[0].Stmt.GetSelectStmt().WithClause.Ctes[0])
	exprCache.Store(text, c)
	return c
}

// unfence removes the fences from m and everything in it, failing if a
// write that needs one lacks it.
func (v *verifier) unfence(m protoreflect.Message, stored bool) error {
	var err error
	switch n := m.Interface().(type) {
	case *pg_query.RuleStmt, *pg_query.CreateFunctionStmt, *pg_query.ViewStmt:
		stored = true
	case *pg_query.CreateTableAsStmt:
		stored = stored || n.Objtype == pg_query.ObjectType_OBJECT_MATVIEW
	case *pg_query.UpdateStmt:
		if g := v.guardOf(n.Relation); !stored && g != nil && g.Rollout != Observe && n.WhereClause.GetCurrentOfExpr() == nil {
			ref := refOf(n.Relation)
			if n.TargetList, err = v.unstamp(g, ref, n.TargetList); err == nil {
				n.WhereClause, err = v.unfenceWhere(g, ref, n.WhereClause, false)
			}
		}
	case *pg_query.DeleteStmt:
		if g := v.guardOf(n.Relation); !stored && g != nil && g.Rollout != Observe && n.WhereClause.GetCurrentOfExpr() == nil {
			n.WhereClause, err = v.unfenceWhere(g, refOf(n.Relation), n.WhereClause, false)
		}
	case *pg_query.InsertStmt:
		if g := v.guardOf(n.Relation); !stored && g != nil && g.Rollout != Observe {
			err = v.unfenceInsert(g, n)
		}
	}
	if err != nil {
		return err
	}
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		switch {
		case fd.Message() == nil:
		case fd.IsList():
			for i := 0; i < val.List().Len() && err == nil; i++ {
				err = v.unfence(val.List().Get(i).Message(), stored)
			}
		default:
			err = v.unfence(val.Message(), stored)
		}
		return err == nil
	})
	return err
}

// The token, SET and INSERT value expressions each rollout uses.
func (v *verifier) token(g *guardInfo) string {
	strict, allowMissing, lenient := tokenExprs(v.r.setting, g.name, g.Domain)
	switch {
	case g.Rollout == Shadow:
		return lenient
	case g.AllowMissingToken:
		return allowMissing
	}
	return strict
}

func (v *verifier) setText(g *guardInfo, ref string) string {
	t, col := v.token(g), ref+"."+quoteIdent(g.Column)
	switch {
	case g.Rollout == Shadow:
		return "GREATEST(" + col + ", " + t + ")"
	case g.AllowMissingToken:
		return "COALESCE(" + t + ", " + col + ")"
	}
	return v.strictCast(g)
}

// tokenText is the token's text: in a lock domain, the domain's setting
// unless it is unset or empty.
// domainWinner is the lock domain's token as text: what beat a stale writer.
func (v *verifier) domainWinner(g *guardInfo) string {
	return `COALESCE(CAST((SELECT "token" FROM "pgfence"."domains" WHERE "domain" OPERATOR(pg_catalog.=) ` + quoteLiteral(g.Domain) +
		`) AS pg_catalog.text), E'?')`
}

func (v *verifier) tokenText(g *guardInfo) string {
	text := "pg_catalog.current_setting(" + quoteLiteral(v.r.setting) + ", true)"
	if g.Domain != "" {
		text = "COALESCE(NULLIF(pg_catalog.current_setting(" + quoteLiteral(v.r.setting+"."+g.Domain) + ", true), E''), " + text + ")"
	}
	return text
}

// strictCast is the token a strict (Enforce, token required) UPDATE, DELETE
// and DO UPDATE set and compare the epoch with, and strictGate the check
// that fails the statement for a missing, empty or non-integer token.
func (v *verifier) strictCast(g *guardInfo) string {
	return v.tokenText(g) + "::pg_catalog.int8"
}

func (v *verifier) strictGate(g *guardInfo) string {
	text, subject, names := v.tokenText(g), `guarded table "`+g.Name()+`"`, v.r.setting
	conflict := ""
	if g.Domain != "" {
		subject += ` in lock domain "` + g.Domain + `"`
		names = v.r.setting + "." + g.Domain + " or " + v.r.setting
		// Both settings set, to different tokens, fail first (22023): the
		// token text is then the domain's, and differs from the general one.
		s := "pg_catalog.current_setting(" + quoteLiteral(v.r.setting) + ", true)"
		conflict = fmt.Sprintf(" WHEN %[1]s OPERATOR(pg_catalog.<>) %[2]s AND %[2]s OPERATOR(pg_catalog.<>) E''"+
			" THEN pg_catalog.format(%[3]s, %[1]s, %[2]s)::pg_catalog.int8", text, s,
			quoteLiteral("pgfence 22023: both "+v.r.setting+"."+g.Domain+" and "+v.r.setting+
				" are set, to different tokens (%L and %L), for a write to "+strings.ReplaceAll(subject, "%", "%%")))
	}
	missing := quoteLiteral("pgfence 55000: no fencing token is set for this write to " + subject + "; set " + names + " first")
	bad := quoteLiteral("pgfence 22023: " + names + " must be an integer fencing token for a write to " + subject + ", got: ")
	// Space, \t, \n, \r, \f, \v, sign and digits: what int8 input takes.
	const intChars = `E'\x20\x09\x0a\x0d\x0c\x0b+-0123456789'`
	return fmt.Sprintf("CASE%[5]s WHEN coalesce(%[1]s, E'') OPERATOR(pg_catalog.=) E'' THEN (%[2]s OPERATOR(pg_catalog.||) coalesce(%[1]s, E''))::pg_catalog.int8"+
		" WHEN pg_catalog.btrim(%[1]s, %[4]s) OPERATOR(pg_catalog.<>) E'' THEN (%[3]s OPERATOR(pg_catalog.||) %[1]s)::pg_catalog.int8"+
		" ELSE %[1]s::pg_catalog.int8 END IS NOT NULL", text, missing, bad, intChars, conflict)
}

func (v *verifier) insertText(g *guardInfo) string {
	if domainChecked(g) {
		if g.AllowMissingToken {
			return "CASE WHEN " + v.token(g) + " IS NULL THEN 0 ELSE " + v.domainStamp(g) + " END"
		}
		return "CASE WHEN " + v.strictGate(g) + " THEN " + v.domainStamp(g) + " END"
	}
	if g.Rollout == Shadow || g.AllowMissingToken {
		return "COALESCE(" + v.token(g) + ", 0)"
	}
	return v.token(g)
}

// domainStamp is what an INSERT into a lock domain's table stamps once the
// token is checked: the domain's claimed token, or PF001.
func (v *verifier) domainStamp(g *guardInfo) string {
	stale := "(" + quoteLiteral(`pgfence PF001: stale fencing token for lock domain "`+g.Domain+
		`" (guarded table "`+g.Name()+`"): a newer holder has written to it; stop writing and re-acquire the lock; token: `) +
		" OPERATOR(pg_catalog.||) COALESCE(" + v.tokenText(g) + ", E'') OPERATOR(pg_catalog.||) E'; newer token: ' OPERATOR(pg_catalog.||) " +
		v.domainWinner(g) + ")::pg_catalog.int8"
	return fmt.Sprintf(`COALESCE((SELECT "token" FROM "pgfence_domain_%d"), %s)`, v.domainIndex(g.Domain), stale)
}

// whereText is the fenced WHERE with pgfence_verify_cond standing for the
// client's condition, or without it.
func (v *verifier) whereText(g *guardInfo, ref string, cond, checked bool) string {
	t, col := v.token(g), ref+"."+quoteIdent(g.Column)
	ok := col + " OPERATOR(pg_catalog.<=) " + t
	if g.Rollout == Enforce && !g.AllowMissingToken {
		ok = "pg_catalog.int8le(" + col + ", " + v.strictCast(g) + ")"
	}
	// The stale flag's value: the transaction's start and the stale row's
	// epoch.
	epoch := "COALESCE(CAST(" + col + " AS pg_catalog.text), E'?')"
	flag := fmt.Sprintf("pg_catalog.set_config(E'pgfence.stale_%d', pg_catalog.format(E'%%s:%%s', pg_catalog.now(), %s), true)", g.index, epoch)
	if domainChecked(g) {
		claimed := fmt.Sprintf(`EXISTS (SELECT 1 FROM "pgfence_domain_%d")`, v.domainIndex(g.Domain))
		ok = "(" + claimed + " AND " + ok + ")"
		flag = fmt.Sprintf("pg_catalog.set_config(CASE WHEN %[1]s THEN E'pgfence.stale_%[2]d' ELSE E'pgfence.dstale_%[2]d' END, pg_catalog.format(E'%%s:%%s', pg_catalog.now(), CASE WHEN %[1]s THEN %[3]s ELSE %[4]s END), true)",
			claimed, g.index, epoch, v.domainWinner(g))
	}
	c := func(s string) string {
		if cond {
			return "((pgfence_verify_cond) AND " + s + ")"
		}
		return s
	}
	var w string
	switch {
	case g.Rollout == Shadow:
		w = "(" + t + " IS NULL OR " + ok + " OR " + c(flag+" IS NOT NULL") + ")"
	case g.AllowMissingToken:
		w = "(" + t + " IS NULL OR " + ok + " OR " + c(flag+" IS NULL") + ")"
	case checked: // an ON CONFLICT DO UPDATE: the INSERT's stamp checked the token
		w = "(" + ok + " OR " + c(flag+" IS NULL") + ")"
	default:
		w = "(" + ok + " OR " + c(flag+" IS NULL") + ") AND " + v.strictGate(g)
	}
	if cond {
		w = "(pgfence_verify_cond) AND " + w
	}
	return w
}

// expr parses an expression, without locations.
func (v *verifier) expr(text string) *pg_query.Node {
	if e, ok := exprCache.Load(text); ok {
		return proto.Clone(e.(*pg_query.Node)).(*pg_query.Node)
	}
	tree, err := pg_query.Parse("SELECT " + text)
	if err != nil {
		panic(fmt.Sprintf("verifier expression %q: %v", text, err))
	}
	e := stripLocations(tree.Stmts[0].Stmt.GetSelectStmt().TargetList[0].GetResTarget().Val)
	exprCache.Store(text, e)
	return proto.Clone(e).(*pg_query.Node)
}

// unstamp removes the leading C = <set value> from a SET list.
func (v *verifier) unstamp(g *guardInfo, ref string, set []*pg_query.Node) ([]*pg_query.Node, error) {
	if len(set) == 0 {
		return nil, fmt.Errorf("%s: SET list is empty", g.name)
	}
	rt := set[0].GetResTarget()
	if rt.GetName() != g.Column || len(rt.Indirection) > 0 || !proto.Equal(rt.Val, v.expr(v.setText(g, ref))) {
		return nil, fmt.Errorf("%s: SET does not start with %s = its %s value", g.name, g.Column, g.Rollout)
	}
	return set[1:], nil
}

// unfenceWhere checks a fenced WHERE and returns the client's condition.
func (v *verifier) unfenceWhere(g *guardInfo, ref string, w *pg_query.Node, checked bool) (*pg_query.Node, error) {
	if w == nil {
		return nil, fmt.Errorf("%s: no WHERE", g.name)
	}
	if proto.Equal(w, v.expr(v.whereText(g, ref, false, checked))) {
		return nil, nil
	}
	and := w.GetBoolExpr()
	fence := 1 // AND args the fence adds after the client's condition: (OK OR ...) [AND GATE]
	if g.Rollout == Enforce && !g.AllowMissingToken && !checked {
		fence = 2
	}
	if and == nil || and.Boolop != pg_query.BoolExprType_AND_EXPR || len(and.Args) <= fence {
		return nil, fmt.Errorf("%s: WHERE is not the client's condition AND the fence", g.name)
	}
	cond := andOf(and.Args[:len(and.Args)-fence])
	if want := substitute(v.expr(v.whereText(g, ref, true, checked)), cond); !proto.Equal(w, want) {
		return nil, fmt.Errorf("%s: WHERE is not the %s fence of its condition", g.name, g.Rollout)
	}
	return cond, nil
}

// substitute puts cond where pgfence_verify_cond stands, flattening an AND
// condition into the AND it is the first argument of, as Postgres's parser
// does.
func substitute(n, cond *pg_query.Node) *pg_query.Node {
	isPH := func(a *pg_query.Node) bool {
		f := a.GetColumnRef().GetFields()
		return len(f) == 1 && f[0].GetString_().GetSval() == "pgfence_verify_cond"
	}
	var fix func(m protoreflect.Message)
	fix = func(m protoreflect.Message) {
		if b, ok := m.Interface().(*pg_query.BoolExpr); ok && len(b.Args) > 0 && isPH(b.Args[0]) {
			c := proto.Clone(cond).(*pg_query.Node)
			if cb := c.GetBoolExpr(); cb != nil && b.Boolop == pg_query.BoolExprType_AND_EXPR && cb.Boolop == pg_query.BoolExprType_AND_EXPR {
				b.Args = append(cb.Args, b.Args[1:]...)
			} else {
				b.Args[0] = c
			}
		}
		m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
			switch {
			case fd.Message() == nil:
			case fd.IsList():
				for i := 0; i < val.List().Len(); i++ {
					fix(val.List().Get(i).Message())
				}
			default:
				fix(val.Message())
			}
			return true
		})
	}
	fix(n.ProtoReflect())
	return n
}

// unfenceInsert takes the epoch column and its values off an INSERT.
func (v *verifier) unfenceInsert(g *guardInfo, n *pg_query.InsertStmt) error {
	val := v.expr(v.insertText(g))
	isVal := func(e *pg_query.Node) bool { return proto.Equal(e, val) }
	cols := n.Cols
	if len(cols) == 0 {
		return fmt.Errorf("%s: INSERT has no column list", g.name)
	}
	if last := cols[len(cols)-1].GetResTarget(); last.GetName() != g.Column || last.Val != nil || len(last.Indirection) > 0 {
		return fmt.Errorf("%s: INSERT column list does not end with %s", g.name, g.Column)
	}
	n.Cols = cols[:len(cols)-1]
	sel := n.SelectStmt.GetSelectStmt()
	if sel == nil {
		return fmt.Errorf("%s: INSERT has no source", g.name)
	}
	switch {
	case len(sel.ValuesLists) > 0:
		// The first row reads and checks the token; the others of a strict
		// guard cast it, as UPDATE does, or in a lock domain stamp the
		// claimed token.
		later := val
		switch {
		case g.Rollout == Enforce && !g.AllowMissingToken && domainChecked(g):
			later = v.expr(v.domainStamp(g))
		case g.Rollout == Enforce && !g.AllowMissingToken:
			later = v.expr(v.strictCast(g))
		}
		for i, row := range sel.ValuesLists {
			items := row.GetList().GetItems()
			want := val
			if i > 0 {
				want = later
			}
			if len(items) == 0 || !proto.Equal(items[len(items)-1], want) {
				return fmt.Errorf("%s: VALUES row %d does not end with the epoch", g.name, i+1)
			}
			row.GetList().Items = items[:len(items)-1]
		}
		if len(n.Cols) == 0 && len(sel.ValuesLists) == 1 && len(sel.ValuesLists[0].GetList().Items) == 0 &&
			proto.Equal(sel, &pg_query.SelectStmt{ValuesLists: sel.ValuesLists, LimitOption: sel.LimitOption, Op: sel.Op}) {
			n.SelectStmt = nil // was DEFAULT VALUES
		}
	case isWrap(sel, isVal):
		n.SelectStmt = sel.FromClause[0].GetRangeSubselect().Subquery
	default:
		tl := sel.TargetList
		if len(tl) == 0 || tl[len(tl)-1].GetResTarget().GetName() != "" || !isVal(tl[len(tl)-1].GetResTarget().GetVal()) {
			return fmt.Errorf("%s: the INSERT's SELECT list does not end with the epoch", g.name)
		}
		sel.TargetList = tl[:len(tl)-1]
	}
	if oc := n.OnConflictClause; oc != nil && oc.Action == pg_query.OnConflictAction_ONCONFLICT_UPDATE {
		ref := refOf(n.Relation)
		var err error
		if oc.TargetList, err = v.unstamp(g, ref, oc.TargetList); err != nil {
			return err
		}
		if oc.WhereClause, err = v.unfenceWhere(g, ref, oc.WhereClause, true); err != nil {
			return err
		}
	}
	return nil
}

// isWrap recognises SELECT pgfence_rows.*, V FROM (...) AS pgfence_rows.
func isWrap(sel *pg_query.SelectStmt, isVal func(*pg_query.Node) bool) bool {
	if len(sel.TargetList) != 2 || len(sel.FromClause) != 1 {
		return false
	}
	star := sel.TargetList[0].GetResTarget().GetVal().GetColumnRef().GetFields()
	sub := sel.FromClause[0].GetRangeSubselect()
	if len(star) != 2 || star[0].GetString_().GetSval() != "pgfence_rows" || star[1].GetAStar() == nil ||
		!isVal(sel.TargetList[1].GetResTarget().GetVal()) || sub == nil || sub.Alias.GetAliasname() != "pgfence_rows" ||
		len(sub.Alias.Colnames) > 0 || sub.Lateral {
		return false
	}
	rest := &pg_query.SelectStmt{TargetList: sel.TargetList, FromClause: sel.FromClause, LimitOption: sel.LimitOption, Op: sel.Op}
	return proto.Equal(sel, rest)
}

// andOf rebuilds the client's condition from args that the parser
// flattened into the fence's AND.
func andOf(args []*pg_query.Node) *pg_query.Node {
	if len(args) == 1 {
		return args[0]
	}
	return &pg_query.Node{Node: &pg_query.Node_BoolExpr{BoolExpr: &pg_query.BoolExpr{Boolop: pg_query.BoolExprType_AND_EXPR, Args: args}}}
}

// stripLocations returns a copy of n without byte offsets, so trees of
// texts that differ only in layout compare equal.
func stripLocations(n *pg_query.Node) *pg_query.Node {
	c := proto.Clone(n).(*pg_query.Node)
	var strip func(m protoreflect.Message)
	strip = func(m protoreflect.Message) {
		for _, name := range []protoreflect.Name{"location", "stmt_location", "stmt_len", "arg_location"} {
			if fd := m.Descriptor().Fields().ByName(name); fd != nil {
				m.Clear(fd)
			}
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.Message() == nil:
			case fd.IsList():
				for i := 0; i < v.List().Len(); i++ {
					strip(v.List().Get(i).Message())
				}
			default:
				strip(v.Message())
			}
			return true
		})
	}
	strip(c.ProtoReflect())
	return c
}

func stmtText(sql string, s *pg_query.RawStmt) string {
	if s.StmtLen == 0 {
		return sql[s.StmtLocation:]
	}
	return sql[s.StmtLocation : s.StmtLocation+s.StmtLen]
}

// codeText cuts a statement's text after its last token: comments after
// it go after the probe.
func codeText(sql string) string {
	scan, err := pg_query.Scan(sql)
	if err != nil {
		return sql
	}
	for i := len(scan.Tokens) - 1; i >= 0; i-- {
		if k := scan.Tokens[i].Token; k != pg_query.Token_SQL_COMMENT && k != pg_query.Token_C_COMMENT {
			return sql[:scan.Tokens[i].End]
		}
	}
	return sql
}

func countStmts(sql string) (int, error) {
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return 0, err
	}
	return len(tree.Stmts), nil
}
