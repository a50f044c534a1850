package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Waits that carry no state are shared, so the common path allocates nothing.
var (
	readyWait   = &wait{kind: waitReady}
	queryWait   = &wait{kind: waitQuery}
	executeWait = &wait{kind: waitExecute}
	parseWait   = &wait{kind: waitParse}
)

// maxServerMessage bounds what the server may send in one message (Postgres
// itself never sends more than 1 GiB).
const maxServerMessage = 1 << 30

// peekLimit is how much of a Bind, Execute or Close the proxy looks at to find
// the statement and portal names before forwarding the bytes untouched.
const peekLimit = 1024

// session relays one client connection to its own server connection.
type session struct {
	srv    *Server
	c      *Client
	log    *slog.Logger
	client net.Conn
	server net.Conn
	// started is set at the server's first ReadyForQuery: an error before
	// it is a failure to connect (Config.UpstreamFailed).
	started bool
	rt      roundTrip // for Config.RoundTrip
	// The relay reads and writes through these: bufio over the connections
	// when goroutines relay, the event loop's buffers when it does.
	cr   msgReader
	cw   msgWriter
	sr   msgReader
	sw   msgWriter
	pipe pipeline
	// tag is in the names of the proxy's statements on the server (see
	// names.go).
	tag string
	// upstream is the address of the server the session is connected to
	// (set before the relay starts; read under Server.mu).
	upstream string
	// stopped is closed when the goroutine relay's server side has ended,
	// for a client side held (see Client.HoldNextStatement).
	stopped chan struct{}
	mu      sync.Mutex // guards server and stop
	// stop, set while the event loop relays, ends the session from outside
	// the loop (closing server does that for goroutines).
	stop func()
	// idle is true while the session is outside a transaction with nothing
	// in flight, so a drain may end it.
	idle atomic.Bool
	// failed is true while the last ReadyForQuery said the transaction
	// block failed.
	failed atomic.Bool
	// fatal is set once the server has sent a FATAL error.
	fatal bool
	// sasl is set between AuthenticationSASL and the client's answer.
	sasl atomic.Bool
	// terminated is set when the client sent Terminate: the server closing
	// its end afterwards is the expected end, not a failure.
	terminated atomic.Bool
	// cancel is the CancelRequest for this session's backend, built from
	// its BackendKeyData.
	cancel atomic.Pointer[[]byte]
	// lost is set when the proxy's own prepared statements may be gone or
	// stand for other tables, so the client side prepares them again: the
	// server said a prepared statement does not exist (26000), so they may
	// have been deallocated where the proxy cannot see (by a function, say),
	// or a setting changed in a transaction block changed back as it ended
	// (see settled).
	lost atomic.Bool

	// Owned by the client-to-server goroutine.
	cbuf    []byte
	out     []byte
	stmts   map[string]*prepared // the session's prepared statements
	portals map[string]*Probe    // portals bound to statements that need a probe per Execute
	// recent are the last texts parsed as the unnamed statement (see
	// recentUnnamed); recentNext is the oldest.
	recent     [4]*prepared
	recentNext int
	// probes are the probe statements this session's backend has prepared
	// (set by the server side once Postgres confirms).
	probes map[*Probe]*atomic.Bool
	// reused are the statements prepared for reuse (see reuse.go), by the
	// SQL they hold; unnamed is the one the client's unnamed statement now
	// stands for, nil when the server's own unnamed statement is the
	// client's; reuses counts those prepared.
	reused  map[string]*serverStmt
	unnamed *serverStmt
	reuses  int
	// unnamedGone is set by a bound Query: Postgres would have destroyed
	// the unnamed statement, but the server still has one (the client's
	// last, or the proxy's own). A Bind or Describe of it before the next
	// Parse closes it first, so that it fails as it would have.
	unnamedGone bool
	// portalGone is the same for the unnamed portal, which a bound Query
	// leaves open: an Execute or Describe of it before the next Bind of it
	// closes it first.
	portalGone bool
	// unnamedClosed and portalClosed are the proxy's last Close for each,
	// which Postgres skips after an earlier error in its batch: the flag
	// stays until it confirms one.
	unnamedClosed, portalClosed *serverStmt
	// closeRecs are the records closeGone notes those Closes in, one for
	// each, reused while no reply is owed to the last.
	closeRecs [2]serverStmt
	// unnamedSeq numbers the last Parse of the unnamed statement while the
	// server's unnamed statement may be the proxy's (its stand-in, see
	// standInParse): from a Parse the proxy reuses for, or any after one,
	// until Postgres answers it (parsed, see reusedUnnamed). 0 when not
	// numbered; parses counts them.
	unnamedSeq uint64
	parses     uint64
	// changing is set by a text whose Plan says Forget, until the wait for
	// the next ReadyForQuery carries it (see wait.changes).
	changing bool
	// wasIdle says the message being handled came while the session was
	// idle.
	wasIdle bool
	// wasBlock says it came while the session was in a transaction block
	// that has not failed, with nothing in flight; quietBlock is set at
	// such a ReadyForQuery while the event loop relays the session, and
	// cleared at the client's next message.
	wasBlock, quietBlock bool

	// Deferred settings (see settings.go), used only while the event loop
	// relays the session, so both sides touch them on one goroutine.
	// deferred are the SETs the proxy answered itself that Postgres has
	// not yet been seen to keep, deferredVer numbers their changes, and
	// setKept is the last number a unit that carried them ended with no
	// error; setRan is the number whose settings ran in the unit now
	// replying (0 after an error in it).
	deferred             []Setting
	deferredVer, setKept uint64
	setRan               uint64
	// deferBlock says deferred were answered inside a transaction block
	// (see Deferred settings).
	deferBlock bool
	// setReady is set once the backend has the proxy's setStmt, whose
	// Close and Parse setPrep holds.
	setReady bool
	setPrep  []byte
	setNm    string
	// backendPID is the server process that ran the session's first
	// deferred setting (see checkBackend); written by the server side.
	backendPID string
	// setRetry follows a retry of deferred settings that failed on their
	// own (see heldFailed): retryNone, retryOwed or retrySent.
	setRetry uint8
	// setStmts is set once the client has prepared a statement that is a
	// SET the proxy may answer, so that a session that never did spends
	// nothing looking for one at every Bind (see answerBind).
	setStmts bool
	// applyPlan is set while a Query or Parse that starts a batch is
	// planned, to set deferred settings ahead of it (see applyPlanned).
	applyPlan bool
	// held is set while deferred settings sent with a Sync of their own
	// await Postgres's answer: what the proxy sends the server meanwhile
	// goes to heldOut, and heldWriter is the writer to send it to then.
	held       bool
	heldOut    heldBuffer
	heldWriter msgWriter

	// Owned by the server-to-client goroutine.
	sbuf []byte
	// row and rowBuf hold the last probe row captured.
	row    [][]byte
	rowBuf []byte
	// reverting is set while a setting a text changed inside a
	// transaction block may change back when the block ends.
	reverting bool

	// parsed is written by the server side, read by the client side.
	parsed parseMark
}

// prepared is what the proxy remembers of a prepared statement, so that it
// can be planned again after a configuration change.
type prepared struct {
	text   string // the client's SQL
	params []byte // the Parse's parameter-type section
	sent   string // the SQL sent in its place, "" for the client's own
	probe  *Probe // run after each Execute of a portal bound to it
	// setting, for a statement that is one SET the proxy may answer
	// itself, is what it sets (see settings.go).
	setting *Setting
	// parsed, for such a statement, is stmtReady while the client has it
	// as its Parse made it: Postgres answered that Parse (or the proxy
	// did, see answerParse) and no text since may have deallocated it.
	// Otherwise (nil, pending or absent) its Binds go to Postgres, to
	// fail there if it is gone.
	parsed *serverStmt
	gen    uint64 // the Interceptor generation it was planned under
	// token is the plan's NeedsToken (see pooled.go).
	token bool
	// again is set while the statement must be prepared again before its
	// next Bind or Describe: the proxy's own statement the client's
	// unnamed one stood for was forgotten (see forgetReused), or replan
	// prepared it again and Postgres has not confirmed that yet (it skips
	// the Parse after an earlier error in its batch, and so the Bind that
	// needed it; a Bind in a later batch sends it again).
	again *serverStmt
}

// is reports whether st is the statement of text with params.
func (st *prepared) is(text, params []byte) bool {
	return st != nil && st.text == string(text) && bytes.Equal(st.params, params)
}

// recentUnnamed returns what is remembered of text with params if it is one
// of the last few unnamed statements, else a new record that it remembers
// in place of the oldest. Each Parse plans the statement again, so a
// record reused holds nothing stale.
func (s *session) recentUnnamed(text, params []byte) *prepared {
	for _, st := range s.recent {
		if st.is(text, params) {
			return st
		}
	}
	st := &prepared{text: string(text), params: bytes.Clone(params)}
	s.recent[s.recentNext] = st
	s.recentNext = (s.recentNext + 1) % len(s.recent)
	return st
}

// clientError ends a session because of what the client sent; the client
// is told why (code defaults to protocol_violation).
type clientError struct {
	err        error
	code, hint string
}

func (e *clientError) Error() string { return e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// errDrained ends a session that became idle while the proxy drains.
var errDrained = errors.New("pgfence is shutting down")

func (s *session) setServer(server net.Conn) {
	s.mu.Lock()
	s.server = server
	s.mu.Unlock()
}

// closeServer ends the session from outside the relay, as if Postgres had
// closed the connection.
func (s *session) closeServer() {
	s.mu.Lock()
	switch {
	case s.stop != nil:
		s.stop()
	case s.server != nil:
		s.server.Close()
	}
	s.mu.Unlock()
}

// relay runs both directions until either side ends, and reports why the
// session ended (nil for a normal end). On Linux the event loop relays it,
// else (or with Config.GoroutineRelay) two goroutines do.
func (s *session) relay() error {
	s.pipe.push(readyWait) // the ReadyForQuery that ends authentication
	if l := eventLoop(); l != nil && !s.srv.cfg.GoroutineRelay {
		if e, ok := l.relay(s); ok {
			if e.fromClient {
				s.cancelIfBusy()
			}
			end := s.finish(e.fromClient, e.err)
			s.server.Close()
			s.client.Close()
			return end
		}
	}
	s.sr = bufio.NewReaderSize(s.server, 32<<10)
	s.sw = bufio.NewWriterSize(s.server, 32<<10)
	cerr := make(chan error, 1)
	serr := make(chan error, 1)
	s.stopped = make(chan struct{})
	go func() { cerr <- s.clientToServer() }()
	go func() { serr <- s.serverToClient() }()
	select {
	case err := <-cerr:
		s.cancelIfBusy()
		s.server.Close()
		<-serr // the server side owns the client writer until it returns
		return s.finish(true, err)
	case err := <-serr:
		end := s.finish(false, err)
		s.server.Close()
		s.client.Close()
		close(s.stopped) // a client side held waits no more
		s.pipe.abandon()
		<-cerr
		return end
	}
}

// cancelIfBusy cancels what the backend runs when the client left
// mid-query or mid-transaction, so that the backend sees the closed socket,
// rolls back and exits now rather than when the query ends.
func (s *session) cancelIfBusy() {
	if s.idle.Load() || s.terminated.Load() {
		return
	}
	if p := s.cancel.Load(); p != nil {
		s.srv.forwardCancel(*p)
	}
}

// finish tells the client why its session ends, when the end was not its
// own doing, once both directions have stopped. fromClient says which side
// ended first, with err.
func (s *session) finish(fromClient bool, err error) error {
	if fromClient {
		var ce *clientError
		if errors.As(err, &ce) {
			code, hint := ce.code, ce.hint
			if code == "" {
				code, hint = codeProtocolViolation, "the connection was closed by pgfence; other sessions are not affected"
			}
			s.sendFatal(code, ce.Error(), hint)
			return err
		}
	} else {
		switch {
		case s.terminated.Load():
			err = nil
		case s.srv.draining.Load():
			s.sendFatal(codeAdminShutdown, "terminating connection because pgfence is shutting down", "reconnect: another pgfence or the restarted one will serve you")
			err = nil
		case s.srv.isClosed():
		case !s.fatal:
			s.sendFatal(codeConnectionFailure, "lost the connection to Postgres: "+err.Error(), "reconnect when Postgres is back")
		}
	}
	if isClosed(err) {
		return nil
	}
	return err
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// clientToServer forwards the client's messages until the session ends.
func (s *session) clientToServer() error {
	for {
		if s.cr.Buffered() == 0 {
			if err := s.sw.Flush(); err != nil {
				return err
			}
		}
		typ, n, err := header(s.cr, s.srv.cfg.MaxMessageSize)
		if err != nil {
			return framingError(err)
		}
		if s.c.held && (typ == 'Q' || typ == 'P') {
			if err := s.sw.Flush(); err != nil {
				return err
			}
			if ch := s.c.takeHold(); ch != nil {
				select {
				case <-ch:
				case <-s.stopped:
					return net.ErrClosed
				}
			}
		}
		if err := s.clientMessage(typ, n); err != nil {
			return err
		}
	}
}

// framingError makes a malformed client message an error the client is
// told about before its session ends.
func framingError(err error) error {
	if errors.Is(err, ErrMalformed) {
		return &clientError{err: err}
	}
	return err
}

// clientMessage forwards the client's next message, whose header is typ
// and n, handing the few that matter to the Interceptor. It returns io.EOF
// after the client's Terminate.
func (s *session) clientMessage(typ byte, n int) error {
	if s.wasIdle = s.idle.Load(); s.wasIdle { // a load is cheaper than a store on every message
		s.idle.Store(false)
	}
	s.wasBlock, s.quietBlock = s.quietBlock, false
	if typ == 'B' && (s.wasIdle || s.wasBlock) {
		if ok, err := s.answerBind(n); ok || err != nil {
			return err
		}
	}
	if len(s.deferred) > 0 && !s.txPool() && s.applyNow(typ, !s.c.midBatch) {
		if err := s.applyDeferred(typ, n); err != nil {
			return err
		}
	}
	switch typ {
	case 'P', 'B', 'E', 'C', 'D', 'H':
		s.c.midBatch = true
	case 'S':
		s.c.midBatch = false
	}
	switch typ {
	case 'Q':
		return s.query(n)
	case 'P':
		return s.parse(n)
	case 'B':
		return s.bind(n)
	case 'E':
		return s.execute(n)
	case 'C':
		return s.close(n)
	case 'D':
		return s.describe(n)
	case 'S', 'F': // Sync and FunctionCall end with ReadyForQuery
		s.pipe.push(s.syncWait())
		return forward(s.sw, s.cr, n)
	case 'p':
		return s.saslInitial(n)
	case 'X':
		s.terminated.Store(true)
		err := forward(s.sw, s.cr, n)
		if err == nil {
			err = s.sw.Flush()
		}
		if err == nil {
			err = io.EOF
		}
		return err
	}
	return forward(s.sw, s.cr, n)
}

func (s *session) query(n int) error {
	m, err := message(s.cr, n, &s.cbuf)
	if err != nil {
		return err
	}
	text, _, err := cstring(m[5:])
	if err != nil {
		return &clientError{err: fmt.Errorf("a Query message: %w", err)}
	}
	plan := s.srv.cfg.Interceptor.Query(s.c, unsafe.String(unsafe.SliceData(text), len(text)))
	apply := s.applyPlan
	s.applyPlan = false
	if plan.Setting != nil && s.mayAnswer(plan.Setting) {
		// As for a bound Query, the server keeps the unnamed statement the
		// client's view of the session says the Query destroyed, and in a
		// block the unnamed portal too. (An idle session has none: its
		// transaction ended.)
		delete(s.stmts, "")
		delete(s.portals, "")
		s.unnamed, s.unnamedSeq = nil, 0
		s.unnamedGone, s.unnamedClosed = true, nil
		return s.answerQuery(plan.Setting)
	}
	if apply {
		if err := s.applyPlanned(&plan, false, nil); err != nil {
			return err
		}
	}
	if s.txPool() && plan.NeedsToken {
		if plan.ParamTypes != nil {
			if err := s.sendDeferred(false); err != nil {
				return err
			}
		} else {
			s.pooledQuery(&plan, text)
		}
	}
	if plan.Forget || s.lostStatements() {
		s.forgetProbes()
		s.forgetReused()
		s.forgetParsed()
	}
	// A simple Query destroys the unnamed statement and portal; but in a
	// failed block Postgres refuses its statements before they replace
	// the portal, so one a bound Query left stays (see portalGone; a
	// Close of a portal that is not there is no error).
	delete(s.stmts, "")
	delete(s.portals, "")
	s.unnamed, s.unnamedSeq = nil, 0
	if !s.blockMayHaveFailed() {
		s.portalGone = false
	}
	if plan.Forget {
		s.changing = true
	}
	if plan.ParamTypes != nil {
		return s.queryBound(plan)
	}
	if len(plan.Probes) > 0 || plan.SQL != "" && plan.Origin != nil || s.changing {
		w := s.pipe.get(waitQuery)
		w.probes, w.origin, w.changes = plan.Probes, plan.Origin, s.changing
		s.changing = false
		s.pipe.push(w)
	} else {
		s.pipe.push(queryWait)
	}
	if plan.SQL == "" {
		_, err := s.sw.Write(m)
		return err
	}
	s.out = append(append(s.out[:0], plan.SQL...), 0)
	return writeMessage(s.sw, 'Q', s.out)
}

func (s *session) parse(n int) error {
	m, err := message(s.cr, n, &s.cbuf)
	if err != nil {
		return err
	}
	name, rest, err := cstring(m[5:])
	if err != nil {
		return &clientError{err: fmt.Errorf("a Parse message: %w", err)}
	}
	text, params, err := cstring(rest)
	if err != nil {
		return &clientError{err: fmt.Errorf("a Parse message: %w", err)}
	}
	ic := s.srv.cfg.Interceptor
	gen := ic.Generation()
	// Drivers that use the unnamed statement parse the same few texts again
	// and again: keep what is remembered of them rather than allocate it anew.
	st := s.stmts[string(name)]
	if !st.is(text, params) {
		if len(name) == 0 {
			st = s.recentUnnamed(text, params)
		} else {
			st = &prepared{text: string(text), params: bytes.Clone(params)}
		}
		if s.stmts == nil {
			s.stmts = make(map[string]*prepared)
		}
		s.stmts[string(name)] = st
	}
	plan := ic.Parse(s.c, st.text)
	if len(name) == 0 && plan.Setting != nil && (s.wasIdle || s.wasBlock) {
		if ok, err := s.answerParse(st, plan.Setting, gen); ok || err != nil {
			s.applyPlan = false // the settings stay deferred, this one with them
			return err
		}
	}
	if s.applyPlan {
		s.applyPlan = false
		if err := s.applyPlanned(&plan, true, name); err != nil {
			return err
		}
	}
	if s.txPool() && plan.NeedsToken {
		if err := s.sendDeferred(false); err != nil {
			return err
		}
	}
	if plan.Forget || s.lostStatements() {
		s.forgetProbes()
		s.forgetReused()
		s.forgetParsed()
		// which drops the record of an unnamed statement whose last Parse
		// failed: not this one's.
		s.stmts[string(name)] = st
	}
	if plan.Forget {
		s.changing = true
	}
	st.sent, st.probe, st.setting, st.gen, st.again = plan.SQL, plan.probe(), plan.Setting, gen, nil
	st.token = plan.NeedsToken
	if plan.Setting == nil {
		st.parsed = nil
	}
	w := parseWait
	if len(name) == 0 {
		// In a failed transaction block Postgres refuses the Parse (and
		// the stand-in): send the text itself, to be refused.
		reuse := plan.Reuse && plan.SQL != "" && !plan.Forget && !s.failed.Load() && !s.txPool()
		if reuse || s.unnamed != nil || s.unnamedSeq != 0 {
			s.parses++
			s.unnamedSeq = s.parses
		}
		s.unnamed, s.unnamedGone = nil, false
		if reuse {
			return s.parseReused(plan, params)
		}
		w = s.unnamedParseWait(plan)
	} else if plan.SQL != "" {
		w = s.parseWaitFor(plan)
	}
	if plan.Setting != nil {
		w = s.trackParsed(st, w)
		s.setStmts = true
	}
	if plan.SQL == "" {
		s.pipe.push(w)
		_, err := s.sw.Write(m)
		return err
	}
	s.pipe.push(w)
	s.out = append(s.out[:0], name...)
	s.out = append(s.out, 0)
	s.out = append(s.out, plan.SQL...)
	s.out = append(s.out, 0)
	s.out = append(s.out, params...)
	return writeMessage(s.sw, 'P', s.out)
}

// syncWait returns the wait for the ReadyForQuery that a Sync (or a
// FunctionCall) ends with: marked when a Parse since the last one may have
// changed a setting.
func (s *session) syncWait() *wait {
	if !s.changing {
		return readyWait
	}
	s.changing = false
	w := s.pipe.get(waitReady)
	w.changes = true
	return w
}

// parseWaitFor is the wait for the reply to a Parse of plan.SQL.
func (s *session) parseWaitFor(plan Plan) *wait {
	if plan.Origin == nil {
		return parseWait
	}
	w := s.pipe.get(waitParse)
	w.origin = plan.Origin
	return w
}

// peek returns up to peekLimit bytes of the next message's body, leaving the
// message in the reader.
func (s *session) peek(n int) ([]byte, error) {
	b, err := s.cr.Peek(5 + min(n, peekLimit))
	if err != nil {
		return nil, err
	}
	return b[5:], nil
}

// bind forwards a Bind, after what the proxy sends before it, if anything.
func (s *session) bind(n int) error {
	if s.txPool() {
		if err := s.pooledBind(n); err != nil {
			return err
		}
	}
	err := s.bindAs(n)
	s.pipe.loose++ // after the proxy's own: its reply comes after theirs
	return err
}

func (s *session) bindAs(n int) error {
	if len(s.stmts) == 0 && !s.unnamedGone && !s.portalGone {
		return forward(s.sw, s.cr, n)
	}
	b, err := s.peek(n)
	if err != nil {
		return err
	}
	portal, rest, err1 := cstring(b)
	stmt, _, err2 := cstring(rest)
	if len(portal) == 0 && s.portalGone {
		// The Bind replaces the portal a bound Query left only if it
		// succeeds: close that first. After it the portal is the
		// client's, or there is none, unless Postgres skips the Close
		// (and so the Bind) after an earlier error in its batch: the flag
		// stays until it confirms the Close (see closeGone).
		if err := s.closeUnnamedPortal(); err != nil {
			return err
		}
	}
	if err1 != nil || err2 != nil {
		// Names longer than peekLimit: Postgres limits names to 63 bytes, so
		// the server will refuse this Bind; nothing to track.
		return forward(s.sw, s.cr, n)
	}
	var p *Probe
	if len(stmt) == 0 {
		s.reusedUnnamed() // first: its Parse may have failed
	}
	if st := s.stmts[string(stmt)]; st != nil {
		if err := s.replan(stmt, st); err != nil {
			return err
		}
		p = st.probe
	}
	if p != nil {
		if s.portals == nil {
			s.portals = make(map[string]*Probe)
		}
		s.portals[string(portal)] = p
	} else if len(s.portals) > 0 {
		delete(s.portals, string(portal))
	}
	if len(stmt) == 0 && s.reusedUnnamed() != nil {
		return s.bindReused(s.unnamed, portal, n)
	}
	if len(stmt) == 0 && s.unnamedGone {
		if err := s.closeUnnamed(); err != nil {
			return err
		}
	}
	return forward(s.sw, s.cr, n)
}

// pushSwallow pushes w, a waitSwallow for messages the proxy sends in the
// middle of the client's, after a waitPass for the replies to the client's
// Binds and Closes before them.
func (s *session) pushSwallow(w *wait) {
	if n := s.pipe.loose; n > 0 {
		pw := s.pipe.get(waitPass)
		pw.want = n
		s.pipe.push(pw)
	}
	s.pipe.push(w)
}

// Closes of the unnamed statement and portal.
var (
	closeUnnamedMessage       = []byte{'C', 0, 0, 0, 6, 'S', 0}
	closeUnnamedPortalMessage = []byte{'C', 0, 0, 0, 6, 'P', 0}
)

// closeUnnamed closes the server's unnamed statement, which the client's
// view of the session says a Query destroyed (see session.unnamedGone).
func (s *session) closeUnnamed() error {
	return s.closeGone(&s.unnamedGone, &s.unnamedClosed, &s.closeRecs[0], closeUnnamedMessage)
}

// closeUnnamedPortal does the same for the unnamed portal (see
// session.portalGone).
func (s *session) closeUnnamedPortal() error {
	return s.closeGone(&s.portalGone, &s.portalClosed, &s.closeRecs[1], closeUnnamedPortalMessage)
}

// closeGone sends the Close message m for what gone says is gone, noting
// it in rec (or a new record while a reply to the last is owed), unless
// Postgres confirmed the one sent last (closed), which clears gone, or has
// yet to answer it: that one is ahead of whatever the client sends now,
// and if Postgres skips it, it skips what follows in its batch too. (A
// second Close would close the portal a client's Bind after the first
// made.)
func (s *session) closeGone(gone *bool, closed **serverStmt, rec *serverStmt, m []byte) error {
	if c := *closed; c != nil {
		switch c.state.Load() {
		case stmtReady:
			*gone, *closed = false, nil
			return nil
		case stmtPending:
			return nil
		}
	}
	c := rec
	if c.state.Load() == stmtPending { // a wait still holds it
		c = new(serverStmt)
	}
	c.state.Store(stmtPending)
	*closed = c
	return s.closeQuietly(m, c)
}

// closeQuietly sends the Close message m, keeping its reply from the
// client; done, if not nil, notes when Postgres answers it.
func (s *session) closeQuietly(m []byte, done *serverStmt) error {
	w := s.pipe.get(waitSwallow)
	w.want, w.reuse = 1, done // CloseComplete
	s.pushSwallow(w)
	_, err := s.sw.Write(m)
	return err
}

// replan plans a statement prepared under an older configuration again.
// If what should be sent for it changed (a table became guarded, say), the
// statement is re-prepared under its own name before the Bind, so a
// configuration change reaches statements prepared before it. So is one
// marked to be prepared again (prepared.again). stmt is the statement's
// name as the Bind holds it: made a string only here, off the path of
// every Bind.
func (s *session) replan(stmt []byte, st *prepared) error {
	ic := s.srv.cfg.Interceptor
	gen := ic.Generation()
	redo := st.again != nil && st.again.state.Load() != stmtReady
	if !redo {
		st.again = nil
	}
	if st.gen == gen && !redo {
		return nil
	}
	name := string(stmt)
	if name != "" && s.failedNow() {
		// Postgres refuses the Bind (a statement to plan again is no
		// ROLLBACK), so prepare it at the next: a named Parse here can
		// crash Postgres (see blockMayHaveFailed).
		return nil
	}
	plan := ic.Parse(s.c, st.text)
	st.gen, st.probe, st.setting, st.token = gen, plan.probe(), plan.Setting, plan.NeedsToken
	if plan.SQL == st.sent && !redo {
		return nil
	}
	st.sent = plan.SQL
	if name == "" {
		s.unnamed = nil // it stood for the statement of the old rewrite
	}
	sql := plan.SQL
	if sql == "" {
		sql = st.text
	}
	s.log.Debug("re-preparing a statement after a configuration or setting change", "statement", name)
	st.again = &serverStmt{name: name}
	st.again.state.Store(stmtPending)
	w := s.pipe.get(waitSwallow)
	w.want, w.origin, w.reuse = 2, plan.Origin, st.again
	s.pushSwallow(w)
	out, _ := (&pgproto3.Close{ObjectType: 'S', Name: name}).Encode(s.out[:0])
	s.out = out
	if _, err := s.sw.Write(out); err != nil {
		return err
	}
	s.out = append(append(append(s.out[:0], 'P', 0, 0, 0, 0), name...), 0)
	s.out = append(append(append(s.out, sql...), 0), st.params...)
	binary.BigEndian.PutUint32(s.out[1:5], uint32(len(s.out)-1))
	_, err := s.sw.Write(s.out)
	return err
}

func (s *session) execute(n int) error {
	var p *Probe
	if len(s.portals) > 0 || s.portalGone {
		b, err := s.peek(n)
		if err != nil {
			return err
		}
		if portal, _, err := cstring(b); err == nil {
			p = s.portals[string(portal)]
			if len(portal) == 0 && s.portalGone {
				if err := s.closeUnnamedPortal(); err != nil {
					return err
				}
			}
		}
	}
	s.pipe.push(executeWait)
	if err := forward(s.sw, s.cr, n); err != nil {
		return err
	}
	if p != nil {
		// Run the probe right after the Execute, in the same transaction,
		// before whatever the client sends next.
		return s.injectProbe(p)
	}
	return nil
}

// injectProbe runs p, preparing its statement first unless this session's
// backend is known to have it.
func (s *session) injectProbe(p *Probe) error {
	if s.probes == nil {
		s.probes = make(map[*Probe]*atomic.Bool)
	}
	ready := s.probes[p]
	if ready == nil {
		ready = new(atomic.Bool)
		s.probes[p] = ready
	}
	w := s.pipe.get(waitProbe)
	w.probe, w.want, w.ready = p, probeRunReplies, ready
	// Prepared again also while a text that may have deallocated it is
	// yet to make the session forget it (see settled): Postgres may have
	// confirmed the prepare after the text was planned.
	if !ready.Load() || s.lost.Load() || s.txPool() {
		w.want += probePrepareReplies
		if _, err := s.sw.Write(p.prepare); err != nil {
			return err
		}
	}
	s.pipe.push(w)
	if s.txPool() {
		// Closed once bound, so that it does not outlive the transaction.
		w.want++
		s.out = append(append(append(s.out[:0], p.run[:p.bindLen]...), p.closeStmt...), p.run[p.bindLen:]...)
		_, err := s.sw.Write(s.out)
		return err
	}
	_, err := s.sw.Write(p.run)
	return err
}

// lostStatements reports, once, that the server has said since the last
// call that a prepared statement does not exist.
func (s *session) lostStatements() bool {
	return s.lost.Load() && s.lost.Swap(false) // a load is cheaper than a swap on every message
}

// forgetProbes makes every probe, and setStmt, prepare again before its
// next use.
func (s *session) forgetProbes() {
	for _, ready := range s.probes {
		ready.Store(false)
	}
	s.setReady = false
}

func (s *session) close(n int) error {
	s.pipe.loose++
	if len(s.stmts) == 0 && len(s.portals) == 0 {
		return forward(s.sw, s.cr, n)
	}
	b, err := s.peek(n)
	if err != nil {
		return err
	}
	if len(b) > 1 {
		if name, _, err := cstring(b[1:]); err == nil {
			switch b[0] {
			case 'S':
				delete(s.stmts, string(name))
				if len(name) == 0 && (s.unnamed != nil || s.unnamedSeq != 0) {
					// If Postgres skips this Close (after an error in its
					// batch), the client's unnamed statement stays, but
					// the server's may be the proxy's stand-in: fail a
					// Bind of it rather than run that (see
					// session.unnamedGone).
					s.unnamed, s.unnamedGone, s.unnamedSeq, s.unnamedClosed = nil, true, 0, nil
				}
			case 'P':
				delete(s.portals, string(name))
			}
		}
	}
	return forward(s.sw, s.cr, n)
}

// serverToClient forwards the server's replies until the session ends.
func (s *session) serverToClient() error {
	for {
		if s.sr.Buffered() == 0 {
			if err := s.cw.Flush(); err != nil {
				return err
			}
		}
		typ, n, err := header(s.sr, maxServerMessage)
		if err == nil {
			err = s.serverMessage(typ, n)
		}
		if err != nil {
			return err
		}
	}
}

// serverMessage forwards the server's next message, keeping probe replies
// from the client and letting the Interceptor see errors.
func (s *session) serverMessage(typ byte, n int) error {
	w := s.pipe.head()
	switch {
	case w == nil:
		return s.reply(w, typ, n)
	case w.kind == waitProbe:
		return s.probeReply(w, typ, n)
	case w.kind == waitSwallow:
		return s.swallowReply(w, typ, n)
	case w.kind == waitSet:
		return s.setReply(w, typ, n)
	case w.kind == waitPass && (typ == '2' || typ == '3'):
		if w.seen++; w.seen == w.want {
			s.pipe.pop()
		}
	case w.kind == waitQuery && w.inProbe():
		return s.queryProbeReply(w, typ, n)
	}
	return s.reply(w, typ, n)
}

// wholeServerMessage reports whether serverMessage needs all of a server
// message in hand rather than its first peekLimit bytes: the ones it
// decodes, and every reply to a probe.
func (s *session) wholeServerMessage(typ byte) bool {
	if typ == 'E' || typ == 'S' || typ == 'N' {
		return true
	}
	w := s.pipe.head()
	return w != nil && (w.kind == waitProbe || w.kind == waitSwallow || w.kind == waitSet || w.kind == waitQuery && w.inProbe())
}

// inProbe reports whether the statement now replying is a probe.
func (w *wait) inProbe() bool {
	return len(w.probes) > 0 && w.probes[0].Index == w.stmt
}

func (s *session) reply(w *wait, typ byte, n int) error {
	switch typ {
	case '1': // ParseComplete
		if w != nil && w.kind == waitParse {
			if w.reuse != nil {
				w.reuse.state.Store(stmtReady)
			}
			if w.mark != nil {
				w.mark.done.Store(w.seq)
			}
			s.pipe.pop()
		}
	case 'C', 'I', 's': // CommandComplete, EmptyQueryResponse, PortalSuspended
		if w != nil {
			switch w.kind {
			case waitExecute:
				s.pipe.pop()
			case waitQuery:
				if w.probes != nil {
					w.stmt++
				}
			}
		}
	case 'Z':
		var status byte
		if b, err := s.sr.Peek(6); err == nil && n == 1 {
			status = b[5]
		}
		s.started, s.rt.ended = true, true
		if w != nil && w.held {
			return s.heldReady(n, status)
		}
		s.readySet(status)
		s.failed.Store(status == 'E')
		if changed := s.pipe.ready(); (changed || s.reverting) && status != 0 {
			s.settled(changed, status)
		}
		if status != 0 && s.pipe.head() == nil {
			if status == 'T' && s.pipe.single {
				s.quietBlock = true
			}
			if status == 'I' {
				s.idle.Store(true)
				if s.srv.draining.Load() {
					if err := forward(s.cw, s.sr, n); err != nil {
						return err
					}
					return errDrained
				}
			}
		}
	case 'E':
		if w != nil && w.held {
			return s.setFailed(n) // committing the settings failed
		}
		return s.serverError(w, n)
	case 'S':
		return s.parameterStatus(n)
	case 'N':
		return s.serverNotice(n)
	case 'K':
		s.keyData(n)
	case 'R':
		s.noteAuth(n)
	}
	return forward(s.cw, s.sr, n)
}

// settled follows a setting that a text may have changed (Plan.Forget) to
// where the change ends. Changed inside a transaction block (SET LOCAL, or
// any SET the block rolls back), it changes back as the block ends, after
// the proxy prepared its statements again for the changed one: they must be
// prepared again then too. changed says the unit of work that a
// ReadyForQuery ends had such a text, status is the transaction status
// that ReadyForQuery gives.
func (s *session) settled(changed bool, status byte) {
	switch {
	case status != 'I':
		s.reverting = true
	case changed || s.reverting:
		// A block ended, or may have ended inside the unit itself
		// (BEGIN; SET LOCAL ...; COMMIT). After a change outside any block
		// this prepares again only what the unit prepared after it.
		s.reverting = false
		s.lost.Store(true)
	}
}

// serverError forwards an ErrorResponse (or the Interceptor's replacement)
// and notes what the server will skip because of it.
func (s *session) serverError(w *wait, n int) error {
	s.setRan = 0 // the unit's transaction is rolled back
	b, e, err := s.readError(n)
	if err != nil {
		return err
	}
	if !s.started {
		s.srv.upstreamFailed(&upstreamError{startupFailure(e.Code), errors.New(e.Message)})
	}
	moved := false
	if e.Position != 0 && w != nil { // before skipToSync recycles w
		// A position in the text Postgres got, which may not be the
		// client's: point into the client's instead.
		if p := w.position(s.c, e.Position); p != e.Position {
			e.Position, moved = p, true
		}
	}
	if w != nil && len(w.ends) > 0 {
		if n, where, ok := boundParamContext(e.Where); ok {
			// An error reading a value the proxy bound in place of the
			// client's literal: say it as Postgres says it of a literal,
			// at the literal and with no word of a parameter.
			e.Where, moved = where, true
			if e.Position == 0 && w.origin != nil {
				e.Position = int32(w.origin.Param(s.c, n, w.bound()))
			}
		}
	}
	if w != nil {
		switch w.kind {
		case waitQuery:
			if w.probes != nil {
				w.probes = nil // the rest of the query string is not run
			}
		case waitExecute, waitProbe, waitSwallow, waitParse, waitPass:
			s.pipe.skipToSync()
		}
	}
	if e.Severity == "FATAL" || e.Severity == "PANIC" {
		s.fatal = true
	}
	if e.Code == codeUndefinedStatement {
		s.lost.Store(true)
	}
	if e.Code == codeInvalidAuthorization && strings.Contains(e.Message, "channel binding negotiation") {
		// The client supports channel binding and Postgres, over TLS,
		// offered it to pgfence: a mismatch no client setting but one can
		// fix. Say which.
		e.Message, e.Hint = "pgfence: "+channelBindingHelp, channelBindingHint
		out, err := e.Encode(s.out[:0:0])
		if err != nil {
			return err
		}
		_, err = s.cw.Write(out)
		return err
	}
	r := s.srv.cfg.Interceptor.Error(s.c, &e)
	if r == nil && moved {
		r = &e
	}
	if r != nil {
		out, err := r.Encode(s.out[:0:0])
		if err != nil {
			return err
		}
		_, err = s.cw.Write(out)
		return err
	}
	return writeMessage(s.cw, 'E', b)
}

// serverNotice forwards a NoticeResponse unless the Interceptor keeps it
// from the client.
func (s *session) serverNotice(n int) error {
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return err
	}
	var nr pgproto3.NoticeResponse
	if err := nr.Decode(b); err != nil {
		return fmt.Errorf("server sent a malformed NoticeResponse: %w", err)
	}
	if !s.srv.cfg.Interceptor.Notice(s.c, &nr) {
		return nil
	}
	return writeMessage(s.cw, 'N', b)
}

// readError consumes the server's ErrorResponse of n bytes and returns
// its body (in the session's buffer) and what it says.
func (s *session) readError(n int) ([]byte, pgproto3.ErrorResponse, error) {
	var e pgproto3.ErrorResponse
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return nil, e, err
	}
	if err := e.Decode(b); err != nil {
		return nil, e, fmt.Errorf("server sent a malformed ErrorResponse: %w", err)
	}
	return b, e, nil
}

// boundParamContext returns where without its last line if that is the
// context Postgres gives an error reading the value of parameter n of the
// unnamed portal ("unnamed portal parameter $2", with " = 'value'" when
// log_parameter_max_length_on_error allows).
func boundParamContext(where string) (n int, rest string, ok bool) {
	i := strings.LastIndexByte(where, '\n') + 1
	line, found := strings.CutPrefix(where[i:], "unnamed portal parameter $")
	if !found {
		return 0, "", false
	}
	digits, _, _ := strings.Cut(line, " = ")
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 {
		return 0, "", false
	}
	return n, strings.TrimSuffix(where[:i], "\n"), true
}

func (s *session) parameterStatus(n int) error {
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return err
	}
	if name, rest, err := cstring(b); err == nil {
		if v, _, err := cstring(rest); err == nil {
			if s.srv.cfg.RequirePrimary && string(name) == "in_hot_standby" && string(v) == "on" {
				return s.standby()
			}
			s.c.serverParam(string(name), string(v))
		}
	}
	return writeMessage(s.cw, 'S', b)
}

// channelBindingHelp explains why SCRAM channel binding cannot work
// through pgfence.
const channelBindingHelp = "SCRAM channel binding cannot pass through pgfence: the client's TLS channel ends at pgfence, not at Postgres, so the binding can never match"

const channelBindingHint = "connect with channel_binding=disable (the password exchange is still SCRAM), or let pgfence reach Postgres without TLS (e.g. over loopback or a Unix socket), where Postgres does not offer channel binding"

// authSASL is AuthenticationSASL's request code.
const authSASL = 10

// noteAuth watches authentication requests for the start of SASL, so that
// the client's choice of mechanism can be checked.
func (s *session) noteAuth(n int) {
	if b, err := s.sr.Peek(9); err == nil && n >= 4 && binary.BigEndian.Uint32(b[5:9]) == authSASL {
		s.sasl.Store(true)
	}
}

// saslInitial checks the client's SASLInitialResponse: a client choosing
// SCRAM-SHA-256-PLUS is stopped with an explanation instead of failing
// later with a bare "channel binding check failed".
func (s *session) saslInitial(n int) error {
	if !s.sasl.CompareAndSwap(true, false) {
		return forward(s.sw, s.cr, n)
	}
	b, err := s.peek(n)
	if err != nil {
		return err
	}
	if mech, _, err := cstring(b); err == nil && string(mech) == "SCRAM-SHA-256-PLUS" {
		return &clientError{err: errors.New(channelBindingHelp), code: codeInvalidAuthorization, hint: channelBindingHint}
	}
	return forward(s.sw, s.cr, n)
}

// keyData keeps the backend's key so the proxy can cancel its query if the
// client goes away (the message itself is forwarded as is).
func (s *session) keyData(n int) {
	b, err := s.sr.Peek(5 + n)
	if err != nil || n < 8 || n > 256 {
		return
	}
	p := binary.BigEndian.AppendUint32(nil, uint32(8+n))
	p = binary.BigEndian.AppendUint32(p, codeCancelRequest)
	p = append(p, b[5:]...)
	s.cancel.Store(&p)
}

// probeReply handles a reply to an injected extended-protocol probe.
func (s *session) probeReply(w *wait, typ byte, n int) error {
	switch typ {
	case '1': // ParseComplete: the backend has the statement now
		w.ready.Store(true)
	case '2', 'C', '3': // BindComplete, CommandComplete, CloseComplete
	case 'D':
		if err := s.captureRow(w, n); err != nil {
			return err
		}
		w.seen++
		return nil
	case 'E':
		s.log.Warn("probe failed; the client's transaction is aborted", "client", s.c.RemoteAddr)
		w.ready.Store(false) // prepare it again next time, whatever went wrong
		return s.serverError(w, n)
	default:
		return s.reply(w, typ, n)
	}
	w.seen++
	if err := skip(s.sr, n); err != nil {
		return err
	}
	if w.seen == w.want {
		p, row := w.probe, w.row
		s.pipe.pop() // recycles w
		return s.probed(p, row)
	}
	return nil
}

// swallowReply keeps the replies to messages the proxy sent on its own
// (a re-prepare, or the Parse and Bind of a bound Query) from the client.
func (s *session) swallowReply(w *wait, typ byte, n int) error {
	switch typ {
	case '1': // ParseComplete
		if w.reuse != nil {
			w.reuse.state.Store(stmtReady)
			w.reuse = nil // an error now is the Bind's: the statement stays
		}
	case '2', '3': // BindComplete, CloseComplete
	default:
		return s.reply(w, typ, n)
	}
	if w.seen++; w.seen == w.want {
		if w.reuse != nil { // a Close's (a Parse's is noted above)
			w.reuse.state.Store(stmtReady)
		}
		s.pipe.pop()
	}
	return skip(s.sr, n)
}

// queryProbeReply handles a reply to a probe statement inside a simple Query.
func (s *session) queryProbeReply(w *wait, typ byte, n int) error {
	switch typ {
	case 'T':
		return skip(s.sr, n)
	case 'D':
		return s.captureRow(w, n)
	case 'C':
		p, row := w.probes[0].Probe, w.row
		w.probes = w.probes[1:]
		w.stmt++
		w.row = nil
		if err := skip(s.sr, n); err != nil {
			return err
		}
		return s.probed(p, row)
	default:
		return s.reply(w, typ, n)
	}
}

// probed hands a probe's row to its ProbeFunc and relays the notice it
// returns, if any.
func (s *session) probed(p *Probe, row [][]byte) error {
	notice := p.done(s.c, row)
	if notice == nil {
		return nil
	}
	b, err := notice.Encode(s.out[:0:0])
	if err != nil {
		return err
	}
	_, err = s.cw.Write(b)
	return err
}

// captureRow keeps a probe's DataRow for its ProbeFunc, in buffers the
// session reuses: a probe's row is handed over before the next one arrives.
func (s *session) captureRow(w *wait, n int) error {
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return err
	}
	s.rowBuf = append(s.rowBuf[:0], b...)
	row, err := decodeRow(s.rowBuf, s.row[:0])
	if err != nil {
		return err
	}
	s.row, w.row = row, row
	return nil
}

// decodeRow splits a DataRow's body into its values (nil for NULL),
// appended to row; they share b.
func decodeRow(b []byte, row [][]byte) ([][]byte, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("server sent a malformed DataRow: %d bytes", len(b))
	}
	cols := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	for range cols {
		if len(b) < 4 {
			return nil, errors.New("server sent a malformed DataRow: a column is cut short")
		}
		l := int(int32(binary.BigEndian.Uint32(b)))
		b = b[4:]
		switch {
		case l < 0:
			row = append(row, nil)
		case l > len(b):
			return nil, errors.New("server sent a malformed DataRow: a value is cut short")
		default:
			row = append(row, b[:l:l])
			b = b[l:]
		}
	}
	return row, nil
}

// SQLSTATEs the proxy itself raises.
const (
	codeProtocolViolation    = "08P01"
	codeConnectionFailure    = "08006"
	codeCannotConnect        = "08001"
	codeTooManyConnections   = "53300"
	codeRejected             = "08004" // sqlserver_rejected_establishment_of_sqlconnection
	codeReadOnly             = "25006" // read_only_sql_transaction
	codeAdminShutdown        = "57P01"
	codeInvalidAuthorization = "28000"
	codeUndefinedStatement   = "26000" // invalid_sql_statement_name: "prepared statement ... does not exist"
)

// standby ends a session whose server is a standby (see
// Config.RequirePrimary).
func (s *session) standby() error {
	writeFatal(s.cw, codeReadOnly, fmt.Sprintf("the server at %s is a standby (in_hot_standby = on), and pgfence was asked for a writable primary (target_session_attrs=read-write)", s.upstream),
		"the primary has moved (a failover); reconnect, and pgfence connects you to the new primary once it has found it")
	s.fatal = true
	s.log.Warn("session ended: its server is a standby", "client", s.c.RemoteAddr, "upstream", s.upstream)
	return errors.New("the server is a standby")
}

// sendFatal tells the client why its session ends. Only called once the
// server-to-client goroutine has stopped writing.
func (s *session) sendFatal(code, msg, hint string) {
	writeFatal(s.cw, code, msg, hint)
	s.cw.Flush()
}

func writeFatal(w io.Writer, code, msg, hint string) {
	writeError(w, "FATAL", code, msg, hint)
}

func writeError(w io.Writer, severity, code, msg, hint string) {
	e := pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: code, Message: "pgfence: " + msg, Hint: hint}
	b, _ := e.Encode(nil)
	w.Write(b)
}
