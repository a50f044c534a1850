package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Deferred settings. A transaction that sets the fencing token and then
// writes costs two round trips to Postgres: the SET, then the write. When
// nothing is in flight and the session is idle or in a transaction block
// that has not failed, the proxy answers a SET the Interceptor vouches for
// (Plan.Setting) itself, keeps the setting, and sets it on the server with
// a statement of its own (set_config) ahead of the client's next
// statement, where Postgres would have run the SET:
//
//   - Ahead of a unit that is one fenced write (Bind, an optional Describe,
//     Execute and Sync, all in hand), with no Sync between them. Both run
//     in one transaction: if the setting fails, Postgres skips the write
//     and the client gets the error (fail closed).
//   - Ahead of anything else that may run a statement, with a Sync of its
//     own; what the proxy sends for the client's messages after it waits
//     in the proxy until Postgres has answered (session.held). If the
//     setting failed there, it is tried once more while idle; in a block,
//     or failed twice, the session ends with the error: nothing may run
//     without the setting the client was told is set.
//
// A setting answered while idle that joined a write in its implicit
// transaction is rolled back with the write if that fails, where the
// client's SET would have stood: it is kept until a unit that carried it
// ends in ReadyForQuery with no error, and until then every unit carries
// it again. One answered in a block (SET LOCAL too) is done once it ran:
// from there Postgres undoes it when the client's SET would be undone. If
// it failed ahead of a write, the block failed with the write, and the
// client can only roll back past the SET; it is dropped.

// setStmt names the portal of the proxy's own statement that sets a
// deferred setting; the statement is setStmt.<the session's tag> (see
// names.go).
const setStmt = "pgfence.set"

// setName names the session's statement that sets deferred settings.
func (s *session) setName() string {
	if s.setNm == "" {
		s.setNm = setStmt + "." + s.tag
	}
	return s.setNm
}

// setPrepare closes and prepares the session's setStmt: Close first, so
// that preparing again after the client may have deallocated it does not
// fail on a statement that still exists.
func (s *session) setPrepare() []byte {
	if s.setPrep == nil {
		b, _ := (&pgproto3.Close{ObjectType: 'S', Name: s.setName()}).Encode(nil)
		s.setPrep, _ = (&pgproto3.Parse{Name: s.setName(), Query: "SELECT pg_catalog.set_config($1, $2, $3), pg_catalog.pg_backend_pid()",
			ParameterOIDs: []uint32{25, 25, 16}}).Encode(b)
	}
	return s.setPrep
}

var (
	// setRunTail executes and closes setStmt's portal, after its Bind.
	setRunTail = func() []byte {
		b, _ := (&pgproto3.Execute{Portal: setStmt}).Encode(nil)
		b, _ = (&pgproto3.Close{ObjectType: 'P', Name: setStmt}).Encode(b)
		return b
	}()
)

// Replies to setStmt: CloseComplete and ParseComplete when it prepares,
// then BindComplete, DataRow, CommandComplete and CloseComplete for each
// setting.
const (
	setPrepareReplies = 2
	setRunReplies     = 4
)

// The replies the proxy gives to a SET it answers itself.
var (
	parseCompleteMessage = []byte{'1', 0, 0, 0, 4}
	bindCompleteMessage  = []byte{'2', 0, 0, 0, 4}
	noDataMessage        = []byte{'n', 0, 0, 0, 4}
	setCompleteMessage   = []byte{'C', 0, 0, 0, 8, 'S', 'E', 'T', 0}
	resetCompleteMessage = []byte{'C', 0, 0, 0, 10, 'R', 'E', 'S', 'E', 'T', 0}
	readyIdleMessage     = []byte{'Z', 0, 0, 0, 5, 'I'}
	readyBlockMessage    = []byte{'Z', 0, 0, 0, 5, 'T'}
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
	block := s.wasBlock
	if s.txPool() && (block || set.Local) || set.Reset && !s.txPool() {
		// Pooled, a setting answered in a block would have to follow
		// the block's fate; a SET LOCAL runs on the server as sent.
		return false
	}
	if !block && (!s.wasIdle || set.Local) {
		return false
	}
	return !s.srv.cfg.ForwardSettings && s.pipe.single && !s.held && s.pipe.head() == nil &&
		(s.deferBlock == block || !s.deferredPending())
}

// deferSetting keeps set, answered by the proxy, for the server.
func (s *session) deferSetting(set *Setting) {
	s.srv.cfg.Interceptor.SettingAnswered(s.c, set)
	if s.txPool() {
		s.idle.Store(true)
		s.keepPooled(set)
		return
	}
	if s.setKept == s.deferredVer {
		s.deferred = s.deferred[:0]
	}
	s.deferredVer++
	s.deferBlock = s.wasBlock
	// As the client sees it, the session is as it was.
	if s.wasBlock {
		s.quietBlock = true
	} else {
		s.idle.Store(true)
	}
	// A SET supersedes what is deferred of the same setting; a SET LOCAL
	// only SET LOCALs after the last SET of it, which stays to be the
	// value after the transaction.
	for i := len(s.deferred) - 1; i >= 0; i-- {
		if d := &s.deferred[i]; d.Name == set.Name {
			if set.Local && !d.Local {
				break
			}
			s.deferred = append(s.deferred[:i], s.deferred[i+1:]...)
		}
	}
	s.deferred = append(s.deferred, *set)
}

// answered writes the ReadyForQuery that ends the proxy's answer to a SET:
// the transaction status it was sent in.
func (s *session) answered() error {
	if s.wasBlock {
		// The client's unnamed portal is now the SET's, or gone; the
		// server's is still what it was.
		s.portalGone, s.portalClosed = true, nil
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
	if !s.setStmts {
		return false, nil
	}
	u, ok := s.unit(0)
	if !ok || !s.mayBind(u) {
		return false, nil
	}
	st := s.stmts[string(u.stmt)]
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
	s.setStmts = true
	s.unnamed, s.unnamedSeq, s.unnamedGone, s.unnamedClosed = nil, 0, false, nil
	delete(s.portals, "")
	return true, s.answerUnit(u, true, set)
}

// mayBind reports whether the proxy may answer the unit u: in a block, its
// portal outlives it, and only the unnamed one is followed (see
// session.portalGone). Idle, the portal ends with the unit's implicit
// transaction, on the server as for the client.
func (s *session) mayBind(u unitMessages) bool {
	return !s.wasBlock || !u.namedPortal
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

// forgetParsed stops the session answering Binds of the client's SET
// statements until they are parsed again: a text that may deallocate
// statements (DEALLOCATE, DISCARD) may have deallocated them, and a 26000
// from the server says something was.
func (s *session) forgetParsed() {
	for _, st := range s.stmts {
		st.parsed = nil
	}
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
	next := func() (byte, []byte) {
		if len(b) < pos+5 {
			return 0, nil
		}
		l := int(binary.BigEndian.Uint32(b[pos+1:]))
		if l < 4 || len(b) < pos+1+l {
			return 0, nil
		}
		typ, body := b[pos], b[pos+5:pos+1+l]
		pos += 1 + l
		return typ, body
	}
	typ, body := next()
	if typ != 'B' {
		return u, false
	}
	portal, rest, err1 := cstring(body)
	stmt, rest, err2 := cstring(rest)
	if err1 != nil || err2 != nil {
		return u, false
	}
	u.stmt, u.noParams, u.namedPortal = stmt, noParams(rest), len(portal) > 0
	named := func(body []byte) bool { // portal's name, NUL-terminated, first
		return len(body) > len(portal) && bytes.Equal(body[:len(portal)], portal) && body[len(portal)] == 0
	}
	typ, body = next()
	if typ == 'D' && len(body) == len(portal)+2 && body[0] == 'P' && named(body[1:]) {
		u.describe = true
		typ, body = next()
	}
	if typ != 'E' || len(body) != len(portal)+5 || !named(body) {
		return u, false
	}
	if typ, body = next(); typ != 'S' || len(body) != 0 {
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

// noParams reports whether b, a Bind's body after its names, binds no
// parameter values.
func noParams(b []byte) bool {
	if len(b) < 2 {
		return false
	}
	k := 2 + 2*int(binary.BigEndian.Uint16(b))
	return len(b) >= k+2 && binary.BigEndian.Uint16(b[k:]) == 0
}

// applyNow reports whether deferred settings are to be set on the server
// ahead of the client's message typ, which starts a batch (start): they
// go ahead of the first message of every batch but a lone Sync or a
// Terminate, never into the middle of one (a Sync of the proxy's there
// would end the skip after an error that Postgres owes the client's
// batch), until Postgres keeps them. While they are held (see held) they
// are ahead of everything already.
func (s *session) applyNow(typ byte, start bool) bool {
	return start && typ != 'S' && typ != 'X' && !s.held && s.deferredPending()
}

// applyDeferred sets the deferred settings on the server ahead of a batch
// whose first message is typ (n bytes): joined to it when the batch is a
// unit of one fenced write, else on their own. A Query or Parse is left
// to applyPlanned, once it is planned.
func (s *session) applyDeferred(typ byte, n int) error {
	switch typ {
	case 'Q', 'P':
		s.applyPlan = true
		return nil
	case 'B':
		if u, ok := s.unit(0); ok {
			if st := s.stmts[string(u.stmt)]; st != nil && st.probe != nil {
				return s.sendDeferred(false)
			}
		}
	}
	return s.sendDeferredHolding()
}

// applyPlanned is applyDeferred for a batch that starts with a Query or
// with a Parse of name (read from the buffer), now that plan says what it
// is: a bound Query is a unit of one fenced write, and so is a Parse of
// one followed by a unit that binds it.
func (s *session) applyPlanned(plan *Plan, parse bool, name []byte) error {
	fenced := plan.probe() != nil && !plan.Forget
	if parse {
		u, ok := s.unit(0)
		fenced = fenced && ok && bytes.Equal(u.stmt, name)
	} else {
		fenced = fenced && plan.ParamTypes != nil && !s.c.midBatch
	}
	if fenced {
		return s.sendDeferred(false)
	}
	return s.sendDeferredHolding()
}

// deferredPending reports whether deferred settings are still to be set,
// forgetting them once Postgres has kept them.
func (s *session) deferredPending() bool {
	if len(s.deferred) == 0 || s.txPool() {
		return len(s.deferred) > 0
	}
	if s.setKept == s.deferredVer {
		s.deferred = s.deferred[:0]
		return false
	}
	return true
}

// sendDeferredHolding sends the deferred settings with a Sync of their own
// and holds back what the proxy sends after them until Postgres answers.
func (s *session) sendDeferredHolding() error {
	if err := s.sendDeferred(true); err != nil {
		return err
	}
	s.held, s.heldWriter = true, s.sw
	s.sw = &s.heldOut
	return nil
}

// sendDeferred sends setStmt for each deferred setting, preparing it first
// if the backend may not have it, and with sync a Sync whose
// ReadyForQuery releases what is held back after them (see heldReady).
func (s *session) sendDeferred(sync bool) error {
	if s.lost.Load() {
		// A text since setStmt was prepared may have deallocated it (see
		// settled): the client's statement being planned has not made
		// the session forget it yet.
		s.setReady = false
	}
	w := s.pipe.get(waitSet)
	w.seq, w.held = s.deferredVer, sync
	if err := s.writeDeferred(s.sw, w); err != nil {
		return err
	}
	s.pushSwallow(w)
	if !sync {
		return nil
	}
	r := s.pipe.get(waitReady)
	r.held = true
	s.pipe.push(r)
	_, err := s.sw.Write(syncMessage)
	return err
}

// writeDeferred writes to out setStmt's Bind, Execute and Close for each
// deferred setting, after its Close and Parse unless the backend has it,
// and sets the replies w, their wait, wants.
func (s *session) writeDeferred(out msgWriter, w *wait) error {
	if s.txPool() {
		return s.writePooled(out, w)
	}
	w.want = setRunReplies * len(s.deferred)
	if !s.setReady {
		w.want += setPrepareReplies
		if _, err := out.Write(s.setPrepare()); err != nil {
			return err
		}
	}
	for _, set := range s.deferred {
		// Bind setStmt to its portal: the values in text, results in text.
		s.out = append(append(s.out[:0], 'B', 0, 0, 0, 0), setStmt...)
		s.out = append(append(s.out, 0), s.setName()...)
		s.out = append(s.out, 0, 0, 0, 0, 3)
		for _, v := range [3]string{set.Name, set.Value, boolText(set.Local)} {
			s.out = binary.BigEndian.AppendUint32(s.out, uint32(len(v)))
			s.out = append(s.out, v...)
		}
		s.out = append(s.out, 0, 0)
		binary.BigEndian.PutUint32(s.out[1:5], uint32(len(s.out)-1))
		s.out = append(s.out, setRunTail...)
		if _, err := out.Write(s.out); err != nil {
			return err
		}
	}
	return nil
}

// boolText is b as Postgres reads a bool in text format.
func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// setReply handles a reply to sendDeferred's messages.
func (s *session) setReply(w *wait, typ byte, n int) error {
	switch typ {
	case '1': // ParseComplete: the backend has setStmt now
		s.setReady = true
	case '2', 'C', '3':
	case 'D':
		if !s.txPool() {
			if err := s.checkBackend(n); err != nil {
				return err
			}
			s.setSeen(w)
			return nil
		}
	case 'E':
		s.setReady = false // prepare it again next time, whatever went wrong
		if w.held {
			return s.heldFailed(n)
		}
		if s.deferBlock {
			s.setKept = w.seq // dropped (see Deferred settings)
		}
		s.log.Warn("a deferred SET failed on the server; the client's statement behind it did not run", "client", s.c.RemoteAddr)
		return s.serverError(w, n)
	default:
		return s.reply(w, typ, n)
	}
	s.setSeen(w)
	return skip(s.sr, n)
}

// setSeen counts a reply to deferred settings, done with them at the last.
func (s *session) setSeen(w *wait) {
	if w.seen++; w.seen == w.want {
		// Nothing is answered while w is in flight, so deferBlock is
		// still what it was when the settings were sent.
		s.setRan = w.seq
		if s.deferBlock {
			s.setKept = w.seq
		}
		s.pipe.pop()
	}
}

// checkBackend reads the DataRow (n bytes) of a deferred setting, which
// says which server process ran it, and ends the session if that is not
// the one that ran the session's first: a transaction pooler nobody told
// pgfence of (see Config.TransactionPooling) gave the session another
// server connection between transactions, where the settings it made on
// the first stay for other clients and its own are missing.
func (s *session) checkBackend(n int) error {
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return err
	}
	// Two columns: the setting's value, then the process id.
	if len(b) < 2 || binary.BigEndian.Uint16(b) != 2 {
		return nil
	}
	b = b[2:]
	for range 2 {
		if len(b) < 4 {
			return nil
		}
		l := int(int32(binary.BigEndian.Uint32(b)))
		if l < 0 || len(b) < 4+l {
			return nil
		}
		if len(b) == 4+l { // the last column: the process id
			pid := b[4:]
			if s.backendPID == "" {
				s.backendPID = string(pid)
				return nil
			}
			if string(pid) == s.backendPID {
				return nil
			}
			writeFatal(s.cw, codeConnectionFailure, fmt.Sprintf("the server process behind this session changed between transactions (%s, then %s): a transaction pooler stands between pgfence and Postgres", s.backendPID, pid),
				"run pgfence with transaction pooling declared (pgfence serve --upstream-pooling=transaction), or connect it to Postgres directly")
			s.fatal = true
			s.log.Error("session ended: its server process changed between transactions; a transaction pooler is behind pgfence", "client", s.c.RemoteAddr, "first", s.backendPID, "now", string(pid))
			return errors.New("the server process behind the session changed: a transaction pooler is behind pgfence")
		}
		b = b[4+l:]
	}
	return nil
}

// heldReady handles the ReadyForQuery of the proxy's own Sync after
// deferred settings: they are set, and what was held back goes out.
func (s *session) heldReady(n int, status byte) error {
	want := byte('I')
	if s.deferBlock {
		want = 'T'
	}
	if s.setRetry == retryOwed && s.setRan == 0 && status == want {
		return s.retryHeld(n)
	}
	if s.setRan == 0 || status != want {
		// Not kept (it cannot be otherwise at a unit of their own): what
		// waits must not run without them.
		return s.endDeferred(codeConnectionFailure, fmt.Sprintf("the server did not keep it (transaction status %q)", status))
	}
	s.pipe.pop()
	s.readySet(status)
	s.setRetry = retryNone
	s.held, s.sw = false, s.heldWriter
	_, err := s.sw.Write(s.heldOut.b)
	s.heldOut.b = s.heldOut.b[:0]
	if cap(s.heldOut.b) > maxKeptParams {
		s.heldOut.b = nil // not kept by an idle session
	}
	if err != nil {
		return err
	}
	return skip(s.sr, n)
}

// heldBuffer collects what the proxy sends the server while it is held
// back (see sendDeferredHolding).
type heldBuffer struct{ b []byte }

func (h *heldBuffer) Write(p []byte) (int, error) {
	h.b = append(h.b, p...)
	return len(p), nil
}

func (h *heldBuffer) WriteByte(c byte) error {
	h.b = append(h.b, c)
	return nil
}

func (h *heldBuffer) Flush() error { return nil }

// readySet notes, at a ReadyForQuery with status, whether the unit it ends
// kept the deferred settings sent in it.
func (s *session) readySet(status byte) {
	if s.setRan != 0 && status == 'I' {
		s.setKept = s.setRan
	}
	s.setRan = 0
}

// The states of a retry of deferred settings that failed on their own
// (session.setRetry).
const (
	retryNone = iota
	retryOwed // the first try failed: try again at its ReadyForQuery
	retrySent // tried again: a second failure ends the session
)

// heldFailed handles an error (n bytes) from deferred settings sent on
// their own, which what the client sent after them waits for. Idle, a
// failure of their own (a cancel that hit them, their statement
// deallocated out of the proxy's sight) leaves the session as it was, so
// they are tried again once, ahead of what waits (see retryHeld). In a
// block it failed the block, which the client does not know of, and a
// second failure is not worth a third try: either ends the session.
func (s *session) heldFailed(n int) error {
	if s.deferBlock || s.setRetry != retryNone {
		return s.setFailed(n)
	}
	_, e, err := s.readError(n)
	if err != nil {
		return err
	}
	if e.Severity != "ERROR" {
		return s.endDeferred(e.Code, e.Message)
	}
	s.log.Warn("a deferred SET failed on the server; trying it again before what waits for it", "client", s.c.RemoteAddr, "code", e.Code, "error", e.Message)
	s.setRetry = retryOwed
	s.pipe.pop() // their wait: Postgres skips the rest up to the proxy's Sync
	return nil
}

// retryHeld sends the deferred settings again with a Sync of their own,
// ahead of what is held back, at the ReadyForQuery (n bytes) that ended
// their failed first try. That ReadyForQuery's wait stays at the head of
// the pipeline for the new Sync.
func (s *session) retryHeld(n int) error {
	s.setRetry = retrySent
	w := s.pipe.get(waitSet)
	w.seq, w.held = s.deferredVer, true
	if err := s.writeDeferred(s.heldWriter, w); err != nil {
		return err
	}
	if _, err := s.heldWriter.Write(syncMessage); err != nil {
		return err
	}
	s.pipe.pushFront(w)
	return skip(s.sr, n)
}

// setFailed ends the session after deferred settings failed on their own
// (what the client sent after them was held back, so nothing ran without
// them).
func (s *session) setFailed(n int) error {
	_, e, err := s.readError(n)
	if err != nil {
		return err
	}
	return s.endDeferred(e.Code, e.Message)
}

// endDeferred ends the session because its deferred settings failed on
// the server, saying why (code and what) to the client and the log.
func (s *session) endDeferred(code, what string) error {
	names := make([]string, len(s.deferred))
	for i, set := range s.deferred {
		names[i] = set.Name
	}
	writeFatal(s.cw, code, fmt.Sprintf("SET %s, which pgfence answered at once, failed when it ran on the server: %s", strings.Join(names, ", "), what),
		"reconnect and set it again; pgfence ended the session so that nothing would run without it")
	s.fatal = true
	s.log.Warn("a deferred SET failed on the server; ending the session", "client", s.c.RemoteAddr, "code", code, "error", what)
	return fmt.Errorf("deferred SET failed on the server: %s (SQLSTATE %s)", what, code)
}
