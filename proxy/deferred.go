package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
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
	// tag is the session's (see Statement names in the package
	// documentation) and sql the statement that sets a setting
	// (Config.SettingSQL): both set as the session starts.
	tag, sql string
	// ready is set once the backend has the session's setStmt, whose
	// Close and Parse prep holds; name is its name (see stmtName).
	ready bool
	prep  []byte
	name  string
	// backendPID is the server process that ran the session's first
	// deferred setting (see checkBackend); written by the server side.
	// poolerHint is the hint of the error that ends the session when
	// another did (Config.Hints.Pooler), set as the session starts.
	backendPID, poolerHint string
	// retry follows a retry of deferred settings that failed on their
	// own (see heldFailed): retryNone, retryOwed or retrySent.
	retry uint8
	// afterPlan is set while a Query or Parse that starts a batch is
	// planned, to set deferred settings ahead of it (see applyPlanned).
	afterPlan bool
	// quiet is the probe of the unit of one fenced write that found the
	// session idle and that the deferred settings were sent joined to, with
	// the quiet mark (Config.SettingSQL's fourth argument), when its Quiet
	// let the proxy leave it out (see Quiet): until that unit's Execute,
	// which it then watches; a Sync clears it.
	quiet *Probe
	// held, heldOut and heldWriter: see above.
	held       bool
	heldOut    heldBuffer
	heldWriter msgWriter
}

// start sets what the part keeps of the configuration: the session's tag,
// Config.SettingSQL and Config.Hints.Pooler.
func (a *applyState) start(tag, sql, poolerHint string) {
	a.tag, a.sql, a.poolerHint = tag, sql, poolerHint
}

// forget has the session prepare setStmt again before its next use (see
// forgetState).
func (a *applyState) forget() { a.ready = false }

// setStmt names the portal of the proxy's own statement that sets a
// deferred setting; the statement is setStmt.<the session's tag> (see
// Statement names in the package documentation).
const setStmt = "pgfence.set"

// stmtName names the statement that sets the session's deferred settings.
func (a *applyState) stmtName() string {
	if a.name == "" {
		a.name = setStmt + "." + a.tag
	}
	return a.name
}

// prepare returns the Close and Parse of the session's setStmt, of sql:
// Close first, so that preparing again after the client may have
// deallocated it does not fail on a statement that still exists.
func (a *applyState) prepare() []byte {
	if a.prep == nil {
		b, _ := (&pgproto3.Close{ObjectType: byte(targetStatement), Name: a.stmtName()}).Encode(nil)
		a.prep, _ = (&pgproto3.Parse{Name: a.stmtName(), Query: a.sql,
			ParameterOIDs: []uint32{25, 25, 16, 16}}).Encode(b)
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

// now reports whether deferred settings, if any are pending, are to be set
// on the server ahead of the client's message typ, which starts a batch
// (start): they go ahead of the first message of every batch but
// a lone Sync or a Terminate, never into the middle of one (a Sync of the
// proxy's there would end the skip after an error that Postgres owes the
// client's batch), until Postgres keeps them. While they are held (see
// held) they are ahead of everything already.
func (a *applyState) now(typ clientMsg, start bool) bool {
	return start && typ != clientMsgSync && typ != clientMsgTerminate && !a.held
}

// planFirst notes that the Query or Parse that starts a batch is to be
// planned before the deferred settings go ahead of it (see afterPlan).
func (a *applyState) planFirst() { a.afterPlan = true }

// takeAfterPlan reports, once, whether the Query or Parse being planned
// starts a batch that the deferred settings go ahead of (see afterPlan).
func (a *applyState) takeAfterPlan() bool {
	after := a.afterPlan
	a.afterPlan = false
	return after
}

// sendHolding sends the deferred settings of t through l with a Sync of
// their own and holds back what the proxy sends after them until Postgres
// answers (see send for the rest).
func (a *applyState) sendHolding(l *link, t *setState, pool *txPooling, lost bool) error {
	if err := a.send(l, t, pool, lost, true); err != nil {
		return err
	}
	l.sw = a.hold(l.sw)
	return nil
}

// send sends through l setStmt for each deferred setting of t (or, under
// transaction pooling, pool's statement: see txPooling.write), preparing it first if
// the backend may not have it, and with sync a Sync whose ReadyForQuery
// releases what is held back after them (see onHeldReady). lost says a text
// since setStmt was prepared may have deallocated it (see forgetState):
// the client's statement being planned has not made the session forget it
// yet.
func (a *applyState) send(l *link, t *setState, pool *txPooling, lost, sync bool) error {
	if lost {
		a.ready = false
	}
	w := l.pipe.get(waitSet)
	w.seq, w.held = t.ver, sync
	if err := a.write(l, l.sw, t, pool, w); err != nil {
		return err
	}
	l.pushSwallow(w)
	if !sync {
		return nil
	}
	r := l.pipe.get(waitReady)
	r.held = true
	l.pipe.push(r)
	_, err := l.sw.Write(syncMessage)
	return err
}

// write writes to out (built in l's buffer) setStmt's Bind, Execute and
// Close for each deferred setting of t, after its Close and Parse unless
// the backend has it, and sets the replies w, their wait, wants. Under
// transaction pooling (pool on) it writes pool's statement instead.
func (a *applyState) write(l *link, out msgWriter, t *setState, pool *txPooling, w *wait) error {
	if pool.on {
		return pool.write(l, out, a.stmtName(), w)
	}
	w.want = setRunReplies * len(t.deferred)
	if !a.ready {
		w.want += setPrepareReplies
		if _, err := out.Write(a.prepare()); err != nil {
			return err
		}
	}
	for _, set := range t.deferred {
		// Bind setStmt to its portal: the values in text, results in text.
		l.out = append(append(l.out[:0], byte(clientMsgBind), 0, 0, 0, 0), setStmt...)
		l.out = append(append(l.out, 0), a.stmtName()...)
		l.out = append(l.out, 0, 0, 0, 0, 4)
		for _, v := range [4]string{set.Name, set.Value, boolText(set.Local), boolText(a.quiet != nil)} {
			l.out = binary.BigEndian.AppendUint32(l.out, uint32(len(v)))
			l.out = append(l.out, v...)
		}
		l.out = append(l.out, 0, 0)
		binary.BigEndian.PutUint32(l.out[1:5], uint32(len(l.out)-1))
		l.out = append(l.out, setRunTail...)
		if _, err := out.Write(l.out); err != nil {
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

// onReply handles a reply (typ, n bytes, read through f) to the deferred
// settings of t (or, under transaction pooling, pool's statement) that w,
// at the head of l's pipeline, waits for.
func (a *applyState) onReply(f *fromServer, l *link, t *setState, pool *txPooling, w *wait, typ serverMsg, n int) error {
	switch typ {
	case serverMsgParseComplete: // the backend has setStmt now
		a.ready = true
	case serverMsgBindComplete, serverMsgCommandComplete, serverMsgCloseComplete:
	case serverMsgDataRow:
		if !pool.on {
			if err := a.checkBackend(f, n); err != nil {
				return err
			}
			a.seen(l, t, w)
			return nil
		}
	case serverMsgErrorResponse:
		a.ready = false // prepare it again next time, whatever went wrong
		if w.held {
			return a.heldFailed(f, l, t, n)
		}
		if t.block {
			t.kept = w.seq // dropped (see Deferred settings)
		}
		f.via.warn("a deferred SET failed on the server; the client's statement behind it did not run")
		return f.via.serverError(w, n)
	default:
		return f.via.reply(w, typ, n)
	}
	a.seen(l, t, w)
	return f.skip(n)
}

// seen counts a reply to the deferred settings of t that w waits for, done
// with them at the last.
func (a *applyState) seen(l *link, t *setState, w *wait) {
	if t.seen(w) {
		l.pipe.pop()
	}
}

// checkBackend reads the DataRow (n bytes) of a deferred setting, which
// says which server process ran it, and ends the session if that is not
// the one that ran the session's first: a transaction pooler nobody told
// pgfence of (see Config.TransactionPooling) gave the session another
// server connection between transactions, where the settings it made on
// the first stay for other clients and its own are missing.
func (a *applyState) checkBackend(f *fromServer, n int) error {
	b, err := f.body(n)
	if err != nil {
		return err
	}
	pid, ok := a.sameBackend(b)
	if ok {
		return nil
	}
	f.via.end(slog.LevelError, "session ended: its server process changed between transactions; a transaction pooler is behind pgfence",
		codeConnectionFailure, fmt.Sprintf("the server process behind this session changed between transactions (%s, then %s): a transaction pooler stands between pgfence and Postgres", a.backendPID, pid),
		a.poolerHint, "first", a.backendPID, "now", string(pid))
	return errors.New("the server process behind the session changed: a transaction pooler is behind pgfence")
}

// sameBackend reads b, the DataRow of a deferred setting, and reports
// whether the server process it names (pid) is the one that ran the
// session's first (kept in backendPID): a row it cannot read is no
// evidence either way.
func (a *applyState) sameBackend(b []byte) (pid []byte, ok bool) {
	// Two columns: the setting's value, then the process id.
	if len(b) < 2 || binary.BigEndian.Uint16(b) != 2 {
		return nil, true
	}
	b = b[2:]
	for range 2 {
		if len(b) < 4 {
			return nil, true
		}
		l := int(int32(binary.BigEndian.Uint32(b)))
		if l < 0 || len(b) < 4+l {
			return nil, true
		}
		if len(b) == 4+l { // the last column: the process id
			pid := b[4:]
			if a.backendPID == "" {
				a.backendPID = string(pid)
				return pid, true
			}
			return pid, string(pid) == a.backendPID
		}
		b = b[4+l:]
	}
	return nil, true
}

// onHeldReady handles the ReadyForQuery (n bytes, status) of the proxy's
// own Sync after the deferred settings of t: they are set, and what was
// held back goes out through l.
func (a *applyState) onHeldReady(f *fromServer, l *link, t *setState, pool *txPooling, n int, status txStatus) error {
	switch a.heldAt(t, status) {
	case heldRetry:
		return a.retryHeld(f, l, t, pool, n)
	case heldLost:
		// Not kept (it cannot be otherwise at a unit of their own): what
		// waits must not run without them.
		return a.endDeferred(f, t, codeConnectionFailure, fmt.Sprintf("the server did not keep it (transaction status %q)", status))
	}
	l.pipe.pop()
	t.onReady(status, false)
	var err error
	if l.sw, err = a.release(); err != nil {
		return err
	}
	return f.skip(n)
}

// What becomes of deferred settings sent with a Sync of their own, at its
// ReadyForQuery (see heldAt).
const (
	heldKept  = iota // Postgres kept them: what was held back goes out
	heldRetry        // they failed on their own: try them again, once
	heldLost         // not kept: the session ends
)

// heldAt says what becomes of the deferred settings of t sent with a Sync
// of their own, at its ReadyForQuery with status.
func (a *applyState) heldAt(t *setState, status txStatus) int {
	want := txIdle
	if t.block {
		want = txInBlock
	}
	switch {
	case a.retry == retryOwed && t.ran == 0 && status == want:
		return heldRetry
	case t.ran == 0 || status != want:
		return heldLost
	}
	return heldKept
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
func (a *applyState) heldFailed(f *fromServer, l *link, t *setState, n int) error {
	if t.block || a.retry != retryNone {
		return a.setFailed(f, t, n)
	}
	_, e, err := f.readError(n)
	if err != nil {
		return err
	}
	if e.Severity != "ERROR" {
		return a.endDeferred(f, t, e.Code, e.Message)
	}
	f.via.warn("a deferred SET failed on the server; trying it again before what waits for it", "code", e.Code, "error", e.Message)
	a.retry = retryOwed
	l.pipe.pop() // their wait: Postgres skips the rest up to the proxy's Sync
	return nil
}

// retryHeld sends the deferred settings again with a Sync of their own,
// ahead of what is held back, at the ReadyForQuery (n bytes) that ended
// their failed first try. That ReadyForQuery's wait stays at the head of
// the pipeline for the new Sync.
func (a *applyState) retryHeld(f *fromServer, l *link, t *setState, pool *txPooling, n int) error {
	a.retry = retrySent
	w := l.pipe.get(waitSet)
	w.seq, w.held = t.ver, true
	if err := a.write(l, a.heldWriter, t, pool, w); err != nil {
		return err
	}
	if _, err := a.heldWriter.Write(syncMessage); err != nil {
		return err
	}
	l.pipe.pushFront(w)
	return f.skip(n)
}

// setFailed ends the session after deferred settings failed on their own
// (what the client sent after them was held back, so nothing ran without
// them).
func (a *applyState) setFailed(f *fromServer, t *setState, n int) error {
	_, e, err := f.readError(n)
	if err != nil {
		return err
	}
	return a.endDeferred(f, t, e.Code, e.Message)
}

// endDeferred ends the session because the deferred settings of t failed
// on the server, saying why (code and what) to the client and the log.
func (a *applyState) endDeferred(f *fromServer, t *setState, code, what string) error {
	names := make([]string, len(t.deferred))
	for i, set := range t.deferred {
		names[i] = set.Name
	}
	f.via.end(slog.LevelWarn, "a deferred SET failed on the server; ending the session",
		code, fmt.Sprintf("SET %s, which pgfence answered at once, failed when it ran on the server: %s", strings.Join(names, ", "), what),
		"reconnect and set it again; pgfence ended the session so that nothing would run without it", "code", code, "error", what)
	return fmt.Errorf("deferred SET failed on the server: %s (SQLSTATE %s)", what, code)
}
