package proxy

import (
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Transaction pooling: see the package documentation.

// markerPrefix starts the name of the setting that marks a token setting
// as set by the proxy in the transaction.
const markerPrefix = "pgfence.tx."

// pooledSQL returns the statement that sets n token settings, at most once
// per transaction: $1, $2 are the first one's name and value, and so on.
// Every operator is schema-qualified, so the client's search_path cannot
// change what it does.
func pooledSQL(n int) string {
	if v, ok := pooledSQLs.Load(n); ok {
		return v.(string)
	}
	var b strings.Builder
	b.WriteString("SELECT ")
	for i := range n {
		name, value := "$"+strconv.Itoa(2*i+1), "$"+strconv.Itoa(2*i+2)
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pooledSet(name, value))
	}
	sql := b.String()
	pooledSQLs.Store(n, sql)
	return sql
}

var pooledSQLs sync.Map

// pooledSet is the expression that sets the setting name (an SQL
// expression) to value, and its marker, unless the marker is set.
func pooledSet(name, value string) string {
	marker := "'" + markerPrefix + "' OPERATOR(pg_catalog.||) " + name
	return "CASE WHEN COALESCE(pg_catalog.current_setting(" + marker + ", true), '') OPERATOR(pg_catalog.<>) 'y' THEN " +
		"pg_catalog.set_config(" + name + ", " + value + ", true) OPERATOR(pg_catalog.||) pg_catalog.set_config(" + marker + ", 'y', true) END"
}

// Replies to writePooled: CloseComplete and ParseComplete, BindComplete,
// CloseComplete of the statement, then DataRow, CommandComplete and
// CloseComplete of the portal.
const pooledSetReplies = 7

// writePooled writes to out the statement that sets the session's token
// settings in the transaction, and sets the replies w wants.
func (s *session) writePooled(out msgWriter, w *wait) error {
	name := s.apply.stmtName(s.tag)
	b := s.out[:0]
	b, _ = (&pgproto3.Close{ObjectType: 'S', Name: name}).Encode(b)
	types := make([]uint32, 2*len(s.sets.deferred))
	for i := range types {
		types[i] = 25 // text
	}
	b, _ = (&pgproto3.Parse{Name: name, Query: pooledSQL(len(s.sets.deferred)), ParameterOIDs: types}).Encode(b)
	values := make([][]byte, 0, len(types))
	for _, set := range s.sets.deferred {
		values = append(values, []byte(set.Name), []byte(set.Value))
	}
	b, _ = (&pgproto3.Bind{DestinationPortal: setStmt, PreparedStatement: name, Parameters: values}).Encode(b)
	// Closed before its portal runs, so that no error can leave it behind.
	b, _ = (&pgproto3.Close{ObjectType: 'S', Name: name}).Encode(b)
	b = append(b, setRunTail...)
	s.out = b
	w.want = pooledSetReplies
	_, err := out.Write(b)
	return err
}

// txPool reports whether a transaction pooler stands behind the proxy.
func (s *session) txPool() bool { return s.srv.cfg.TransactionPooling }

// startPooled readies a session for transaction pooling: it has the token
// setting, unset.
func (s *session) startPooled() {
	if s.txPool() {
		s.sets.deferred = append(s.sets.deferred[:0], Setting{Name: s.srv.cfg.TokenSetting})
	}
}

// keepPooled keeps set, a SET or RESET the proxy answered, as the
// session's value of its setting.
func (t *setState) keepPooled(set *Setting) {
	for i := range t.deferred {
		if t.deferred[i].Name == set.Name {
			t.deferred[i].Value = set.Value
			return
		}
	}
	t.deferred = append(t.deferred, Setting{Name: set.Name, Value: set.Value})
}

// pooledBind sets the token settings ahead of the client's Bind (n bytes)
// of a statement that may need them (or one the proxy does not know:
// prepared with SQL PREPARE, say).
func (s *session) pooledBind(n int) error {
	b, err := s.peek(n)
	if err != nil {
		return err
	}
	_, rest, err1 := cstring(b)
	stmt, _, err2 := cstring(rest)
	if err1 != nil || err2 != nil {
		return nil // the server refuses it
	}
	if st := s.book.stmts[string(stmt)]; st != nil && !st.token {
		return nil
	}
	return s.sendDeferred(false)
}

// pooledQuery puts the statement that sets the token settings in front of
// a Query whose text is text and plan needs them: the Query's replies to
// it are kept from the client (a probe of its own at index 0), and error
// positions are mapped past it.
func (s *session) pooledQuery(plan *Plan, text []byte) {
	var b strings.Builder
	b.WriteString("SELECT ")
	for i, set := range s.sets.deferred {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pooledSet(quoteLiteral(set.Name), quoteLiteral(set.Value)))
	}
	b.WriteString(";")
	prefix := b.String()
	sql := plan.SQL
	if sql == "" {
		sql = string(text)
	}
	plan.SQL = prefix + sql
	probes := make([]ProbeAt, 0, len(plan.Probes)+1)
	probes = append(probes, ProbeAt{Index: 0, Probe: pooledProbe})
	for _, p := range plan.Probes {
		probes = append(probes, ProbeAt{Index: p.Index + 1, Probe: p.Probe})
	}
	plan.Probes = probes
	plan.Origin = prefixOrigin{inner: plan.Origin, chars: utf8.RuneCountInString(prefix), bytes: len(prefix)}
}

// pooledProbe keeps the replies to pooledQuery's statement from the client.
var pooledProbe = NewProbe("", func(*Client, [][]byte) *pgproto3.NoticeResponse { return nil })

// prefixOrigin maps error positions in a text that pooledQuery put a
// statement in front of.
type prefixOrigin struct {
	inner        Origin
	chars, bytes int
}

func (o prefixOrigin) Position(c *Client, pos int, params []string) int {
	n := o.chars
	if c.ServerEncoding() == "SQL_ASCII" {
		n = o.bytes // Postgres counts bytes there
	}
	if pos <= n {
		return 0
	}
	if o.inner == nil {
		return pos - n
	}
	return o.inner.Position(c, pos-n, params)
}

func (o prefixOrigin) Param(c *Client, n int, params []string) int {
	if o.inner == nil {
		return 0
	}
	return o.inner.Param(c, n, params)
}

// quoteLiteral quotes s as an SQL string that means the same whatever
// standard_conforming_strings says.
func quoteLiteral(s string) string {
	return "E'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `'`, `''`) + "'"
}
