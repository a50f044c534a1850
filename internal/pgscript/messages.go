package pgscript

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Shorthands for the messages scripts use most.

// Messages without fields.
var (
	Sync          = &pgproto3.Sync{}
	Flush         = &pgproto3.Flush{}
	Terminate     = &pgproto3.Terminate{}
	ParseComplete = &pgproto3.ParseComplete{}
	BindComplete  = &pgproto3.BindComplete{}
	CloseComplete = &pgproto3.CloseComplete{}
	NoData        = &pgproto3.NoData{}
	EmptyQuery    = &pgproto3.EmptyQueryResponse{}
)

// Query is a simple-protocol Query of sql.
func Query(sql string) *pgproto3.Query { return &pgproto3.Query{String: sql} }

// Parse is a Parse of sql as the unnamed statement, declaring oids.
func Parse(sql string, oids ...uint32) *pgproto3.Parse {
	return &pgproto3.Parse{Query: sql, ParameterOIDs: oids}
}

// ParseNamed is a Parse of sql as the statement name, declaring oids.
func ParseNamed(name, sql string, oids ...uint32) *pgproto3.Parse {
	return &pgproto3.Parse{Name: name, Query: sql, ParameterOIDs: oids}
}

// Bind binds the statement stmt to the unnamed portal, with text values.
func Bind(stmt string, vals ...string) *pgproto3.Bind {
	return &pgproto3.Bind{PreparedStatement: stmt, Parameters: Params(vals...)}
}

// What a Describe or Close names.
const (
	statement byte = 'S'
	portal    byte = 'P'
)

// Execute runs the portal to the end.
func Execute(portal string) *pgproto3.Execute { return &pgproto3.Execute{Portal: portal} }

// CloseStatement and ClosePortal close the statement or portal name.
func CloseStatement(name string) *pgproto3.Close {
	return &pgproto3.Close{ObjectType: statement, Name: name}
}
func ClosePortal(name string) *pgproto3.Close { return &pgproto3.Close{ObjectType: portal, Name: name} }

// DescribeStatement and DescribePortal describe the statement or portal
// name.
func DescribeStatement(name string) *pgproto3.Describe {
	return &pgproto3.Describe{ObjectType: statement, Name: name}
}
func DescribePortal(name string) *pgproto3.Describe {
	return &pgproto3.Describe{ObjectType: portal, Name: name}
}

// ReadyForQuery's transaction statuses, for Ready.
const (
	Idle    byte = 'I' // not in a transaction block
	InBlock byte = 'T' // in a transaction block
	Failed  byte = 'E' // in a failed transaction block
)

// Ready is ReadyForQuery with the transaction status s (Idle, InBlock or
// Failed).
func Ready(s byte) *pgproto3.ReadyForQuery { return &pgproto3.ReadyForQuery{TxStatus: s} }

// Complete is CommandComplete with tag.
func Complete(tag string) *pgproto3.CommandComplete {
	return &pgproto3.CommandComplete{CommandTag: []byte(tag)}
}

// Row is a DataRow of text values.
func Row(vals ...string) *pgproto3.DataRow {
	row := &pgproto3.DataRow{Values: make([][]byte, len(vals))}
	for i, v := range vals {
		row.Values[i] = []byte(v)
	}
	return row
}

// Columns is a RowDescription of text columns named names.
func Columns(names ...string) *pgproto3.RowDescription {
	rd := &pgproto3.RowDescription{}
	for _, n := range names {
		rd.Fields = append(rd.Fields, pgproto3.FieldDescription{Name: []byte(n), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1})
	}
	return rd
}

// Error is an ErrorResponse of severity ERROR with code and message.
func Error(code, message string) *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: code, Message: message}
}

// Notice is a NoticeResponse of severity sev with code and message.
func Notice(sev, code, message string) *pgproto3.NoticeResponse {
	return &pgproto3.NoticeResponse{Severity: sev, SeverityUnlocalized: sev, Code: code, Message: message}
}

// Params are a Bind's text values.
func Params(vals ...string) [][]byte {
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = []byte(v)
	}
	return out
}

// Front flattens frontend messages and lists of them into one list.
func Front(parts ...any) []pgproto3.FrontendMessage {
	var out []pgproto3.FrontendMessage
	for _, p := range parts {
		switch p := p.(type) {
		case pgproto3.FrontendMessage:
			out = append(out, p)
		case []pgproto3.FrontendMessage:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("pgscript.Front: %T is not a frontend message", p))
		}
	}
	return out
}

// Back flattens backend messages and lists of them into one list.
func Back(parts ...any) []pgproto3.BackendMessage {
	var out []pgproto3.BackendMessage
	for _, p := range parts {
		switch p := p.(type) {
		case pgproto3.BackendMessage:
			out = append(out, p)
		case []pgproto3.BackendMessage:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("pgscript.Back: %T is not a backend message", p))
		}
	}
	return out
}
