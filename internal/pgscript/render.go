package pgscript

import (
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A message is compared, and shown in a failure, as its kind and a list of
// fields rendered as text: the fields that matter to the protocol (a
// Parse's name, text and parameter types; a Bind's statement, portal,
// formats and values; ...). Name fields (statement and portal names) of an
// expected message may hold placeholders, {var}: see Vars.

type field struct {
	key    string
	value  string // rendered
	name   bool   // a statement or portal name: raw holds it unquoted
	rawVal string
}

type rendered struct {
	kind   string
	fields []field
}

func (r rendered) String() string {
	var b strings.Builder
	b.WriteString(r.kind)
	for _, f := range r.fields {
		b.WriteByte(' ')
		if f.key != "" {
			b.WriteString(f.key)
			b.WriteByte('=')
		}
		b.WriteString(f.value)
	}
	return b.String()
}

func str(key, v string) field { return field{key: key, value: strconv.Quote(v)} }

func name(key, v string) field {
	return field{key: key, value: strconv.Quote(v), name: true, rawVal: v}
}

func num[T ~int16 | ~int32 | ~uint16 | ~uint32](key string, v T) field {
	return field{key: key, value: strconv.FormatInt(int64(v), 10)}
}

func list[T ~int16 | ~uint32](key string, vs []T) field {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(int64(v), 10)
	}
	return field{key: key, value: "[" + strings.Join(parts, " ") + "]"}
}

func values(key string, vs [][]byte) field {
	parts := make([]string, len(vs))
	for i, v := range vs {
		if v == nil {
			parts[i] = "NULL"
		} else {
			parts[i] = strconv.Quote(string(v))
		}
	}
	return field{key: key, value: "[" + strings.Join(parts, " ") + "]"}
}

func object(t byte) field { return field{value: string(t)} }

// render renders a frontend or backend message.
func render(m pgproto3.Message) rendered {
	kind := strings.TrimPrefix(fmt.Sprintf("%T", m), "*pgproto3.")
	var fs []field
	switch m := m.(type) {
	// Frontend messages.
	case *pgproto3.Query:
		fs = []field{str("", m.String)}
	case *pgproto3.Parse:
		fs = []field{name("name", m.Name), str("query", m.Query), list("oids", m.ParameterOIDs)}
	case *pgproto3.Bind:
		fs = []field{name("portal", m.DestinationPortal), name("stmt", m.PreparedStatement)}
		if len(m.ParameterFormatCodes) > 0 {
			fs = append(fs, list("formats", m.ParameterFormatCodes))
		}
		fs = append(fs, values("params", m.Parameters))
		if len(m.ResultFormatCodes) > 0 {
			fs = append(fs, list("results", m.ResultFormatCodes))
		}
	case *pgproto3.Execute:
		fs = []field{name("portal", m.Portal)}
		if m.MaxRows != 0 {
			fs = append(fs, num("max", m.MaxRows))
		}
	case *pgproto3.Close:
		fs = []field{object(m.ObjectType), name("", m.Name)}
	case *pgproto3.Describe:
		fs = []field{object(m.ObjectType), name("", m.Name)}
	case *pgproto3.CopyData:
		fs = []field{str("", string(m.Data))}
	case *pgproto3.CopyFail:
		fs = []field{str("", m.Message)}
	case *pgproto3.FunctionCall:
		fs = []field{num("oid", m.Function), values("args", m.Arguments)}
	case *pgproto3.StartupMessage:
		fs = []field{num("version", m.ProtocolVersion)}
		keys := make([]string, 0, len(m.Parameters))
		for k := range m.Parameters {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fs = append(fs, str(k, m.Parameters[k]))
		}

	// Backend messages.
	case *pgproto3.CommandComplete:
		fs = []field{str("", string(m.CommandTag))}
	case *pgproto3.ReadyForQuery:
		fs = []field{object(m.TxStatus)}
	case *pgproto3.DataRow:
		fs = []field{values("", m.Values)}
	case *pgproto3.RowDescription:
		parts := make([]string, len(m.Fields))
		for i, f := range m.Fields {
			parts[i] = fmt.Sprintf("%s:%d", f.Name, f.DataTypeOID)
		}
		fs = []field{{value: "[" + strings.Join(parts, " ") + "]"}}
	case *pgproto3.ParameterDescription:
		fs = []field{list("oids", m.ParameterOIDs)}
	case *pgproto3.ErrorResponse:
		fs = errorFields(m)
	case *pgproto3.NoticeResponse:
		fs = errorFields((*pgproto3.ErrorResponse)(m))
	case *pgproto3.ParameterStatus:
		fs = []field{str(m.Name, m.Value)}
	case *pgproto3.BackendKeyData:
		fs = []field{num("pid", m.ProcessID), {key: "key", value: hex.EncodeToString(m.SecretKey)}}
	case *pgproto3.NotificationResponse:
		fs = []field{num("pid", m.PID), str("channel", m.Channel), str("payload", m.Payload)}
	case *unknown:
		kind = fmt.Sprintf("Unknown(%q)", m.typ)
		fs = []field{str("body", string(m.body))}
	}
	return rendered{kind: kind, fields: fs}
}

// errorFields are the fields of an error or notice that the protocol tests
// look at; the source location and the object names are left out.
func errorFields(e *pgproto3.ErrorResponse) []field {
	fs := []field{{value: e.Severity}, {value: e.Code}, str("", e.Message)}
	for _, f := range []struct{ k, v string }{{"detail", e.Detail}, {"hint", e.Hint}, {"where", e.Where}} {
		if f.v != "" {
			fs = append(fs, str(f.k, f.v))
		}
	}
	if e.Position != 0 {
		fs = append(fs, num("position", e.Position))
	}
	return fs
}

// Vars are the values the placeholders of a conversation stand for. A name
// field of an expected message may hold placeholders, {var}: the first
// message that matches one binds the var to what it stands for there (one
// or more characters); from then on it stands for that value alone. So
// names the proxy makes up (its session tag, a probe's number) are checked
// to stay the same wherever the script says they are the same.
type Vars map[string]string

var placeholder = regexp.MustCompile(`\{([A-Za-z0-9_]+)\}`)

// matchName matches got against the expected name want, binding vars
// (into bind, committed by the caller).
func (v Vars) matchName(want, got string, bind Vars) bool {
	var re strings.Builder
	re.WriteString("^")
	var groups []string
	last := 0
	for _, loc := range placeholder.FindAllStringSubmatchIndex(want, -1) {
		re.WriteString(regexp.QuoteMeta(want[last:loc[0]]))
		key := want[loc[2]:loc[3]]
		if val, ok := v[key]; ok {
			re.WriteString(regexp.QuoteMeta(val))
		} else if val, ok := bind[key]; ok {
			re.WriteString(regexp.QuoteMeta(val))
		} else if slices.Contains(groups, key) {
			return false // the same new var twice in one name: not supported
		} else {
			groups = append(groups, key)
			re.WriteString("(?P<" + key + ">.+?)")
		}
		last = loc[1]
	}
	re.WriteString(regexp.QuoteMeta(want[last:]))
	re.WriteString("$")
	rx := regexp.MustCompile(re.String())
	m := rx.FindStringSubmatch(got)
	if m == nil {
		return false
	}
	for i, g := range rx.SubexpNames() {
		if g != "" {
			bind[g] = m[i]
		}
	}
	return true
}

// match reports whether got is the message want, binding the placeholders
// of want's names in v when it is.
func (v Vars) match(want, got rendered) bool {
	if want.kind != got.kind || len(want.fields) != len(got.fields) {
		return false
	}
	bind := Vars{}
	for i, w := range want.fields {
		g := got.fields[i]
		if w.key != g.key || w.name != g.name {
			return false
		}
		if w.name {
			if !v.matchName(w.rawVal, g.rawVal, bind) {
				return false
			}
		} else if w.value != g.value {
			return false
		}
	}
	for k, val := range bind {
		v[k] = val
	}
	return true
}

// diff shows want and got one message a line, marking the first that
// differs (at index at) with ">".
func diff(want, got []rendered, at int, v Vars) string {
	var b strings.Builder
	show := func(title string, ms []rendered) {
		fmt.Fprintf(&b, "\n  %s:", title)
		if len(ms) == 0 {
			b.WriteString(" (nothing)")
		}
		for i, m := range ms {
			mark := "   "
			if i == at {
				mark = " > "
			}
			fmt.Fprintf(&b, "\n   %s%s", mark, m)
		}
	}
	show("want", want)
	show("got", got)
	if len(v) > 0 {
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteString("\n  vars:")
		for _, k := range keys {
			fmt.Fprintf(&b, " {%s}=%s", k, v[k])
		}
	}
	return b.String()
}
