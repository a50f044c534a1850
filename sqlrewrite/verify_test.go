package sqlrewrite

import (
	"fmt"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// verify checks a Rewrite result against its input independently of how the
// rewriter works: refusals are the refusal statement; otherwise the output
// parses, every top-level UPDATE/DELETE of a guarded table is fenced and
// otherwise means the same, probes follow fenced statements in Simple mode,
// and every other statement is byte-identical.
func verify(r *Rewriter, in string, mode Mode, res *Result) error {
	if res.Refusal != nil {
		if res.SQL != refusalSQL(res.Refusal) || len(res.Fenced) > 0 {
			return fmt.Errorf("refusal result carries other SQL or fences: %q", res.SQL)
		}
		if n, err := countStmts(res.SQL); err != nil || n != 1 {
			return fmt.Errorf("refusal SQL %q: %d statements, %v", res.SQL, n, err)
		}
		return nil
	}
	inTree, inErr := pg_query.Parse(in)
	if res.SQL == in && len(res.Fenced) == 0 {
		if inErr == nil && countGuardedTop(r, inTree) > 0 {
			return fmt.Errorf("input has a guarded UPDATE/DELETE but was left alone")
		}
		return nil
	}
	if inErr != nil {
		return fmt.Errorf("input does not parse (%v) but was not refused", inErr)
	}
	outTree, err := pg_query.Parse(res.SQL)
	if err != nil {
		return fmt.Errorf("output does not parse: %v\n%s", err, res.SQL)
	}
	return compareStmts(r, in, inTree.Stmts, res, outTree.Stmts, mode)
}

func compareStmts(r *Rewriter, in string, ins []*pg_query.RawStmt, res *Result, outs []*pg_query.RawStmt, mode Mode) error {
	j, fenced := 0, 0
	next := func() (*pg_query.RawStmt, error) {
		if j >= len(outs) {
			return nil, fmt.Errorf("output has only %d statements", len(outs))
		}
		j++
		return outs[j-1], nil
	}
	for _, s := range ins {
		out, err := next()
		if err != nil {
			return err
		}
		g := guardedTop(r, s.Stmt)
		if g == nil {
			if a, b := stmtText(in, s), stmtText(res.SQL, out); a != b {
				return fmt.Errorf("unfenced statement changed:\n%q\n%q", a, b)
			}
			continue
		}
		if err := checkFence(g, s.Stmt, out.Stmt); err != nil {
			return fmt.Errorf("%v\nin:  %s\nout: %s", err, stmtText(in, s), stmtText(res.SQL, out))
		}
		if fenced >= len(res.Fenced) {
			return fmt.Errorf("statement fenced but not listed in Fenced")
		}
		f := res.Fenced[fenced]
		fenced++
		if f.Table != g.Name() {
			return fmt.Errorf("Fenced.Table = %q, want %q", f.Table, g.Name())
		}
		if mode == Prepared {
			if f.ProbeIndex != -1 {
				return fmt.Errorf("ProbeIndex %d in Prepared mode", f.ProbeIndex)
			}
			continue
		}
		if f.ProbeIndex != j {
			return fmt.Errorf("ProbeIndex = %d, want %d", f.ProbeIndex, j)
		}
		probe, err := next()
		if err != nil {
			return err
		}
		if txt := stmtText(res.SQL, probe); !strings.HasPrefix(txt, r.ProbeSQL()) {
			return fmt.Errorf("statement %d is not the probe: %q", j-1, txt)
		}
	}
	if j != len(outs) || fenced != len(res.Fenced) {
		return fmt.Errorf("output has %d statements, %d fences; matched %d, %d", len(outs), len(res.Fenced), j, fenced)
	}
	return nil
}

// guardedTop returns the guard of a top-level UPDATE/DELETE, by the rules
// written out again here rather than shared with the rewriter.
func guardedTop(r *Rewriter, stmt *pg_query.Node) *Guard {
	rv := stmt.GetUpdateStmt().GetRelation()
	if d := stmt.GetDeleteStmt(); d != nil {
		rv = d.Relation
	}
	if rv == nil {
		return nil
	}
	for _, g := range r.guards {
		if rv.Relname == g.Table && (g.Schema == "" || rv.Schemaname == "" || rv.Schemaname == g.Schema) {
			return &g.Guard
		}
	}
	return nil
}

func countGuardedTop(r *Rewriter, tree *pg_query.ParseResult) int {
	n := 0
	for _, s := range tree.Stmts {
		if guardedTop(r, s.Stmt) != nil {
			n++
		}
	}
	return n
}

// checkFence checks that out is in fenced: the epoch assignment comes first
// in SET, the WHERE is the client's condition AND the epoch check AND a
// token check, and with those taken away the statement is unchanged.
func checkFence(g *Guard, in, out *pg_query.Node) error {
	in, out = stripLocations(in), stripLocations(out)
	var where **pg_query.Node
	switch o := out.Node.(type) {
	case *pg_query.Node_UpdateStmt:
		tl := o.UpdateStmt.TargetList
		if len(tl) == 0 || tl[0].GetResTarget().GetName() != g.Column {
			return fmt.Errorf("UPDATE does not set %s first", g.Column)
		}
		if !mentions(tl[0], "pgfence_token") {
			return fmt.Errorf("UPDATE sets %s to something other than the token", g.Column)
		}
		o.UpdateStmt.TargetList = tl[1:]
		where = &o.UpdateStmt.WhereClause
	case *pg_query.Node_DeleteStmt:
		where = &o.DeleteStmt.WhereClause
	default:
		return fmt.Errorf("fenced statement became %T", out.Node)
	}
	cond, err := unfence(g, *where)
	if err != nil {
		return err
	}
	*where = cond
	if !proto.Equal(in, out) {
		return fmt.Errorf("fenced statement means something else")
	}
	return nil
}

// unfence takes the fence off a WHERE clause, returning the client's
// condition (nil if there was none).
func unfence(g *Guard, w *pg_query.Node) (*pg_query.Node, error) {
	and := w.GetBoolExpr()
	if and == nil || and.Boolop != pg_query.BoolExprType_AND_EXPR || len(and.Args) < 2 {
		return nil, fmt.Errorf("WHERE is not an AND of the fence")
	}
	n := len(and.Args)
	notNull := and.Args[n-1].GetNullTest()
	if notNull == nil || notNull.Nulltesttype != pg_query.NullTestType_IS_NOT_NULL || !mentions(and.Args[n-1], "pgfence_token") {
		return nil, fmt.Errorf("WHERE does not end in TOK IS NOT NULL")
	}
	or := and.Args[n-2].GetBoolExpr()
	if or == nil || or.Boolop != pg_query.BoolExprType_OR_EXPR || len(or.Args) != 2 {
		return nil, fmt.Errorf("WHERE has no epoch check")
	}
	if !mentions(or.Args[0], g.Column) || !mentions(or.Args[1], staleSetting) {
		return nil, fmt.Errorf("epoch check does not compare %s or raise %s", g.Column, staleSetting)
	}
	if n == 2 { // no client WHERE: the stale branch is set_config alone
		if or.Args[1].GetNullTest() == nil {
			return nil, fmt.Errorf("stale branch without a client WHERE is not set_config IS NULL")
		}
		return nil, nil
	}
	cond := andOf(and.Args[:n-2])
	inner := or.Args[1].GetBoolExpr()
	if inner == nil || inner.Boolop != pg_query.BoolExprType_AND_EXPR || len(inner.Args) < 2 ||
		!proto.Equal(andOf(inner.Args[:len(inner.Args)-1]), cond) {
		return nil, fmt.Errorf("stale branch does not repeat the client's condition")
	}
	return cond, nil
}

// andOf rebuilds the client's condition from args that the parser
// flattened into the fence's AND.
func andOf(args []*pg_query.Node) *pg_query.Node {
	if len(args) == 1 {
		return args[0]
	}
	return &pg_query.Node{Node: &pg_query.Node_BoolExpr{BoolExpr: &pg_query.BoolExpr{Boolop: pg_query.BoolExprType_AND_EXPR, Args: args}}}
}

// mentions reports whether a column, alias or string constant named s
// occurs in n.
func mentions(n *pg_query.Node, s string) bool {
	found := false
	eachMessage(n.ProtoReflect(), func(m proto.Message) {
		switch v := m.(type) {
		case *pg_query.String:
			found = found || v.Sval == s
		case *pg_query.Alias:
			found = found || v.Aliasname == s
		}
	})
	return found
}

// stripLocations returns a copy of n without byte offsets, so trees of
// texts that differ only in layout compare equal.
func stripLocations(n *pg_query.Node) *pg_query.Node {
	c := proto.Clone(n).(*pg_query.Node)
	var strip func(m protoreflect.Message)
	strip = func(m protoreflect.Message) {
		if fd := m.Descriptor().Fields().ByName("location"); fd != nil {
			m.Clear(fd)
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

func countStmts(sql string) (int, error) {
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return 0, err
	}
	return len(tree.Stmts), nil
}
