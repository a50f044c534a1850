package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// maxServerMessage bounds what the server may send in one message (Postgres
// itself never sends more than 1 GiB).
const maxServerMessage = 1 << 30

// session relays one client connection to its own server connection.
//
// It has two sides. The client side reads the client's messages and writes
// to the server (clientMessage); the server side reads the server's and
// writes to the client (serverMessage). Relayed by goroutines, each side is
// a goroutine of its own; on the event loop, both run on the loop's
// goroutine. Each field says which side owns it, and each feature is a
// part of the session (see Parts of a session in the package
// documentation), a type of its own that says the same of its fields: what
// the client has prepared and bound (stmtBook), the statements the proxy
// prepares for reuse (reuseState), the SETs it answers itself (setState)
// and how it sets them on the server (applyState), what it keeps behind a
// transaction pooler (txPooling), its probes (probeState), what may have
// deallocated its statements (forgetState), and what it keeps of
// authentication (authState). The dispatcher below (clientMessage, query,
// parse, bind; serverMessage, ready) hands them each message in order.
type session struct {
	srv *Server
	c   *Client
	log *slog.Logger
	// tag is in the names of the proxy's statements on the server (see
	// Statement names in the package documentation).
	tag string

	// client and server are the connections, set before the relay starts
	// (server under mu) and replaced when the event loop hands the session
	// back.
	client net.Conn
	server net.Conn
	mu     sync.Mutex // guards server and stop
	// stop, set while the event loop relays, ends the session from outside
	// the loop (closing server does that for goroutines).
	stop func()
	// stopped is closed when the goroutine relay's server side has ended,
	// for a client side held (see Client.HoldNextStatement).
	stopped chan struct{}
	// upstream is the address of the server the session is connected to
	// (set before the relay starts; read under Server.mu).
	upstream string

	// The relay reads and writes through these: bufio over the connections
	// when goroutines relay, the event loop's buffers when it does. The
	// client side reads cr and writes link.sw, the server side reads
	// fromServer.sr and writes fromServer.cw; on the event loop each may
	// write the other's too (the client side answering a SET, the server
	// side retrying deferred settings), and once both have stopped finish
	// writes cw.
	cr msgReader
	// link is the way to the server the parts share: sw, the pipeline,
	// the out buffer, and whether the block failed.
	link
	// fromServer is the way back the parts' reply handlers share: sr, cw,
	// sbuf (the server message being handled) and the session (via).
	fromServer

	// idle is true while the session is outside a transaction with nothing
	// in flight, so a drain may end it. Both sides write it; the Server
	// reads it.
	idle atomic.Bool
	// ranSinceReady is set by a statement's end (CommandComplete,
	// EmptyQueryResponse, PortalSuspended) until the next ReadyForQuery.
	ranSinceReady atomic.Bool
	// terminated is set by the client side when the client sent Terminate:
	// the server closing its end afterwards is the expected end, not a
	// failure.
	terminated atomic.Bool
	// started is set by the server side at the server's first
	// ReadyForQuery: an error before it is a failure to connect
	// (Config.UpstreamFailed).
	started bool
	// fatal is set by the server side once the server has sent a FATAL
	// error (or the proxy sent one in its place); finish reads it once both
	// sides have stopped.
	fatal bool
	rt    roundTrip // for Config.RoundTrip; the event loop's only

	// cbuf holds the client message being handled (the client side's).
	cbuf []byte

	auth   authState
	forget forgetState
	book   stmtBook
	reuse  reuseState
	sets   setState
	apply  applyState
	probes probeState
	pool   txPooling
}

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
	if s.c.loop >= 0 {
		if e, ok := s.srv.loops[s.c.loop].relay(s); ok {
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
	if p := s.auth.cancel.Load(); p != nil {
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
			if hint == "" {
				hint = "the connection was closed by pgfence; other sessions are not affected"
			}
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
			return s.framingError(err)
		}
		f := clientFrame{typ: clientMsg(typ), n: n}
		for mayHold(f.typ) {
			ch, _, err := s.holdFor(&f)
			if err != nil {
				return err
			}
			if ch == nil {
				break
			}
			if err := s.sw.Flush(); err != nil {
				return err
			}
			select {
			case <-ch:
			case <-s.stopped:
				return net.ErrClosed
			}
		}
		if err := s.clientMessage(&f); err != nil {
			return err
		}
	}
}

// clientMessage forwards the client's next message f, handing the few
// that matter to the Interceptor and the parts of the session, in order
// (see Parts of a session in the package documentation). It returns
// io.EOF after the client's Terminate.
func (s *session) clientMessage(f *clientFrame) error {
	typ, n := f.typ, f.n
	idle := s.idle.Load()
	if idle { // a load is cheaper than a store on every message
		s.idle.Store(false)
	}
	s.sets.onMessage(idle)
	s.pool.onMessage(idle)
	if idle && s.txPool() {
		s.book.onPooledTransaction()
	}
	if typ == clientMsgBind && s.sets.quiet() && s.sets.haveStmts {
		u, ok := s.unit(f)
		if set := s.sets.bindAnswer(u, ok, &s.book, s.srv.cfg.Interceptor.Generation(), &s.link, s.apply.held); set != nil {
			return s.answerSet(set, &u, false)
		}
	}
	if len(s.sets.deferred) > 0 && !s.txPool() && s.apply.now(typ, !s.c.midBatch) && s.sets.pending() {
		if err := s.applyDeferred(f); err != nil {
			return err
		}
	}
	switch typ {
	case clientMsgParse, clientMsgBind, clientMsgExecute, clientMsgClose, clientMsgDescribe, clientMsgFlush:
		s.c.midBatch = true
	case clientMsgSync:
		s.c.midBatch, s.apply.quiet = false, nil
		if len(s.c.afterSync) > 0 {
			// A hold taken in the batch this Sync ends (see Statement holds).
			s.c.held, s.c.holdAgain, s.c.afterSync = true, append(s.c.holdAgain, s.c.afterSync...), nil
		}
	}
	if mayHold(typ) {
		s.c.settled = false
	}
	switch typ {
	case clientMsgQuery:
		return s.query(n)
	case clientMsgParse:
		return s.parse(n)
	case clientMsgBind:
		return s.bind(f)
	case clientMsgExecute:
		quiet := s.apply.quiet
		s.apply.quiet = nil
		p, err := s.book.onExecute(&s.link, s.cr, n, quiet, s.sets.deferred)
		if p != nil && err == nil {
			// Run the probe right after the Execute, in the same
			// transaction, before whatever the client sends next.
			err = s.injectProbe(p)
		}
		return err
	case clientMsgClose:
		return s.book.onClose(&s.link, s.cr, &s.reuse, n)
	case clientMsgDescribe:
		return s.book.onDescribe(&s.link, s.cr, &s.reuse, s.replanner(), f)
	case clientMsgSync, clientMsgFunctionCall: // both end with ReadyForQuery
		s.pipe.push(s.forget.syncWait(&s.pipe))
		return forward(s.sw, s.cr, n)
	case clientMsgPassword:
		return s.auth.onPassword(s.sw, s.cr, n)
	case clientMsgTerminate:
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

// query handles a Query: planned, then seen by the parts in order.
func (s *session) query(n int) error {
	m, text, err := readQuery(s.cr, &s.cbuf, n)
	if err != nil {
		return err
	}
	plan := s.srv.cfg.Interceptor.Query(s.c, unsafe.String(unsafe.SliceData(text), len(text)))
	apply := s.apply.takeAfterPlan()
	if plan.Setting != nil && s.sets.mayAnswer(plan.Setting, &s.link, s.apply.held) {
		// As for a bound Query, the server keeps the unnamed statement the
		// client's view of the session says the Query destroyed, and in a
		// block the unnamed portal too. (An idle session has none: its
		// transaction ended.)
		s.book.onAnsweredQuery()
		s.reuse.unnamedGone(&s.book)
		return s.answerSet(plan.Setting, nil, false)
	}
	if apply {
		if err := s.applyPlanned(&plan, false, nil); err != nil {
			return err
		}
	}
	if s.txPool() && plan.NeedsToken {
		if plan.ParamTypes != nil {
			if err := s.sendDeferred(); err != nil {
				return err
			}
		} else {
			s.pool.onQuery(&plan, text)
		}
	}
	if s.forget.onPlan(plan.Forget) {
		s.forgetStatements()
	}
	s.book.onQuery(s.blockMayHaveFailed())
	s.reuse.onQuery()
	if plan.ParamTypes != nil {
		return s.queryBound(&plan)
	}
	return s.sendQuery(m, &plan, s.forget.takeChanging())
}

// queryBound runs a Query planned with Plan.ParamTypes bound (see Bound
// Queries in the package documentation): the statement, its probe, and a
// Sync.
func (s *session) queryBound(plan *Plan) error {
	s.book.onBoundQuery(s.failedNow())
	p, exec := plan.probe(), executeWait
	if q := s.apply.quiet; q != nil {
		s.apply.quiet = nil
		if w := s.watch(p, q, s.sets.deferred); w != nil {
			p, exec = nil, w
		}
	}
	if err := s.reuse.sendBound(&s.link, s.tag, plan, s.txPool(), exec); err != nil {
		return err
	}
	if p != nil {
		if err := s.injectProbe(p); err != nil {
			return err
		}
	}
	s.pipe.push(s.forget.syncWait(&s.pipe))
	_, err := s.sw.Write(syncMessage)
	return err
}

// parse handles a Parse: planned, then seen by the parts in order.
func (s *session) parse(n int) error {
	m, name, text, params, err := readParse(s.cr, &s.cbuf, n)
	if err != nil {
		return err
	}
	ic := s.srv.cfg.Interceptor
	gen := ic.Generation()
	st := s.book.record(name, text, params)
	plan := ic.Parse(s.c, st.text)
	if set := plan.Setting; len(name) == 0 && set != nil && s.sets.quiet() && s.sets.mayAnswer(set, &s.link, s.apply.held) && noParamTypes(st.params) {
		if u, ok := s.unit(nil); s.sets.answersUnnamed(u, ok) {
			st.answered(set, gen)
			s.sets.onAnsweredParse()
			s.reuse.onAnsweredParse()
			s.book.onAnsweredParse()
			s.apply.takeAfterPlan() // the settings stay deferred, this one with them
			return s.answerSet(set, &u, true)
		}
	}
	if s.apply.takeAfterPlan() {
		if err := s.applyPlanned(&plan, true, name); err != nil {
			return err
		}
	}
	if s.txPool() && plan.NeedsToken {
		if err := s.sendDeferred(); err != nil {
			return err
		}
	}
	if s.forget.onPlan(plan.Forget) {
		s.forgetStatements()
	}
	s.book.onParse(name, st)
	st.planned(&plan, gen)
	w := parseWait
	if len(name) == 0 {
		if s.reuse.onParse(&plan, s.failed.Load(), s.txPool()) {
			return s.reuse.parseReused(&s.link, s.tag, plan, params)
		}
		w = s.reuse.parseWait(&s.pipe, plan)
	} else if plan.SQL != "" {
		w = s.pipe.parseWait(plan)
	}
	if plan.Setting != nil {
		w = s.sets.trackParsed(&s.pipe, st, w)
	}
	return s.sendParse(m, name, params, &plan, w)
}

// bind forwards the Bind f, after what the proxy sends before it, if
// anything. Its names are decoded (once: see clientFrame) only when the
// session tracks what Binds name.
func (s *session) bind(f *clientFrame) error {
	var m bindMsg
	ok := false
	if s.txPool() || s.book.tracking() {
		var err error
		if m, ok, err = f.decodedBind(s.cr); err != nil {
			return err
		}
	}
	if s.pool.onBind(&s.book, m, ok) {
		if err := s.sendDeferred(); err != nil {
			return err
		}
	}
	err := s.book.onBind(&s.link, s.cr, &s.reuse, s.replanner(), m, ok, f.n)
	s.pipe.loose++ // after the proxy's own: its reply comes after theirs
	return err
}

// replanner is what the book plans a statement again with.
func (s *session) replanner() replanner {
	return replanner{ic: s.srv.cfg.Interceptor, c: s.c, log: s.log}
}

// answerSet answers set, a SET the client sent, as Postgres would, and
// defers it to the server: a simple Query's (u nil), or the unit u at the
// front of the client's buffer, after its Parse if parse.
func (s *session) answerSet(set *Setting, u *unitMessages, parse bool) error {
	if u != nil {
		s.cr.Discard(u.size)
		s.c.midBatch = false
	}
	s.srv.cfg.Interceptor.SettingAnswered(s.c, set)
	if s.sets.onAnswered(set) {
		s.idle.Store(true)
	}
	s.pool.onAnswered(set)
	return s.sets.answer(s.cw, &s.book, set, u, parse)
}

// unit finds the statement's unit at the front of the client's buffer (see
// unitAt): f, if not nil, is the Bind it starts with, decoded once.
func (s *session) unit(f *clientFrame) (unitMessages, bool) {
	if f != nil {
		if m, ok, err := f.decodedBind(s.cr); err == nil && ok {
			return unitAt(s.cr, 0, &m)
		}
	}
	return unitAt(s.cr, 0, nil)
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
			err = s.serverMessage(serverMsg(typ), n)
		}
		if err != nil {
			return err
		}
	}
}

// serverMessage forwards the server's next message, keeping probe replies
// from the client and letting the Interceptor see errors.
func (s *session) serverMessage(typ serverMsg, n int) error {
	w := s.pipe.head()
	switch {
	case w == nil:
		return s.reply(w, typ, n)
	case w.kind == waitProbe:
		return s.probes.onReply(&s.fromServer, &s.link, s.c, w, typ, n)
	case w.kind == waitSwallow:
		return s.swallowReply(w, typ, n)
	case w.kind == waitSet:
		return s.apply.onReply(&s.fromServer, &s.link, &s.sets, &s.pool, w, typ, n)
	case w.kind == waitPass && (typ == serverMsgBindComplete || typ == serverMsgCloseComplete):
		if w.seen++; w.seen == w.want {
			s.pipe.pop()
		}
	case w.kind == waitQuery && w.inProbe():
		return s.probes.onQueryReply(&s.fromServer, s.c, w, typ, n)
	}
	return s.reply(w, typ, n)
}

// wholeServerMessage reports whether serverMessage needs all of a server
// message in hand rather than its first peekLimit bytes: the ones it
// decodes, and every reply to a probe.
func (s *session) wholeServerMessage(typ serverMsg) bool {
	switch typ {
	case serverMsgErrorResponse, serverMsgParameterStatus, serverMsgNoticeResponse:
		return true
	}
	w := s.pipe.head()
	return w != nil && (w.kind == waitProbe || w.kind == waitSwallow || w.kind == waitSet || w.kind == waitQuery && w.inProbe())
}

// ready handles the ReadyForQuery (n bytes) that says status (0 if it is
// malformed), answering w: the parts see it in order. done says it was
// handled whole (it ended deferred settings the proxy sent, see
// applyState.onHeldReady,
// or a drain); else it goes on to the client.
func (s *session) ready(w *wait, n int, status txStatus) (done bool, err error) {
	s.started, s.rt.ended = true, true
	s.c.readyForQuery()
	if status != 0 {
		s.c.lastReady.Store(uint32(status))
	}
	if s.ranSinceReady.Load() {
		s.ranSinceReady.Store(false)
	}
	if w != nil && w.held {
		return true, s.apply.onHeldReady(&s.fromServer, &s.link, &s.sets, &s.pool, n, status)
	}
	s.failed.Store(status == txFailed)
	s.forget.onReady(s.pipe.ready(), status)
	quiet := status != 0 && s.pipe.head() == nil // every reply is in
	s.sets.onReady(status, quiet && s.pipe.single)
	if !quiet {
		return false, nil
	}
	if status == txIdle {
		s.idle.Store(true)
		if s.srv.draining.Load() {
			if err := forward(s.cw, s.sr, n); err != nil {
				return true, err
			}
			return true, errDrained
		}
	}
	return false, nil
}

// startParts gives each part of the session what it keeps of the
// configuration; tokens are the token settings of the startup packet.
func (s *session) startParts(tokens []Setting) {
	cfg := &s.srv.cfg
	s.reuse.start(s.srv.standIn)
	s.apply.start(s.tag, cfg.SettingSQL, cfg.Hints.Pooler)
	s.sets.start(!cfg.ForwardSettings && cfg.SettingSQL != "" && !s.c.Replication, cfg.TransactionPooling)
	if cfg.TransactionPooling {
		// The token setting as Postgres folds it, and the Interceptor names it.
		s.pool.start(cfg.Interceptor.(PooledSets), s.c, tokens, strings.ToLower(cfg.TokenSetting))
	}
}

// forgetStatements has each part of the session prepare its statements on
// the server again before their next use (see forgetState): every probe,
// setStmt, and the statements prepared for reuse; and stops the session
// answering Binds of the client's SET statements until they are parsed
// again.
func (s *session) forgetStatements() {
	s.probes.forget()
	s.apply.forget()
	s.reuse.forget(&s.book)
	s.book.forgetParsed()
}

// injectProbe runs p through the probes part, after what was sent so far.
func (s *session) injectProbe(p *Probe) error {
	return s.probes.inject(&s.link, p, s.forget.lost.Load(), s.txPool())
}

// txPool reports whether a transaction pooler stands behind the proxy.
func (s *session) txPool() bool { return s.pool.on }

// sendDeferred sends the deferred settings ahead of the client's message
// being handled, in its unit of work (see applyState.send).
func (s *session) sendDeferred() error {
	return s.apply.send(&s.link, &s.sets, &s.pool, s.forget.lost.Load(), false)
}

// sendDeferredHolding sends the deferred settings with a Sync of their own
// and holds back what the proxy sends after them until Postgres answers.
func (s *session) sendDeferredHolding() error {
	return s.apply.sendHolding(&s.link, &s.sets, &s.pool, s.forget.lost.Load())
}

// applyDeferred sets the deferred settings on the server ahead of a batch
// whose first message is f: joined to it when the batch is a unit of one
// fenced write, else on their own. A Query or Parse is left to
// applyPlanned, once it is planned.
func (s *session) applyDeferred(f *clientFrame) error {
	switch f.typ {
	case clientMsgQuery, clientMsgParse:
		s.apply.planFirst()
		return nil
	case clientMsgBind:
		if u, ok := s.unit(f); ok {
			if p := s.book.probeOf(u.stmt); p != nil {
				return s.sendDeferredJoined(p)
			}
		}
	}
	return s.sendDeferredHolding()
}

// sendDeferredJoined sends the deferred settings joined to the unit of one
// fenced write, whose probe is p, that the client's message being handled
// starts: with the quiet mark, where p's Quiet lets the proxy leave it out
// (see Quiet).
func (s *session) sendDeferredJoined(p *Probe) error {
	if s.sets.wasIdle && p.quiet != nil && p.quiet.Known(s.c, s.sets.deferred) {
		s.apply.quiet = p
	}
	return s.sendDeferred()
}

// applyPlanned is applyDeferred for a batch that starts with a Query or
// with a Parse of name (read from the buffer), now that plan says what it
// is: a bound Query is a unit of one fenced write, and so is a Parse of
// one followed by a unit that binds it.
func (s *session) applyPlanned(plan *Plan, parse bool, name []byte) error {
	fenced := plan.probe() != nil && !plan.Forget
	if parse {
		u, ok := s.unit(nil)
		if fenced = fenced && ok && bytes.Equal(u.stmt, name); fenced {
			return s.sendDeferredJoined(plan.probe())
		}
	} else if fenced = fenced && plan.ParamTypes != nil && !s.c.midBatch; fenced {
		return s.sendDeferredJoined(plan.probe())
	}
	return s.sendDeferredHolding()
}
