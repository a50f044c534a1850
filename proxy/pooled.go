package proxy

import (
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Transaction pooling (Config.TransactionPooling). A transaction pooler
// such as PgBouncer with pool_mode = transaction hands the server
// connection behind a session to another client whenever a transaction
// ends, so nothing the proxy leaves on it may outlive the transaction:
//
//   - The session's token settings live in the proxy. A plain SET or
//     RESET of one outside a transaction block is answered at once and
//     kept in session.deferred (which then always holds the token setting,
//     "" while unset); anything else that would change one for the session
//     is refused by the Interceptor before it gets here.
//   - Ahead of every statement that may need the token (Plan.NeedsToken),
//     in its transaction, the proxy sets the kept values with set_config
//     (..., true), which lasts until that transaction ends. It does so at
//     most once per transaction: the statement also sets a marker setting
//     per token setting (pgfence.tx.<name>), transaction-local too, and
//     sets nothing while the marker is there, so a SET LOCAL the client
//     ran after it in the same transaction stands. A client that never
//     set a token gets "" set, so it cannot inherit one that another
//     client left on the server connection.
//   - Ahead of extended-protocol messages that is a Parse, Bind, Execute
//     and Close of a statement of the session's own, closed before its
//     portal runs; ahead of a simple Query, which runs in a transaction of
//     its own, a statement put in front of the Query's text, whose replies
//     the client does not see.
//   - The proxy prepares nothing for reuse (Plan.Reuse and the named
//     statements of bound Queries) and its probes' statements are closed
//     as soon as they are bound.

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
	name := s.setName()
	b := s.out[:0]
	b, _ = (&pgproto3.Close{ObjectType: 'S', Name: name}).Encode(b)
	types := make([]uint32, 2*len(s.deferred))
	for i := range types {
		types[i] = 25 // text
	}
	b, _ = (&pgproto3.Parse{Name: name, Query: pooledSQL(len(s.deferred)), ParameterOIDs: types}).Encode(b)
	values := make([][]byte, 0, len(types))
	for _, set := range s.deferred {
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
		s.deferred = append(s.deferred[:0], Setting{Name: s.srv.cfg.TokenSetting})
	}
}

// keepPooled keeps set, a SET or RESET the proxy answered, as the
// session's value of its setting.
func (s *session) keepPooled(set *Setting) {
	for i := range s.deferred {
		if s.deferred[i].Name == set.Name {
			s.deferred[i].Value = set.Value
			return
		}
	}
	s.deferred = append(s.deferred, Setting{Name: set.Name, Value: set.Value})
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
	if st := s.stmts[string(stmt)]; st != nil && !st.token {
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
	for i, set := range s.deferred {
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
