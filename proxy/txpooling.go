package proxy

import (
	"crypto/rand"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Transaction pooling: see the package documentation.

// PooledSets is what an Interceptor tells the proxy behind a transaction
// pooler (Config.TransactionPooling requires it): the statement that sets
// a session's token settings.
type PooledSets interface {
	// PooledSet returns the statement for c's session, under the
	// configuration in force now: the proxy asks for it each time it sets
	// the token settings.
	PooledSet(c *Client) *PooledSet
}

// PooledSet is the statement that sets every token setting of a
// configuration for the transaction it runs in, once per transaction (see
// Transaction pooling in the package documentation). The Interceptor
// writes it, in both forms; the proxy only gives it the session's values
// and nonce.
type PooledSet struct {
	names []string
	ext   string // the statement with parameters: $1 the nonce, $i+1 value i
	text  func(nonce string, values []string) string
}

// NewPooledSet returns the statement that sets the settings names (lower
// case), in the two forms the Interceptor's package writes
// (sqlrewrite.PooledSetSQL): ext, with parameters, $1 the nonce and $i+1
// the session's value of names[i-1] ("" for none), each of type text; and
// text, which makes it with the nonce and the values (values[i] the
// session's value of names[i]) as literals, ended so that a Query's
// statements can follow it. It is immutable and safe for concurrent use.
func NewPooledSet(names []string, ext string, text func(nonce string, values []string) string) (*PooledSet, error) {
	if ext == "" || text == nil {
		return nil, errors.New("proxy: a PooledSet needs its statement with parameters and its text with literals")
	}
	return &PooledSet{names: slices.Clone(names), ext: ext, text: text}, nil
}

// pooledSession is what a session behind a transaction pooler keeps of its
// own (see setState.deferred for its token settings' values).
type pooledSession struct {
	// nonce is what the marker of the session's settings holds in its
	// transaction: drawn with crypto/rand, never logged, and drawn anew
	// whenever a client message finds the session idle (see arrive), so
	// that one a client could read, or leave on a server connection, is
	// not one still to be used. (Drawn at a ReadyForQuery instead, it
	// could change in the middle of a transaction the client pipelined
	// ahead of the replies, and undo a SET LOCAL of its.)
	nonce string
	// startup are the token settings of the startup packet, which a RESET
	// goes back to, as Postgres's would.
	startup []Setting
}

// pooledValue returns the session's value of the token setting name.
func (t *setState) pooledValue(name string) string {
	for _, d := range t.deferred {
		if d.Name == name {
			return d.Value
		}
	}
	return ""
}

// Replies to writePooled: CloseComplete and ParseComplete, BindComplete,
// CloseComplete of the statement, then DataRow, CommandComplete and
// CloseComplete of the portal.
const pooledSetReplies = 7

// writePooled writes to out (built in l's buffer) set, the statement that
// sets the session's token settings in the transaction, as the statement
// name, and sets the replies w wants.
func (t *setState) writePooled(l *link, out msgWriter, set *PooledSet, name string, w *wait) error {
	b := l.out[:0]
	b, _ = (&pgproto3.Close{ObjectType: byte(targetStatement), Name: name}).Encode(b)
	types := make([]uint32, len(set.names)+1)
	for i := range types {
		types[i] = 25 // text
	}
	b, _ = (&pgproto3.Parse{Name: name, Query: set.ext, ParameterOIDs: types}).Encode(b)
	values := make([][]byte, 0, len(types))
	values = append(values, []byte(t.pool.nonce))
	for _, n := range set.names {
		values = append(values, []byte(t.pooledValue(n)))
	}
	b, _ = (&pgproto3.Bind{DestinationPortal: setStmt, PreparedStatement: name, Parameters: values}).Encode(b)
	// Closed before its portal runs, so that no error can leave it behind.
	b, _ = (&pgproto3.Close{ObjectType: byte(targetStatement), Name: name}).Encode(b)
	b = append(b, setRunTail...)
	l.out = b
	w.want = pooledSetReplies
	_, err := out.Write(b)
	return err
}

// startPooled readies the session for transaction pooling: it has the
// token settings of its startup packet, a nonce, and the token setting
// (token, as the Interceptor names it), unset unless the startup packet
// set it.
func (t *setState) startPooled(startup []Setting, token string) {
	t.pool.nonce = rand.Text()
	t.pool.startup = startup
	t.deferred = append(t.deferred[:0], startup...)
	if !slices.ContainsFunc(startup, func(set Setting) bool { return set.Name == token }) {
		t.deferred = append(t.deferred, Setting{Name: token})
	}
}

// keepPooled keeps set, a SET or RESET the proxy answered, as the
// session's value of its setting: a RESET goes back to the startup
// packet's value, as Postgres's would.
func (t *setState) keepPooled(set *Setting) {
	value := set.Value
	if set.Reset {
		value = ""
		for _, st := range t.pool.startup {
			if st.Name == set.Name {
				value = st.Value
			}
		}
	}
	for i := range t.deferred {
		if t.deferred[i].Name == set.Name {
			t.deferred[i].Value = value
			return
		}
	}
	t.deferred = append(t.deferred, Setting{Name: set.Name, Value: value})
}

// needsToken reports whether the token settings go ahead of the client's
// Bind m (ok says it was decoded whole) under transaction pooling: it
// binds a statement that may need them, or one the book does not know
// (prepared with SQL PREPARE, say).
func (b *stmtBook) needsToken(m bindMsg, ok bool) bool {
	if !ok {
		return false // the server refuses it
	}
	st := b.stmts[string(m.stmt)]
	return st == nil || st.token
}

// pooledQuery puts set, the statement that sets the token settings, in
// front of a Query whose text is text and plan needs them, and again at each
// statement of it that starts a transaction of its own (Plan.TxStarts):
// the Query's replies to them are kept from the client (probes of their
// own), and error positions are mapped past them.
func (t *setState) pooledQuery(set *PooledSet, plan *Plan, text []byte) {
	values := make([]string, len(set.names))
	for i, n := range set.names {
		values[i] = t.pooledValue(n)
	}
	stmt := set.text(t.pool.nonce, values)
	sql := plan.SQL
	if sql == "" {
		sql = string(text)
	}
	// The statement goes first, and before each start.
	var b strings.Builder
	b.WriteString(stmt)
	at := []int{0}
	last := 0
	for _, st := range plan.TxStarts {
		if st.Offset < last || st.Offset > len(sql) {
			continue // not the Interceptor's promise: skip it rather than cut a statement
		}
		b.WriteString(sql[last:st.Offset])
		at = append(at, st.Offset)
		b.WriteString(stmt)
		last = st.Offset
	}
	b.WriteString(sql[last:])
	plan.SQL = b.String()

	probes := make([]ProbeAt, 0, len(plan.Probes)+1+len(plan.TxStarts))
	probes = append(probes, ProbeAt{Index: 0, Probe: pooledProbe})
	inserted := 1 // statements put in before the one at hand
	k := 0
	for _, p := range plan.Probes {
		for ; k < len(plan.TxStarts) && plan.TxStarts[k].Index <= p.Index; k++ {
			probes = append(probes, ProbeAt{Index: plan.TxStarts[k].Index + inserted, Probe: pooledProbe})
			inserted++
		}
		probes = append(probes, ProbeAt{Index: p.Index + inserted, Probe: p.Probe})
	}
	for ; k < len(plan.TxStarts); k++ {
		probes = append(probes, ProbeAt{Index: plan.TxStarts[k].Index + inserted, Probe: pooledProbe})
		inserted++
	}
	plan.Probes = probes
	plan.Origin = insertOrigin{inner: plan.Origin, sql: sql, at: at,
		chars: utf8.RuneCountInString(stmt), bytes: len(stmt)}
}

// pooledProbe keeps the replies to pooledQuery's statement from the client.
var pooledProbe = NewProbe("", func(*Client, [][]byte) *pgproto3.NoticeResponse { return nil })

// insertOrigin maps error positions in a text that pooledQuery put
// statements into: one of chars characters (bytes bytes) at each byte
// offset at of sql.
type insertOrigin struct {
	inner        Origin
	sql          string
	at           []int
	chars, bytes int
}

func (o insertOrigin) Position(c *Client, pos int, params []string) int {
	asBytes := c.ServerEncoding() == "SQL_ASCII" // Postgres counts bytes there
	n, shift := o.chars, 0
	if asBytes {
		n = o.bytes
	}
	for _, off := range o.at {
		start := off
		if !asBytes {
			start = utf8.RuneCountInString(o.sql[:off])
		}
		if pos-1 < start+shift {
			break
		}
		if pos-1 < start+shift+n {
			return 0 // in a statement of the proxy's
		}
		shift += n
	}
	if o.inner == nil {
		return pos - shift
	}
	return o.inner.Position(c, pos-shift, params)
}

func (o insertOrigin) Param(c *Client, n int, params []string) int {
	if o.inner == nil {
		return 0
	}
	return o.inner.Param(c, n, params)
}
