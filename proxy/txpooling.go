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

// txPooling is the transaction-pooling part of a session (see
// Transaction pooling in the package documentation): what a session behind
// a transaction pooler keeps of its own, the client side's. It is off (on
// false, everything else empty) unless Config.TransactionPooling is set.
type txPooling struct {
	on bool
	// sets is the Interceptor's, which writes the statement (see
	// PooledSets), and c the session's client it writes it for.
	sets PooledSets
	c    *Client
	// values are the session's values of its token settings, which always
	// include the token setting's ("" while unset): the SETs and RESETs
	// the proxy answered (see onAnswered), over the startup packet's.
	values []Setting
	// nonce is what the marker of the session's settings holds in its
	// transaction: drawn with crypto/rand, never logged, and drawn anew
	// whenever a client message finds the session idle (see onMessage), so
	// that one a client could read, or leave on a server connection, is
	// not one still to be used. (Drawn at a ReadyForQuery instead, it
	// could change in the middle of a transaction the client pipelined
	// ahead of the replies, and undo a SET LOCAL of its.)
	nonce string
	// startup are the token settings of the startup packet, which a RESET
	// goes back to, as Postgres's would.
	startup []Setting
}

// start turns the part on for c: it has the token settings of its startup
// packet, a nonce, and the token setting (token, as the Interceptor names
// it), unset unless the startup packet set it.
func (p *txPooling) start(sets PooledSets, c *Client, startup []Setting, token string) {
	p.on, p.sets, p.c = true, sets, c
	p.nonce = rand.Text()
	p.startup = startup
	p.values = append(p.values[:0], startup...)
	if !slices.ContainsFunc(startup, func(set Setting) bool { return set.Name == token }) {
		p.values = append(p.values, Setting{Name: token})
	}
}

// onMessage notes that a client message arrived, idle saying it found the
// session idle: it starts a transaction then, with nothing of an earlier
// one in flight, and the session draws a new nonce for it (see nonce).
func (p *txPooling) onMessage(idle bool) {
	if idle && p.on {
		p.nonce = rand.Text()
	}
}

// statement returns the statement that sets the session's token settings
// under the configuration in force, nil while the part is off.
func (p *txPooling) statement() *PooledSet {
	if !p.on {
		return nil
	}
	return p.sets.PooledSet(p.c)
}

// value returns the session's value of the token setting name.
func (p *txPooling) value(name string) string {
	for _, d := range p.values {
		if d.Name == name {
			return d.Value
		}
	}
	return ""
}

// Replies to write: CloseComplete and ParseComplete, BindComplete,
// CloseComplete of the statement, then DataRow, CommandComplete and
// CloseComplete of the portal.
const pooledSetReplies = 7

// write writes to out (built in l's buffer) the statement that sets the
// session's token settings in the transaction, as the statement name, and
// sets the replies w wants.
func (p *txPooling) write(l *link, out msgWriter, name string, w *wait) error {
	set := p.statement()
	b := l.out[:0]
	b, _ = (&pgproto3.Close{ObjectType: byte(targetStatement), Name: name}).Encode(b)
	types := make([]uint32, len(set.names)+1)
	for i := range types {
		types[i] = 25 // text
	}
	b, _ = (&pgproto3.Parse{Name: name, Query: set.ext, ParameterOIDs: types}).Encode(b)
	values := make([][]byte, 0, len(types))
	values = append(values, []byte(p.nonce))
	for _, n := range set.names {
		values = append(values, []byte(p.value(n)))
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

// onAnswered keeps set, a SET or RESET the proxy answered, as the
// session's value of its setting: a RESET goes back to the startup
// packet's value, as Postgres's would.
func (p *txPooling) onAnswered(set *Setting) {
	if !p.on {
		return // the deferred-settings part keeps it
	}
	value := set.Value
	if set.Reset {
		value = ""
		for _, st := range p.startup {
			if st.Name == set.Name {
				value = st.Value
			}
		}
	}
	for i := range p.values {
		if p.values[i].Name == set.Name {
			p.values[i].Value = value
			return
		}
	}
	p.values = append(p.values, Setting{Name: set.Name, Value: value})
}

// onBind reports whether the token settings go ahead of the client's Bind
// m (ok says it was decoded whole): it binds a statement of b that may
// need them, or one b does not know (prepared with SQL PREPARE, say).
func (p *txPooling) onBind(b *stmtBook, m bindMsg, ok bool) (needsToken bool) {
	if !p.on || !ok {
		return false // off, or the server refuses it
	}
	st := b.stmts[string(m.stmt)]
	return st == nil || st.token
}

// onQuery puts the statement that sets the token settings in front of a
// Query whose text is text and plan needs them, and again at each
// statement of it that starts a transaction of its own (Plan.TxStarts):
// the Query's replies to them are kept from the client (probes of their
// own), and error positions are mapped past them.
func (p *txPooling) onQuery(plan *Plan, text []byte) {
	set := p.statement()
	values := make([]string, len(set.names))
	for i, n := range set.names {
		values[i] = p.value(n)
	}
	stmt := set.text(p.nonce, values)
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

// pooledProbe keeps the replies to onQuery's statement from the client.
var pooledProbe = NewProbe("", func(*Client, [][]byte) *pgproto3.NoticeResponse { return nil })

// insertOrigin maps error positions in a text that onQuery put
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
