package sqlrewrite

import (
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// eachMessage calls fn for m and every message nested in it, in tree order.
// Walking the tree generically finds statements wherever the grammar lets
// them nest (WITH, EXPLAIN, PREPARE, rules, COPY, function bodies...).
func eachMessage(m protoreflect.Message, fn func(proto.Message)) {
	fn(m.Interface())
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				eachMessage(l.Get(i).Message(), fn)
			}
		default:
			eachMessage(v.Message(), fn)
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

// writesIn lists the statements in stmt that can write a table, in tree
// order, stmt itself first if it is one.
func writesIn(stmt *pg_query.Node) []proto.Message {
	var out []proto.Message
	eachMessage(stmt.ProtoReflect(), func(m proto.Message) {
		switch m.(type) {
		case *pg_query.UpdateStmt, *pg_query.DeleteStmt, *pg_query.InsertStmt,
			*pg_query.MergeStmt, *pg_query.TruncateStmt, *pg_query.CopyStmt:
			out = append(out, m)
		}
	})
	return out
}

// stmtKind names a statement type for messages: CreateTableAsStmt becomes
// "CREATE TABLE AS".
func stmtKind(m proto.Message) string {
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
