package sqlrewrite

import (
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// pgfence's own settings: see the package documentation.

// InternalPrefix starts the names of pgfence's own settings; Postgres
// compares it, like every setting name, without regard to ASCII case.
const InternalPrefix = "pgfence."

// The parts of the refusal of a change of one of pgfence's own settings,
// which markerHint reads back.
const (
	internalSetting = "the setting "
	internalOwn     = " is pgfence's own: no client may set or reset it through pgfence"
	hintInternal    = "pgfence keeps its own state in the pgfence.* settings; give your settings another prefix"
)

// InternalChange returns the refusal of sql when it would set or reset one
// of pgfence's own settings (see InternalPrefix), however the name is
// written: SET, SET LOCAL, RESET, a SET of a role, a database, the system
// or a function (ALTER ... SET, CREATE FUNCTION ... SET), or set_config
// with the name as a literal; nil when it would not. Reading them (SHOW,
// current_setting) is not refused.
//
// A text that spells none of pgfence, a Unicode escape (U&), or set_config
// together with a backslash or a line break (the escapes and string
// continuations that could spell the name in a literal) is cleared
// without parsing, and without allocating. One that does and that
// pgfence's parser cannot read is refused as such (42601): the server
// may read it, and pgfence cannot say what it sets.
func InternalChange(sql string) *Refusal {
	s := scan{want: internalNeedles}
	s.run(sql, nil, fixedNeedles)
	if !s.found.mayNameInternal() {
		return nil
	}
	return internalChange(sql)
}

// internalChange is InternalChange of a text its prefilter (or Analyze)
// did not clear.
func internalChange(sql string) *Refusal {
	counted("parse", sql)
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return unparsableRefusal(err, "may set one of pgfence's own settings ("+InternalPrefix+"*)", "let it through")
	}
	var name string
	for _, raw := range tree.Stmts {
		eachMessage(raw.ProtoReflect(), func(m proto.Message) {
			if name == "" {
				name = internalName(m)
			}
		})
		if name != "" {
			return InternalRefusal(name)
		}
	}
	return nil
}

// InternalRefusal refuses setting name, one of pgfence's own (42501).
func InternalRefusal(name string) *Refusal {
	return &Refusal{Code: codeForgedEpoch,
		Message: "pgfence: " + internalSetting + strings.ToValidUTF8(asciiLower(name), "\uFFFD") + internalOwn,
		Hint:    hintInternal}
}

// IsInternal reports whether name is one of pgfence's own settings, as
// Postgres compares names.
func IsInternal(name string) bool {
	return len(name) >= len(InternalPrefix) && equalFoldASCII(name[:len(InternalPrefix)], InternalPrefix)
}

// internalName returns the name of the pgfence setting that m sets or
// resets, "" for none.
func internalName(m proto.Message) string {
	switch n := m.(type) {
	case *pg_query.VariableSetStmt:
		if IsInternal(n.Name) {
			return n.Name
		}
	case *pg_query.FuncCall:
		if len(n.Funcname) == 0 || n.Funcname[len(n.Funcname)-1].GetString_().GetSval() != "set_config" || len(n.Args) == 0 {
			return ""
		}
		if s, ok := literal(n.Args[0]); ok && IsInternal(s) {
			return s
		}
	}
	return ""
}

// literal returns the string constant n is, through casts and a named
// argument's name.
func literal(n *pg_query.Node) (string, bool) {
	for {
		switch {
		case n.GetTypeCast() != nil:
			n = n.GetTypeCast().Arg
		case n.GetNamedArgExpr() != nil:
			n = n.GetNamedArgExpr().GetArg()
		case n.GetAConst() != nil && n.GetAConst().GetSval() != nil:
			return n.GetAConst().GetSval().Sval, true
		default:
			return "", false
		}
		if n == nil {
			return "", false
		}
	}
}

// internalHint is the hint of an InternalRefusal whose message (without
// "pgfence: ") is text, "" for any other.
func internalHint(text string) string {
	if strings.HasPrefix(text, internalSetting) && strings.HasSuffix(text, internalOwn) {
		return hintInternal
	}
	return ""
}
