package proxy

import (
	"bytes"
	"encoding/binary"
)

// setState is the SETs the proxy answered itself and keeps for the server
// (see Deferred settings in the package documentation), and what decides
// whether it may answer the next: where the client's message being
// handled found the session. The proxy answers SETs only while the event
// loop relays the session, so both sides that use it run on one
// goroutine; relayed by goroutines, deferred stays empty, and the client
// side reads nothing the server side writes here (ran).
//
// ver numbers the changes to deferred, and a unit of work that carries
// them carries ver as its number (wait.seq); ran is the number of those
// that ran in the unit now replying, 0 once an error in it rolled them
// back; kept is the last number a unit that carried them ended with no
// error, or, for settings answered in a block (block), the last that ran
// or failed, which drops them. kept == ver means Postgres has them all:
// nothing is pending, and deferred is emptied at its next use. Settings
// answered idle and in a block are never pending together (see
// mayAnswer).
//
// Under Config.TransactionPooling the transaction-pooling part (txPooling)
// keeps what the proxy answers, and deferred stays empty.
type setState struct {
	deferred       []Setting
	ver, kept, ran uint64
	block          bool
	// haveStmts is set once the client has prepared a statement that is a
	// SET the proxy may answer, so that a session that never did spends
	// nothing looking for one at every Bind (see bindAnswer).
	haveStmts bool
	// answers says the proxy may answer SETs at all (Config.SettingSQL is
	// set, Config.ForwardSettings is not, and the session is no
	// replication connection, whose deferred set_config would need the
	// extended protocol); pooled that a transaction pooler is behind it,
	// where other SETs may be answered (see mayAnswer). Both are set as
	// the session starts.
	answers, pooled bool
	// wasIdle says the message being handled came while the session was
	// idle.
	wasIdle bool
	// wasBlock says it came while the session was in a transaction block
	// that has not failed, with nothing in flight; quietBlock is set at
	// such a ReadyForQuery while the event loop relays the session, and
	// cleared at the client's next message.
	wasBlock, quietBlock bool
}

// start sets what the part keeps of the configuration (see answers).
func (t *setState) start(answers, pooled bool) {
	t.answers, t.pooled = answers, pooled
}

// onMessage notes where the client's next message finds the session: idle
// says the session was idle.
func (t *setState) onMessage(idle bool) {
	t.wasIdle = idle
	t.wasBlock, t.quietBlock = t.quietBlock, false
}

// quiet reports whether the message being handled found the session where
// the proxy may answer a SET: idle, or in a transaction block that has not
// failed, with nothing in flight.
func (t *setState) quiet() bool { return t.wasIdle || t.wasBlock }

// onServerError notes an error from the server: the unit's transaction is
// rolled back, and the deferred settings sent in it with it.
func (t *setState) onServerError() { t.ran = 0 }

// add keeps set, answered where the message being handled found the
// session.
func (t *setState) add(set *Setting) {
	if t.kept == t.ver {
		t.deferred = t.deferred[:0]
	}
	t.ver++
	t.block = t.wasBlock
	// A SET supersedes what is deferred of the same setting; a SET LOCAL
	// only SET LOCALs after the last SET of it, which stays to be the
	// value after the transaction.
	for i := len(t.deferred) - 1; i >= 0; i-- {
		if d := &t.deferred[i]; d.Name == set.Name {
			if set.Local && !d.Local {
				break
			}
			t.deferred = append(t.deferred[:i], t.deferred[i+1:]...)
		}
	}
	t.deferred = append(t.deferred, *set)
}

// onReady notes, at a ReadyForQuery with status, whether the unit it ends
// kept the deferred settings sent in it; quietBlock says it leaves the
// session in a block with every reply in, where the proxy may answer the
// client's next message (see mayAnswer), which the event loop relays.
func (t *setState) onReady(status txStatus, quietBlock bool) {
	if t.ran != 0 && status == txIdle {
		t.kept = t.ran
	}
	t.ran = 0
	if quietBlock && status == txInBlock {
		t.quietBlock = true
	}
}

// seen counts a reply to the deferred settings w waits for, and reports
// whether it was the last: they ran.
func (t *setState) seen(w *wait) (last bool) {
	if w.seen++; w.seen != w.want {
		return false
	}
	// Nothing is answered while w is in flight, so block is still what it
	// was when the settings were sent.
	t.ran = w.seq
	if t.block {
		t.kept = w.seq
	}
	return true
}

// The replies the proxy gives to a SET it answers itself.
var (
	parseCompleteMessage = []byte{byte(serverMsgParseComplete), 0, 0, 0, 4}
	bindCompleteMessage  = []byte{byte(serverMsgBindComplete), 0, 0, 0, 4}
	noDataMessage        = []byte{byte(serverMsgNoData), 0, 0, 0, 4}
	setCompleteMessage   = append([]byte{byte(serverMsgCommandComplete), 0, 0, 0, 8}, "SET\x00"...)
	resetCompleteMessage = append([]byte{byte(serverMsgCommandComplete), 0, 0, 0, 10}, "RESET\x00"...)
	readyIdleMessage     = []byte{byte(serverMsgReadyForQuery), 0, 0, 0, 5, byte(txIdle)}
	readyBlockMessage    = []byte{byte(serverMsgReadyForQuery), 0, 0, 0, 5, byte(txInBlock)}
)

// mayAnswer reports whether the proxy may answer set itself now: the
// client sent it with nothing in flight (l says what is) while the
// session was idle (not a SET LOCAL, which does nothing there but warn)
// or in a block that has not failed, and the event loop relays the
// session (its client side may then write replies of its own). Settings
// answered while idle and in a block are kept differently, so one still
// pending from the other stops it (it cannot be: the statement that opens
// or ends a block carries them). held says deferred settings are held
// (see applyState.held).
func (t *setState) mayAnswer(set *Setting, l *link, held bool) bool {
	if !t.answers {
		return false
	}
	block := t.wasBlock
	if t.pooled && (block || set.Local) || set.Reset && !t.pooled {
		// Pooled, a setting answered in a block would have to follow
		// the block's fate; a SET LOCAL runs on the server as sent.
		return false
	}
	if !block && (!t.wasIdle || set.Local) {
		return false
	}
	return l.pipe.single && !held && l.pipe.head() == nil && (t.block == block || !t.pending())
}

// onAnswered keeps set, answered by the proxy, for the server, and
// reports whether the session is idle again as the client sees it (else
// it is in the block it was in). Under transaction pooling the pooling
// part keeps it instead (txPooling.onAnswered), and the session is idle.
func (t *setState) onAnswered(set *Setting) (idle bool) {
	if t.pooled {
		return true
	}
	t.add(set)
	// As the client sees it, the session is as it was.
	if t.wasBlock {
		t.quietBlock = true
		return false
	}
	return true
}

// pending reports whether deferred settings are still to be set,
// forgetting them once Postgres has kept them.
func (t *setState) pending() bool {
	if len(t.deferred) == 0 {
		return false
	}
	if t.kept == t.ver {
		t.deferred = t.deferred[:0]
		return false
	}
	return true
}

// answer writes to cw what Postgres would answer set with: for the unit
// u (nil for a simple Query), after its Parse if parse, its replies; then
// the ReadyForQuery with the transaction status it was sent in.
func (t *setState) answer(cw msgWriter, b *stmtBook, set *Setting, u *unitMessages, parse bool) error {
	if parse {
		cw.Write(parseCompleteMessage)
	}
	if u != nil {
		cw.Write(bindCompleteMessage)
		if u.describe {
			cw.Write(noDataMessage)
		}
	}
	cw.Write(completeMessage(set))
	if t.wasBlock {
		// The client's unnamed portal is now the SET's, or gone; the
		// server's is still what it was.
		b.portalGone, b.portalClosed = true, nil
		_, err := cw.Write(readyBlockMessage)
		return err
	}
	_, err := cw.Write(readyIdleMessage)
	return err
}

// bindAnswer returns what the unit u (ok: whole in hand, see unitAt) at
// the front of the client's buffer sets when the proxy may answer it: it
// runs a statement of the book whose plan under generation gen is a
// Setting, binds it no values, and comes where the proxy may answer a SET
// (l and held as for mayAnswer). nil if not.
func (t *setState) bindAnswer(u unitMessages, ok bool, b *stmtBook, gen uint64, l *link, held bool) *Setting {
	if !ok || !t.mayBind(u) {
		return nil
	}
	st := b.stmts[string(u.stmt)]
	if st == nil || st.setting == nil || st.gen != gen || !u.noParams || !noParamTypes(st.params) ||
		st.parsed == nil || st.parsed.state.Load() != stmtReady || !t.mayAnswer(st.setting, l, held) {
		return nil
	}
	return st.setting
}

// onAnsweredParse notes that the proxy answered a Parse of a SET: the
// client has a statement whose Binds it may answer.
func (t *setState) onAnsweredParse() { t.haveStmts = true }

// answersUnnamed reports whether the proxy may answer, with a Parse of
// the unnamed statement that is a SET it may answer, the unit u that
// follows it in the client's buffer (ok: whole in hand): one that binds
// the unnamed statement no values. That is what drivers send for a
// statement they do not prepare (libpq's PQexecParams, pgbench -M
// extended, JDBC before its prepareThreshold).
func (t *setState) answersUnnamed(u unitMessages, ok bool) bool {
	return ok && len(u.stmt) == 0 && u.noParams && t.mayBind(u)
}

// mayBind reports whether the proxy may answer the unit u: in a block, its
// portal outlives it, and only the unnamed one is followed (see
// stmtBook.portalGone). Idle, the portal ends with the unit's implicit
// transaction, on the server as for the client.
func (t *setState) mayBind(u unitMessages) bool {
	return !t.wasBlock || !u.namedPortal
}

// completeMessage is the CommandComplete of set.
func completeMessage(set *Setting) []byte {
	if set.Reset {
		return resetCompleteMessage
	}
	return setCompleteMessage
}

// answeredParse is prepared.parsed of a statement whose Parse the proxy
// answered itself: the client has it.
var answeredParse = func() *serverStmt {
	ss := new(serverStmt)
	ss.state.Store(stmtReady)
	return ss
}()

// trackParsed returns w, the wait for the Parse of st, a SET the proxy may
// answer Binds of, made (from p) to note in st.parsed whether Postgres has
// it.
func (t *setState) trackParsed(p *pipeline, st *prepared, w *wait) *wait {
	t.haveStmts = true
	// A record no wait holds any more (its Parse was answered or
	// skipped) is reused, so that parsing the same SET again does not
	// allocate.
	if st.parsed == nil || st.parsed == answeredParse || st.parsed.state.Load() == stmtPending {
		st.parsed = new(serverStmt)
	}
	st.parsed.state.Store(stmtPending)
	if w == parseWait { // shared: take one of its own
		w = p.get(waitParse)
	}
	w.reuse = st.parsed
	return w
}

// unitMessages is what unit finds of one statement's unit.
type unitMessages struct {
	stmt        []byte // the statement the Bind binds
	size        int    // bytes from the unit's Bind to its Sync, inclusive
	describe    bool   // a Describe of the portal comes between
	noParams    bool   // the Bind binds no values
	namedPortal bool   // the Bind names its portal
}

// unitAt reports whether cr's buffer holds, whole, from offset off, one
// statement's unit: a Bind, an optional Describe of its portal, an Execute
// of that portal and a Sync, and nothing else. bind, if not nil, is the
// Bind at off, already decoded (see clientFrame).
func unitAt(cr msgReader, off int, bind *bindMsg) (u unitMessages, ok bool) {
	b, _ := cr.Peek(cr.Buffered())
	pos := off
	next := func() (clientMsg, []byte) {
		if len(b) < pos+5 {
			return 0, nil
		}
		l := int(binary.BigEndian.Uint32(b[pos+1:]))
		if l < 4 || len(b) < pos+1+l {
			return 0, nil
		}
		typ, body := clientMsg(b[pos]), b[pos+5:pos+1+l]
		pos += 1 + l
		return typ, body
	}
	typ, body := next()
	if typ != clientMsgBind {
		return u, false
	}
	var m bindMsg
	if bind != nil {
		m = *bind
	} else if m, ok = decodeBind(body); !ok {
		return u, false
	}
	u.stmt, u.noParams, u.namedPortal = m.stmt, m.noParams(), len(m.portal) > 0
	typ, body = next()
	if typ == clientMsgDescribe {
		d, ok := decodeDescribe(body)
		if !ok || !d.exact() || d.target != targetPortal || !bytes.Equal(d.name, m.portal) {
			return u, false
		}
		u.describe = true
		typ, body = next()
	}
	if typ != clientMsgExecute {
		return u, false
	}
	if e, ok := decodeExecute(body); !ok || !e.exact() || !e.runs(m.portal) {
		return u, false
	}
	if typ, body = next(); typ != clientMsgSync || len(body) != 0 {
		return u, false
	}
	u.size = pos - off
	return u, true
}

// noParamTypes reports whether b, a Parse's parameter-type section,
// declares no parameters (a Bind of the statement must then bind none).
func noParamTypes(b []byte) bool {
	return len(b) == 2 && b[0] == 0 && b[1] == 0
}
