package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
)

// applyState is how the session sets its deferred settings (setState) on
// the server, ahead of the client's statements, and what it holds back
// while they are answered (see Deferred settings in the package
// documentation). It is used while the event loop relays the session, so
// both sides touch it on one goroutine; relayed by goroutines, only ready
// is written, cleared as the session forgets its statements.
//
// held is set exactly while the proxy holds back what it sends the server
// after settings sent with a Sync of their own: the session's sw is then
// &heldOut, and heldWriter the writer it stood for, which gets heldOut
// once Postgres has kept the settings (see hold and release). retry is
// retryNone while not held.
type applyState struct {
	// ready is set once the backend has the session's setStmt, whose
	// Close and Parse prep holds; name is its name (see stmtName).
	ready bool
	prep  []byte
	name  string
	// backendPID is the server process that ran the session's first
	// deferred setting (see checkBackend); written by the server side.
	backendPID string
	// retry follows a retry of deferred settings that failed on their
	// own (see heldFailed): retryNone, retryOwed or retrySent.
	retry uint8
	// afterPlan is set while a Query or Parse that starts a batch is
	// planned, to set deferred settings ahead of it (see applyPlanned).
	afterPlan bool
	// held, heldOut and heldWriter: see above.
	held       bool
	heldOut    heldBuffer
	heldWriter msgWriter
}

// forget has the session prepare setStmt again before its next use (see
// forgetState).
func (a *applyState) forget() { a.ready = false }

// setStmt names the portal of the proxy's own statement that sets a
// deferred setting; the statement is setStmt.<the session's tag> (see
// Statement names in the package documentation).
const setStmt = "pgfence.set"

// stmtName names the statement that sets deferred settings of the session
// tagged tag.
func (a *applyState) stmtName(tag string) string {
	if a.name == "" {
		a.name = setStmt + "." + tag
	}
	return a.name
}

// prepare returns the Close and Parse of the session's setStmt, of sql
// (Config.SettingSQL; tag is the session's): Close first, so that
// preparing again after the client may have deallocated it does not fail
// on a statement that still exists.
func (a *applyState) prepare(tag, sql string) []byte {
	if a.prep == nil {
		b, _ := (&pgproto3.Close{ObjectType: byte(targetStatement), Name: a.stmtName(tag)}).Encode(nil)
		a.prep, _ = (&pgproto3.Parse{Name: a.stmtName(tag), Query: sql,
			ParameterOIDs: []uint32{25, 25, 16}}).Encode(b)
	}
	return a.prep
}

// hold starts holding back what goes to w, the session's writer to the
// server, and returns the writer to use in its place.
func (a *applyState) hold(w msgWriter) msgWriter {
	a.held, a.heldWriter = true, w
	return &a.heldOut
}

// release ends holding back: it writes what was held to the writer it was
// held from, and returns that writer, the session's again.
func (a *applyState) release() (msgWriter, error) {
	a.held, a.retry = false, retryNone
	_, err := a.heldWriter.Write(a.heldOut.b)
	a.heldOut.b = a.heldOut.b[:0]
	if cap(a.heldOut.b) > maxKeptParams {
		a.heldOut.b = nil // not kept by an idle session
	}
	return a.heldWriter, err
}

var (
	// setRunTail executes and closes setStmt's portal, after its Bind.
	setRunTail = func() []byte {
		b, _ := (&pgproto3.Execute{Portal: setStmt}).Encode(nil)
		b, _ = (&pgproto3.Close{ObjectType: byte(targetPortal), Name: setStmt}).Encode(b)
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

// applyNow reports whether deferred settings are to be set on the server
// ahead of the client's message typ, which starts a batch (start): they
// go ahead of the first message of every batch but a lone Sync or a
// Terminate, never into the middle of one (a Sync of the proxy's there
// would end the skip after an error that Postgres owes the client's
// batch), until Postgres keeps them. While they are held (see
// applyState.held) they
// are ahead of everything already.
func (s *session) applyNow(typ clientMsg, start bool) bool {
	return start && typ != clientMsgSync && typ != clientMsgTerminate && !s.apply.held && s.deferredPending()
}

// applyDeferred sets the deferred settings on the server ahead of a batch
// whose first message is typ (n bytes): joined to it when the batch is a
// unit of one fenced write, else on their own. A Query or Parse is left
// to applyPlanned, once it is planned.
func (s *session) applyDeferred(typ clientMsg, n int) error {
	switch typ {
	case clientMsgQuery, clientMsgParse:
		s.apply.afterPlan = true
		return nil
	case clientMsgBind:
		if u, ok := s.unit(0); ok {
			if st := s.book.stmts[string(u.stmt)]; st != nil && st.probe != nil {
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

// sendDeferredHolding sends the deferred settings with a Sync of their own
// and holds back what the proxy sends after them until Postgres answers.
func (s *session) sendDeferredHolding() error {
	if err := s.sendDeferred(true); err != nil {
		return err
	}
	s.sw = s.apply.hold(s.sw)
	return nil
}

// sendDeferred sends setStmt for each deferred setting, preparing it first
// if the backend may not have it, and with sync a Sync whose
// ReadyForQuery releases what is held back after them (see heldReady).
func (s *session) sendDeferred(sync bool) error {
	if s.forget.lost.Load() {
		// A text since setStmt was prepared may have deallocated it (see
		// forgetState): the client's statement being planned has not made
		// the session forget it yet.
		s.apply.ready = false
	}
	w := s.pipe.get(waitSet)
	w.seq, w.held = s.sets.ver, sync
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
	w.want = setRunReplies * len(s.sets.deferred)
	if !s.apply.ready {
		w.want += setPrepareReplies
		if _, err := out.Write(s.apply.prepare(s.tag, s.srv.cfg.SettingSQL)); err != nil {
			return err
		}
	}
	for _, set := range s.sets.deferred {
		// Bind setStmt to its portal: the values in text, results in text.
		s.out = append(append(s.out[:0], byte(clientMsgBind), 0, 0, 0, 0), setStmt...)
		s.out = append(append(s.out, 0), s.apply.stmtName(s.tag)...)
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
func (s *session) setReply(w *wait, typ serverMsg, n int) error {
	switch typ {
	case serverMsgParseComplete: // the backend has setStmt now
		s.apply.ready = true
	case serverMsgBindComplete, serverMsgCommandComplete, serverMsgCloseComplete:
	case serverMsgDataRow:
		if !s.txPool() {
			if err := s.checkBackend(n); err != nil {
				return err
			}
			s.setSeen(w)
			return nil
		}
	case serverMsgErrorResponse:
		s.apply.ready = false // prepare it again next time, whatever went wrong
		if w.held {
			return s.heldFailed(n)
		}
		if s.sets.block {
			s.sets.kept = w.seq // dropped (see Deferred settings)
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
		// Nothing is answered while w is in flight, so sets.block is
		// still what it was when the settings were sent.
		s.sets.ran = w.seq
		if s.sets.block {
			s.sets.kept = w.seq
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
			if s.apply.backendPID == "" {
				s.apply.backendPID = string(pid)
				return nil
			}
			if string(pid) == s.apply.backendPID {
				return nil
			}
			writeFatal(s.cw, codeConnectionFailure, fmt.Sprintf("the server process behind this session changed between transactions (%s, then %s): a transaction pooler stands between pgfence and Postgres", s.apply.backendPID, pid),
				s.srv.cfg.Hints.Pooler)
			s.fatal = true
			s.log.Error("session ended: its server process changed between transactions; a transaction pooler is behind pgfence", "client", s.c.RemoteAddr, "first", s.apply.backendPID, "now", string(pid))
			return errors.New("the server process behind the session changed: a transaction pooler is behind pgfence")
		}
		b = b[4+l:]
	}
	return nil
}

// heldReady handles the ReadyForQuery of the proxy's own Sync after
// deferred settings: they are set, and what was held back goes out.
func (s *session) heldReady(n int, status txStatus) error {
	want := txIdle
	if s.sets.block {
		want = txInBlock
	}
	if s.apply.retry == retryOwed && s.sets.ran == 0 && status == want {
		return s.retryHeld(n)
	}
	if s.sets.ran == 0 || status != want {
		// Not kept (it cannot be otherwise at a unit of their own): what
		// waits must not run without them.
		return s.endDeferred(codeConnectionFailure, fmt.Sprintf("the server did not keep it (transaction status %q)", status))
	}
	s.pipe.pop()
	s.sets.atReady(status)
	var err error
	if s.sw, err = s.apply.release(); err != nil {
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

// The states of a retry of deferred settings that failed on their own
// (applyState.retry).
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
	if s.sets.block || s.apply.retry != retryNone {
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
	s.apply.retry = retryOwed
	s.pipe.pop() // their wait: Postgres skips the rest up to the proxy's Sync
	return nil
}

// retryHeld sends the deferred settings again with a Sync of their own,
// ahead of what is held back, at the ReadyForQuery (n bytes) that ended
// their failed first try. That ReadyForQuery's wait stays at the head of
// the pipeline for the new Sync.
func (s *session) retryHeld(n int) error {
	s.apply.retry = retrySent
	w := s.pipe.get(waitSet)
	w.seq, w.held = s.sets.ver, true
	if err := s.writeDeferred(s.apply.heldWriter, w); err != nil {
		return err
	}
	if _, err := s.apply.heldWriter.Write(syncMessage); err != nil {
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
	names := make([]string, len(s.sets.deferred))
	for i, set := range s.sets.deferred {
		names[i] = set.Name
	}
	writeFatal(s.cw, code, fmt.Sprintf("SET %s, which pgfence answered at once, failed when it ran on the server: %s", strings.Join(names, ", "), what),
		"reconnect and set it again; pgfence ended the session so that nothing would run without it")
	s.fatal = true
	s.log.Warn("a deferred SET failed on the server; ending the session", "client", s.c.RemoteAddr, "code", code, "error", what)
	return fmt.Errorf("deferred SET failed on the server: %s (SQLSTATE %s)", what, code)
}
