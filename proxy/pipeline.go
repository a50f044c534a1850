package proxy

import (
	"sync"
	"sync/atomic"
)

// The pipeline lets the server-side relay attribute each reply to the client
// message that caused it, so that replies to probes the proxy injected can be
// kept from the client. Tracked are the messages whose replies end a unit of
// work, and Parse, so that the proxy knows which Parse a ParseComplete or an
// error answers; replies to Bind, Describe and Close have types of their own
// and pass straight through.

type waitKind uint8

// Waits that carry no state are shared, so the common path allocates nothing.
var (
	readyWait   = &wait{kind: waitReady}
	queryWait   = &wait{kind: waitQuery}
	executeWait = &wait{kind: waitExecute}
	parseWait   = &wait{kind: waitParse}
)

const (
	waitReady   waitKind = iota // Sync, FunctionCall or startup: ends with ReadyForQuery
	waitQuery                   // simple Query: statements, then ReadyForQuery
	waitExecute                 // Execute: ends with CommandComplete, EmptyQueryResponse or PortalSuspended
	waitProbe                   // an injected probe: want replies (see probeState.inject), all kept from the client
	waitSwallow                 // messages the proxy sent on its own: want replies (ParseComplete, BindComplete, CloseComplete), kept from the client
	waitParse                   // Parse: ends with ParseComplete
	waitPass                    // want BindComplete and CloseComplete the client's, passed on (see pipeline.loose)
	waitSet                     // deferred settings the proxy sent (see applyState): want replies, kept from the client
)

// States of a serverStmt.
const (
	stmtAbsent  int32 = iota // not on the server (its Parse failed or was skipped, or it was deallocated)
	stmtPending              // its Parse is sent, not yet answered
	stmtReady                // the server has it
)

// serverStmt is a statement the proxy prepared on the session's backend.
type serverStmt struct {
	name   string
	params []byte       // the Parse's parameter-type section
	state  atomic.Int32 // written by the server side once Postgres answers
}

// unprepared marks a statement the server does not have, to be prepared
// again before its next Bind or Describe (prepared.again): its state is
// never anything but stmtAbsent.
var unprepared = new(serverStmt)

// parseMark is where the server side notes what became of the Parses of
// the unnamed statement the client side numbers (reuseState.unnamedSeq): the
// last answered with ParseComplete, and the last that failed or that
// Postgres skipped after an earlier error in its batch.
type parseMark struct {
	done, dropped atomic.Uint64
}

type wait struct {
	kind   waitKind
	probes []ProbeAt    // waitQuery: statements whose replies are probes
	stmt   int          // waitQuery: index of the statement now replying
	probe  *Probe       // waitProbe
	seen   int          // waitProbe, waitSwallow, waitPass: replies consumed
	want   int          // waitProbe, waitSwallow, waitPass: replies expected
	ready  *atomic.Bool // waitProbe that prepares: set once Postgres has the statement
	row    [][]byte     // probe row, once received
	reuse  *serverStmt  // waitParse, waitSwallow: preparing a statement the proxy reuses
	mark   *parseMark   // waitParse of the unnamed statement: where its fate is noted, as seq
	seq    uint64       // waitParse: see mark; waitSet: the deferred settings' number
	origin Origin       // waitQuery, waitParse, waitSwallow: maps error positions in a rewrite
	params []byte       // waitSwallow of a bound Query: the values bound, one after another
	ends   []int32      // where each ends in params
	// changes, on a waitQuery or waitReady, says the unit of work it ends
	// had a text that may change a setting (Plan.Forget).
	changes bool
	pooled  bool // made by pipeline.get: recycled once dropped
	// held, on a waitSet and the waitReady of the Sync the proxy sent
	// after it, says what the proxy sends after them is held back until
	// they are answered (see applyState.held).
	held bool
	// quiet, on a waitExecute, is the probe the proxy left out after it
	// (see Quiet), with the settings set ahead of the write and the notes
	// of its stale rows' notices.
	quiet *Probe
	set   []Setting
	notes []string
}

// position maps the position of an error in the text w answers for to
// the client's text; 0 leaves it out.
func (w *wait) position(c *Client, pos int32) int32 {
	switch {
	case w.origin != nil:
		return int32(w.origin.Position(c, int(pos), w.bound()))
	case w.kind == waitProbe:
		return 0 // the proxy's own statement: nowhere in the client's text
	}
	return pos
}

// bound returns the values w's statement was bound to.
func (w *wait) bound() []string {
	var params []string // made only for an error
	start := int32(0)
	for _, end := range w.ends {
		params = append(params, string(w.params[start:end]))
		start = end
	}
	return params
}

// dropped notes that w will get no reply: the server skipped its message.
func (w *wait) dropped() {
	if w.reuse != nil {
		w.reuse.state.Store(stmtAbsent)
	}
	if w.mark != nil {
		w.mark.dropped.Store(w.seq)
	}
}

type pipeline struct {
	mu sync.Mutex
	// single is set while the event loop relays the session: one goroutine
	// then does all the pushing and popping, and the pipeline takes no lock.
	single bool
	q      []*wait // q[h:] are the waits, oldest first
	h      int
	// skipping is set when the server reported an error in extended-protocol
	// work and no Sync was queued yet: the server discards every message up
	// to the next Sync, so waits pushed until then will get no reply.
	skipping bool
	// free are dropped waits of get's, for get to hand out again: one per
	// fenced statement would otherwise be allocated. Used only while
	// single, when nothing can hold a wait past its drop.
	free []*wait
	// loose counts the client's Binds and Closes sent since the last push:
	// their replies are not waited for, so one arriving while a waitSwallow
	// heads the queue would be taken for the proxy's own. A waitPass for
	// them goes first (see session.pushSwallow).
	loose int
	// drained, if not nil, is closed when the queue next empties (see
	// whenDrained); abandoned, once the session ended (atomic: a held
	// client side reads it off the event loop, see Client.takeHold).
	drained   chan struct{}
	abandoned atomic.Bool
}

// abandon releases whoever waits for the queue to empty: the session has
// ended, and no reply will come.
func (p *pipeline) abandon() {
	p.lock()
	defer p.unlock()
	p.abandoned.Store(true)
	if p.drained != nil {
		close(p.drained)
		p.drained = nil
	}
}

// ended reports whether the session has ended (see abandon).
func (p *pipeline) ended() bool { return p.abandoned.Load() }

// closedChan is a channel that is closed.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// whenDrained returns a channel closed once the server has answered every
// message now waiting for a reply (at once if none is), or the session
// ended (see abandon).
func (p *pipeline) whenDrained() <-chan struct{} {
	p.lock()
	defer p.unlock()
	if p.h == len(p.q) || p.abandoned.Load() {
		return closedChan
	}
	if p.drained == nil {
		p.drained = make(chan struct{})
	}
	return p.drained
}

// get returns a new wait of kind, for pushing once.
func (p *pipeline) get(kind waitKind) *wait {
	if n := len(p.free); n > 0 && p.single {
		w := p.free[n-1]
		p.free = p.free[:n-1]
		w.kind = kind
		return w
	}
	return &wait{kind: kind, pooled: true}
}

func (p *pipeline) lock() {
	if !p.single {
		p.mu.Lock()
	}
}

func (p *pipeline) unlock() {
	if !p.single {
		p.mu.Unlock()
	}
}

func (p *pipeline) push(w *wait) {
	p.lock()
	if p.skipping && w.kind != waitReady {
		p.unlock()
		w.dropped()
		return
	}
	p.skipping, p.loose = false, 0
	p.q = append(p.q, w)
	p.unlock()
}

// pushFront pushes w ahead of every wait.
func (p *pipeline) pushFront(w *wait) {
	p.lock()
	if p.h > 0 {
		p.h--
		p.q[p.h] = w
	} else {
		p.q = append(p.q, nil)
		copy(p.q[1:], p.q)
		p.q[0] = w
	}
	p.unlock()
}

// head is the oldest wait, nil if none. It is called for every server
// message, so it unlocks without a defer.
func (p *pipeline) head() *wait {
	p.lock()
	var w *wait
	if p.h < len(p.q) {
		w = p.q[p.h]
	}
	p.unlock()
	return w
}

func (p *pipeline) pop() {
	p.lock()
	if p.h < len(p.q) {
		p.drop()
	}
	p.unlock()
}

// maxKeptParams bounds the buffer for bound values a recycled wait keeps.
const maxKeptParams = 4 << 10

// drop removes the head. An emptied queue starts again at the front of its
// array, so a session's pushes stop allocating once it is big enough.
func (p *pipeline) drop() {
	w := p.q[p.h]
	p.q[p.h] = nil
	if p.h++; p.h == len(p.q) {
		p.q, p.h = p.q[:0], 0
		if p.drained != nil {
			close(p.drained)
			p.drained = nil
		}
	}
	if w.pooled && p.single {
		params := w.params[:0]
		if cap(params) > maxKeptParams {
			params = nil // not held by an idle session
		}
		*w = wait{pooled: true, params: params, ends: w.ends[:0], set: w.set[:0]}
		p.free = append(p.free, w)
	}
}

// skipToSync drops the waits the server will skip after an error in
// extended-protocol work.
func (p *pipeline) skipToSync() {
	p.lock()
	defer p.unlock()
	for p.h < len(p.q) && p.q[p.h].kind != waitReady {
		p.q[p.h].dropped()
		p.drop()
	}
	if p.h == len(p.q) {
		p.skipping = true
	}
}

// awaitsReady reports whether a ReadyForQuery is owed: a Sync or Query
// the server has not answered yet.
func (p *pipeline) awaitsReady() bool {
	p.lock()
	defer p.unlock()
	for _, w := range p.q[p.h:] {
		if w.kind == waitReady || w.kind == waitQuery {
			return true
		}
	}
	return false
}

// ready drops waits up to and including the one a ReadyForQuery answers,
// and reports whether that one's changes is set.
func (p *pipeline) ready() bool {
	p.lock()
	defer p.unlock()
	for p.h < len(p.q) {
		w := p.q[p.h]
		k, changes := w.kind, w.changes
		w.dropped() // unanswered, so the server skipped it
		p.drop()
		if k == waitReady || k == waitQuery {
			return changes
		}
	}
	return false
}

// parseWait returns the wait for the reply to a Parse of plan.SQL: the
// shared one unless it maps error positions.
func (p *pipeline) parseWait(plan Plan) *wait {
	if plan.Origin == nil {
		return parseWait
	}
	w := p.get(waitParse)
	w.origin = plan.Origin
	return w
}
