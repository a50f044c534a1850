package proxy

import (
	"bytes"
	"crypto/rand"
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
// Under Config.TransactionPooling deferred is instead the values of the
// session's token settings (see keepPooled), which always include the
// token setting's, pool the rest of what the session keeps, and the
// numbers are not used.
type setState struct {
	deferred       []Setting
	pool           pooledSession
	ver, kept, ran uint64
	block          bool
	// haveStmts is set once the client has prepared a statement that is a
	// SET the proxy may answer, so that a session that never did spends
	// nothing looking for one at every Bind (see answerBind).
	haveStmts bool
	// wasIdle says the message being handled came while the session was
	// idle.
	wasIdle bool
	// wasBlock says it came while the session was in a transaction block
	// that has not failed, with nothing in flight; quietBlock is set at
	// such a ReadyForQuery while the event loop relays the session, and
	// cleared at the client's next message.
	wasBlock, quietBlock bool
}

// arrive notes where the client's next message finds the session: idle
// says the session was idle. Under transaction pooling the message starts
// a transaction then, with nothing of an earlier one in flight: the
// session draws a new nonce for it (see pooledSession).
func (t *setState) arrive(idle bool) {
	t.wasIdle = idle
	t.wasBlock, t.quietBlock = t.quietBlock, false
	if idle && t.pool.nonce != "" {
		t.pool.nonce = rand.Text()
	}
}

// quiet reports whether the message being handled found the session where
// the proxy may answer a SET: idle, or in a transaction block that has not
// failed, with nothing in flight.
func (t *setState) quiet() bool { return t.wasIdle || t.wasBlock }

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

// atReady notes, at a ReadyForQuery with status, whether the unit it ends
// kept the deferred settings sent in it.
func (t *setState) atReady(status txStatus) {
	if t.ran != 0 && status == txIdle {
		t.kept = t.ran
	}
	t.ran = 0
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
// client sent it with nothing in flight while the session was idle (not a
// SET LOCAL, which does nothing there but warn) or in a block that has
// not failed, and the event loop relays the session (its client side may
// then write replies of its own). Settings answered while idle and in a
// block are kept differently, so one still pending from the other stops
// it (it cannot be: the statement that opens or ends a block carries
// them).
func (s *session) mayAnswer(set *Setting) bool {
	if s.c.Replication {
		return false // the deferred set_config would need the extended protocol
	}
	block := s.sets.wasBlock
	if s.txPool() && (block || set.Local) || set.Reset && !s.txPool() {
		// Pooled, a setting answered in a block would have to follow
		// the block's fate; a SET LOCAL runs on the server as sent.
		return false
	}
	if !block && (!s.sets.wasIdle || set.Local) {
		return false
	}
	return !s.srv.cfg.ForwardSettings && s.srv.cfg.SettingSQL != "" && s.pipe.single && !s.apply.held && s.pipe.head() == nil &&
		(s.sets.block == block || !s.sets.pending(s.txPool()))
}

// deferSetting keeps set, answered by the proxy, for the server.
func (s *session) deferSetting(set *Setting) {
	s.srv.cfg.Interceptor.SettingAnswered(s.c, set)
	if s.txPool() {
		s.idle.Store(true)
		s.sets.keepPooled(set)
		return
	}
	s.sets.add(set)
	// As the client sees it, the session is as it was.
	if s.sets.wasBlock {
		s.sets.quietBlock = true
	} else {
		s.idle.Store(true)
	}
}

// pending reports whether deferred settings are still to be set,
// forgetting them once Postgres has kept them; pooled says a transaction
// pooler is behind the proxy, where they are the session's token settings,
// always to be set.
func (t *setState) pending(pooled bool) bool {
	if len(t.deferred) == 0 || pooled {
		return len(t.deferred) > 0
	}
	if t.kept == t.ver {
		t.deferred = t.deferred[:0]
		return false
	}
	return true
}

// answered writes the ReadyForQuery that ends the proxy's answer to a SET:
// the transaction status it was sent in.
func (s *session) answered() error {
	if s.sets.wasBlock {
		// The client's unnamed portal is now the SET's, or gone; the
		// server's is still what it was.
		s.book.portalGone, s.book.portalClosed = true, nil
		_, err := s.cw.Write(readyBlockMessage)
		return err
	}
	_, err := s.cw.Write(readyIdleMessage)
	return err
}

// answerQuery answers a simple-protocol SET.
func (s *session) answerQuery(set *Setting) error {
	s.deferSetting(set)
	s.cw.Write(completeMessage(set))
	return s.answered()
}

// answerBind answers, if it may, the unit at the front of the client's
// buffer (a Bind of n bytes first) when it runs a statement whose plan is
// a Setting, binds it no values, and is whole in hand (see unit). It
// reports whether it did.
func (s *session) answerBind(n int) (bool, error) {
	if !s.sets.haveStmts {
		return false, nil
	}
	u, ok := s.unit(0)
	if !ok || !s.mayBind(u) {
		return false, nil
	}
	st := s.book.stmts[string(u.stmt)]
	if st == nil || st.setting == nil || st.gen != s.srv.cfg.Interceptor.Generation() || !u.noParams || !noParamTypes(st.params) ||
		st.parsed == nil || st.parsed.state.Load() != stmtReady || !s.mayAnswer(st.setting) {
		return false, nil
	}
	return true, s.answerUnit(u, false, st.setting)
}

// answerParse answers, if it may, a Parse of the unnamed statement whose
// plan is set (st is what the session now remembers of it) together with
// the unit that follows it in the client's buffer, when that unit binds
// the unnamed statement no values and is whole in hand: what drivers send
// for a statement they do not prepare (libpq's PQexecParams, pgbench -M
// extended, JDBC before its prepareThreshold). It reports whether it did.
//
// The server's unnamed statement stays what it was, so the session marks
// the client's to be prepared again before a Bind or Describe of it
// reaches the server (see replan); one answered again does not.
func (s *session) answerParse(st *prepared, set *Setting, gen uint64) (bool, error) {
	if !s.mayAnswer(set) || !noParamTypes(st.params) {
		return false, nil
	}
	u, ok := s.unit(0)
	if !ok || len(u.stmt) != 0 || !u.noParams || !s.mayBind(u) {
		return false, nil
	}
	st.sent, st.probe, st.setting, st.gen = "", nil, set, gen
	st.parsed, st.again = answeredParse, unprepared
	s.sets.haveStmts = true
	s.reuse.dropUnnamed()
	s.book.unnamedGone, s.book.unnamedClosed = false, nil
	delete(s.book.portals, "")
	return true, s.answerUnit(u, true, set)
}

// mayBind reports whether the proxy may answer the unit u: in a block, its
// portal outlives it, and only the unnamed one is followed (see
// stmtBook.portalGone). Idle, the portal ends with the unit's implicit
// transaction, on the server as for the client.
func (s *session) mayBind(u unitMessages) bool {
	return !s.sets.wasBlock || !u.namedPortal
}

// answerUnit takes the unit u (after its Parse, if parse) from the
// client's buffer and answers it as Postgres would a SET, deferring set.
func (s *session) answerUnit(u unitMessages, parse bool, set *Setting) error {
	s.cr.Discard(u.size)
	s.c.midBatch = false
	s.deferSetting(set)
	if parse {
		s.cw.Write(parseCompleteMessage)
	}
	s.cw.Write(bindCompleteMessage)
	if u.describe {
		s.cw.Write(noDataMessage)
	}
	s.cw.Write(completeMessage(set))
	return s.answered()
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
// answer Binds of, made to note in st.parsed whether Postgres has it.
func (s *session) trackParsed(st *prepared, w *wait) *wait {
	// A record no wait holds any more (its Parse was answered or
	// skipped) is reused, so that parsing the same SET again does not
	// allocate.
	if st.parsed == nil || st.parsed == answeredParse || st.parsed.state.Load() == stmtPending {
		st.parsed = new(serverStmt)
	}
	st.parsed.state.Store(stmtPending)
	if w == parseWait { // shared: take one of its own
		w = s.pipe.get(waitParse)
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

// unit reports whether the client's buffer holds, whole, from offset off,
// one statement's unit: a Bind, an optional Describe of its portal, an
// Execute of that portal and a Sync, and nothing else.
func (s *session) unit(off int) (u unitMessages, ok bool) {
	b, _ := s.cr.Peek(s.cr.Buffered())
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
	bind, ok := decodeBind(body)
	if !ok {
		return u, false
	}
	u.stmt, u.noParams, u.namedPortal = bind.stmt, bind.noParams(), len(bind.portal) > 0
	typ, body = next()
	if typ == clientMsgDescribe {
		d, ok := decodeDescribe(body)
		if !ok || !d.exact() || d.target != targetPortal || !bytes.Equal(d.name, bind.portal) {
			return u, false
		}
		u.describe = true
		typ, body = next()
	}
	if typ != clientMsgExecute {
		return u, false
	}
	if e, ok := decodeExecute(body); !ok || !e.exact() || !e.runs(bind.portal) {
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
