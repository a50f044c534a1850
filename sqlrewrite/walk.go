package sqlrewrite

import (
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// eachMessage calls fn for m and every message nested in it, in tree order.
func eachMessage(m protoreflect.Message, fn func(proto.Message)) {
	walk(m, nil, func(m proto.Message, _ []proto.Message) { fn(m) })
}

// walk calls fn for m and every message nested in it, in tree order, with
// the messages enclosing it, outermost first (fn must not keep anc).
// Walking the tree generically finds statements wherever the grammar lets
// them nest (WITH, EXPLAIN, PREPARE, rules, COPY, function bodies...).
func walk(m protoreflect.Message, anc []proto.Message, fn func(m proto.Message, anc []proto.Message)) {
	msg := m.Interface()
	fn(msg, anc)
	anc = append(anc, msg)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				walk(l.Get(i).Message(), anc, fn)
			}
		default:
			walk(v.Message(), anc, fn)
		}
		return true
	})
}

// inner returns the statement a Node wraps.
func inner(n *pg_query.Node) proto.Message {
	m := n.ProtoReflect()
	od := m.Descriptor().Oneofs().ByName("node")
	fd := m.WhichOneof(od)
	if fd == nil {
		return nil
	}
	return m.Get(fd).Message().Interface()
}

// storedContext returns the innermost enclosing statement that stores a
// statement to run later (a rule, a function body, a view), or nil. A write
// stored there would run without the fence.
func storedContext(anc []proto.Message) proto.Message {
	for i := len(anc) - 1; i >= 0; i-- {
		switch a := anc[i].(type) {
		case *pg_query.RuleStmt, *pg_query.CreateFunctionStmt, *pg_query.ViewStmt:
			return a
		case *pg_query.CreateTableAsStmt:
			if a.Objtype == pg_query.ObjectType_OBJECT_MATVIEW {
				return a
			}
		}
	}
	return nil
}

// stmtKind names a statement type for messages: CreateFunctionStmt becomes
// "CREATE FUNCTION".
func stmtKind(m proto.Message) string {
	switch s := m.(type) {
	case *pg_query.ViewStmt:
		return "CREATE VIEW"
	case *pg_query.CreateTableAsStmt:
		if s.Objtype == pg_query.ObjectType_OBJECT_MATVIEW {
			return "CREATE MATERIALIZED VIEW"
		}
		return "CREATE TABLE AS"
	}
	name := strings.TrimSuffix(string(m.ProtoReflect().Descriptor().Name()), "Stmt")
	var b strings.Builder
	for i, c := range name {
		if i > 0 && 'A' <= c && c <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteRune(c)
	}
	return strings.ToUpper(b.String())
}

// explainAnalyze reports whether an EXPLAIN runs its statement: its last
// analyze option is not false (defGetBoolean accepts true/false/on/off
// and 1/0).
func explainAnalyze(e *pg_query.ExplainStmt) bool {
	analyze := false
	for _, o := range e.Options {
		d := o.GetDefElem()
		if d == nil || d.Defname != "analyze" {
			continue
		}
		analyze = true
		switch a := d.Arg.GetNode().(type) {
		case *pg_query.Node_String_:
			s := asciiLower(a.String_.Sval)
			analyze = s != "false" && s != "off"
		case *pg_query.Node_Integer:
			analyze = a.Integer.Ival != 0
		case *pg_query.Node_Boolean:
			analyze = a.Boolean.Boolval
		}
	}
	return analyze
}
