package proxy

import (
	"bytes"
	"encoding/binary"
	"log/slog"

	"github.com/jackc/pgx/v5/pgproto3"
)

// stmtBook is what the session knows of the client's prepared statements
// and portals, and of where the server's unnamed statement and portal are
// not what the client's view of the session says. The client side owns
// it; the server side only writes the state of the serverStmt records it
// points to, as Postgres answers.
//
// unnamedGone and portalGone each come with the proxy's last Close of what
// they say is gone (unnamedClosed, portalClosed): set anew, the flag comes
// with none, and one that Postgres confirmed clears the flag at its next
// use (see closeGone). A record means nothing while its flag is clear.
type stmtBook struct {
	stmts   map[string]*prepared // the client's prepared statements, by name
	portals map[string]*Probe    // portals bound to statements that need a probe per Execute
	// recent are the last texts parsed as the unnamed statement (see
	// recentUnnamed); recentNext is the oldest.
	recent     [4]*prepared
	recentNext int
	// unnamedGone is set by a bound Query: Postgres would have destroyed
	// the unnamed statement, but the server still has one (the client's
	// last, or the proxy's own). A Bind or Describe of it before the next
	// Parse closes it first, so that it fails as it would have.
	unnamedGone bool
	// portalGone is the same for the unnamed portal, which a bound Query
	// leaves open: an Execute or Describe of it before the next Bind of it
	// closes it first.
	portalGone bool
	// portalStale is set by a simple Query that goes to Postgres as one.
	// If the Query fails in a transaction block, Postgres keeps its
	// unnamed portal, failed, pointing at the Query's text and plan in
	// memory it frees at the next message, and an Execute of that portal
	// reads them: PostgreSQL 16.14, 17.10 and 18.4 crash on it, every
	// session with them (docs/relaying.md). The first Bind or Execute of
	// the unnamed portal after the Query settles the flag (settleStale):
	// where the block may have failed by the time Postgres reads it, the
	// portal is closed first, as portalGone closes a bound Query's.
	// Closing a failed portal reads neither.
	portalStale bool
	// unnamedClosed and portalClosed are the proxy's last Close for each,
	// which Postgres skips after an earlier error in its batch: the flag
	// stays until it confirms one.
	unnamedClosed, portalClosed *serverStmt
	// closeRecs are the records closeGone notes those Closes in, one for
	// each, reused while no reply is owed to the last.
	closeRecs [2]serverStmt
}

// prepared is what the proxy remembers of a prepared statement, so that it
// can be planned again after a configuration change.
type prepared struct {
	text   string // the client's SQL
	params []byte // the Parse's parameter-type section
	sent   string // the SQL sent in its place, "" for the client's own
	probe  *Probe // run after each Execute of a portal bound to it
	// setting, for a statement that is one SET the proxy may answer
	// itself, is what it sets (see setState).
	setting *Setting
	// parsed, for such a statement, is stmtReady while the client has it
	// as its Parse made it: Postgres answered that Parse (or the proxy
	// did, see session.parse) and no text since may have deallocated it.
	// Otherwise (nil, pending or absent) its Binds go to Postgres, to
	// fail there if it is gone.
	parsed *serverStmt
	gen    uint64 // the Interceptor generation it was planned under
	// token is the plan's NeedsToken (see Transaction pooling in the
	// package documentation).
	token bool
	// again is set while the statement must be prepared again before its
	// next Bind or Describe: the proxy's own statement the client's
	// unnamed one stood for was forgotten (see reuseState.forget), or replan
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
func (b *stmtBook) recentUnnamed(text, params []byte) *prepared {
	for _, st := range b.recent {
		if st.is(text, params) {
			return st
		}
	}
	st := &prepared{text: string(text), params: bytes.Clone(params)}
	b.recent[b.recentNext] = st
	b.recentNext = (b.recentNext + 1) % len(b.recent)
	return st
}

// record returns what the book remembers of the statement name the client
// parses now, text with params: the record it has if that is of the same
// text, else a new one, kept in the book. Drivers that use the unnamed
// statement parse the same few texts again and again: what is remembered
// of them is kept rather than allocated anew (see recentUnnamed).
func (b *stmtBook) record(name, text, params []byte) *prepared {
	st := b.stmts[string(name)]
	if !st.is(text, params) {
		if len(name) == 0 {
			st = b.recentUnnamed(text, params)
		} else {
			st = &prepared{text: string(text), params: bytes.Clone(params)}
		}
		if b.stmts == nil {
			b.stmts = make(map[string]*prepared)
		}
		b.stmts[string(name)] = st
	}
	return st
}

// planned notes the plan of the statement's Parse, made under generation
// gen.
func (st *prepared) planned(plan *Plan, gen uint64) {
	st.sent, st.probe, st.setting, st.gen, st.again = plan.SQL, plan.probe(), plan.Setting, gen, nil
	st.token = plan.NeedsToken
	if plan.Setting == nil {
		st.parsed = nil
	}
}

// answered notes that the proxy answered the statement's Parse itself, a
// SET of set planned under generation gen: the server's unnamed statement
// stays what it was, so the client's is prepared again before a Bind or
// Describe of it reaches the server (see replan); one answered again is
// not.
func (st *prepared) answered(set *Setting, gen uint64) {
	st.sent, st.probe, st.setting, st.gen = "", nil, set, gen
	st.parsed, st.again = answeredParse, unprepared
}

// onQuery notes a simple Query, which destroys the unnamed statement and
// portal; but in a failed block (mayHaveFailed says the block may have)
// Postgres refuses its statements before they replace the portal, so one
// a bound Query left stays (see portalGone; a Close of a portal that is
// not there is no error).
func (b *stmtBook) onQuery(mayHaveFailed bool) {
	delete(b.stmts, "")
	delete(b.portals, "")
	if !mayHaveFailed {
		b.portalGone = false
	}
	b.portalStale = true
}

// settleStale decides, at the first Bind or Execute of the unnamed
// portal since a simple Query (see portalStale), whether the
// portal Postgres has may be that Query's, failed: only if the block may
// have failed by the time Postgres reads what the client sends now (l
// says). Then it is gone for the client, and closed before it is used.
// In a block that has not failed there is no failed portal: one that
// failed within a savepoint went with the ROLLBACK TO that ended the
// failure.
func (b *stmtBook) settleStale(l *link) {
	if !b.portalStale {
		return
	}
	b.portalStale = false
	if l.blockMayHaveFailed() {
		b.portalGone, b.portalClosed = true, nil
	}
}

// onBoundQuery notes a Query the proxy runs bound (see Bound Queries in
// the package documentation): Postgres would have destroyed the unnamed
// statement and portal, but the server keeps its unnamed portal as the
// bound Query's, and its unnamed statement as it was. In a block known to
// have failed (failed) Postgres refuses the Parse, which leaves the
// unnamed portal as it was, as it would leave it for the Query.
func (b *stmtBook) onBoundQuery(failed bool) {
	b.unnamedGone, b.unnamedClosed = true, nil
	b.portalGone, b.portalClosed = !failed, nil
}

// probeOf returns the probe of the book's statement name, nil unless it
// is a fenced write.
func (b *stmtBook) probeOf(name []byte) *Probe {
	if st := b.stmts[string(name)]; st != nil {
		return st.probe
	}
	return nil
}

// onAnsweredQuery notes that the proxy answered a simple Query itself (a
// SET): the client's unnamed portal is gone, as the Query destroyed it.
func (b *stmtBook) onAnsweredQuery() {
	delete(b.portals, "")
}

// onParse notes that the Parse of st, named name, goes to the server
// (record made st): it is the client's statement of that name again,
// after a text whose forgetting (see forgetState) dropped the record of
// an unnamed statement whose last Parse failed; and an unnamed one is the
// client's, no longer gone.
func (b *stmtBook) onParse(name []byte, st *prepared) {
	b.stmts[string(name)] = st
	if len(name) == 0 {
		b.unnamedGone = false
	}
}

// onPooledTransaction notes that the session starts a transaction behind
// a transaction pooler, which may run it on another server connection,
// where the unnamed statement is another client's, or none: a Bind or
// Describe of it before the next Parse fails as it would on a server
// connection of the session's own (26000), rather than run another
// client's statement (red team 6a).
func (b *stmtBook) onPooledTransaction() {
	b.unnamedGone, b.unnamedClosed = true, nil
}

// onAnsweredParse notes that the proxy answered a Parse of the unnamed
// statement and the unit binding it: the client's unnamed statement is
// the answered one, and its unnamed portal gone.
func (b *stmtBook) onAnsweredParse() {
	b.unnamedGone, b.unnamedClosed = false, nil
	delete(b.portals, "")
}

// forgetParsed stops the session answering Binds of the client's SET
// statements until they are parsed again (see prepared.parsed): a text
// that may deallocate statements (DEALLOCATE, DISCARD) may have
// deallocated them, and a 26000 from the server says something was.
func (b *stmtBook) forgetParsed() {
	for _, st := range b.stmts {
		st.parsed = nil
	}
}

// tracking reports whether the book has anything a Bind, Describe or Close
// may concern; if not, they are forwarded undecoded.
func (b *stmtBook) tracking() bool {
	return len(b.stmts) > 0 || b.unnamedGone || b.portalGone || b.portalStale
}

// bind forwards through l the Bind m (n bytes in cr; ok says m was
// decoded whole, see decodeBind) as the statement it names stands for: a
// statement prepared for reuse (r), or one planned again first (see
// replan).
func (b *stmtBook) onBind(l *link, cr msgReader, r *reuseState, pl replanner, m bindMsg, ok bool, n int) error {
	if !b.tracking() {
		return forward(l.sw, cr, n)
	}
	portal, stmt := m.portal, m.stmt
	if len(portal) == 0 {
		b.settleStale(l)
	}
	if len(portal) == 0 && b.portalGone {
		// The Bind replaces the portal a bound Query left only if it
		// succeeds: close that first. After it the portal is the
		// client's, or there is none, unless Postgres skips the Close
		// (and so the Bind) after an earlier error in its batch: the flag
		// stays until it confirms the Close (see closeGone).
		if err := b.closeUnnamedPortal(l); err != nil {
			return err
		}
	}
	if !ok {
		// Names longer than peekLimit: Postgres limits names to 63 bytes, so
		// the server will refuse this Bind; nothing to track.
		return forward(l.sw, cr, n)
	}
	var p *Probe
	if len(stmt) == 0 {
		r.unnamedNow(b) // first: its Parse may have failed
	}
	if st := b.stmts[string(stmt)]; st != nil {
		if err := b.replan(l, r, pl, stmt, st); err != nil {
			return err
		}
		p = st.probe
	}
	if p != nil {
		if b.portals == nil {
			b.portals = make(map[string]*Probe)
		}
		b.portals[string(portal)] = p
	} else if len(b.portals) > 0 {
		delete(b.portals, string(portal))
	}
	if len(stmt) == 0 && r.unnamedNow(b) != nil {
		return r.bind(l, cr, portal, n)
	}
	if len(stmt) == 0 && b.unnamedGone {
		if err := b.closeUnnamed(l); err != nil {
			return err
		}
	}
	return forward(l.sw, cr, n)
}

// onDescribe forwards the Describe f, pointing one of the unnamed
// statement at the statement it stands for, closing it first if a bound
// Query destroyed it for the client (see stmtBook.unnamedGone), or
// preparing it again first if it must be (see replan). It is decoded once
// (see clientFrame) for this and the hold checks (replanText).
func (b *stmtBook) onDescribe(l *link, cr msgReader, r *reuseState, pl replanner, f *clientFrame) error {
	n := f.n
	if !b.tracking() || n != 2 { // 2: the unnamed statement or portal
		return forward(l.sw, cr, n)
	}
	m, ok, err := f.decodedDescribe(cr)
	if err != nil {
		return err
	}
	// A Describe of a failed Query's portal reads neither its text nor
	// its plan (see portalStale): it leaves the flag to a Bind or Execute.
	if ok && m.unnamed(targetPortal) && b.portalGone {
		if err := b.closeUnnamedPortal(l); err != nil {
			return err
		}
	}
	if !ok || !m.unnamed(targetStatement) {
		return forward(l.sw, cr, n)
	}
	r.unnamedNow(b) // first: its Parse may have failed
	if st := b.stmts[""]; st != nil {
		if err := b.replan(l, r, pl, nil, st); err != nil {
			return err
		}
	}
	if r.unnamedNow(b) == nil {
		if b.unnamedGone {
			if err := b.closeUnnamed(l); err != nil {
				return err
			}
		}
		return forward(l.sw, cr, n)
	}
	if _, err := cr.Discard(5 + n); err != nil {
		return err
	}
	l.out = append(append(append(l.out[:0], byte(targetStatement)), r.unnamed.name...), 0)
	return writeMessage(l.sw, clientMsgDescribe, l.out)
}

// execute forwards through l an Execute (n bytes in cr), and returns the
// probe of the portal it runs, if that has one, to run right after it:
// none when that is quiet, the probe the deferred settings set right ahead
// of it (set) were sent for with the quiet mark (see Quiet), whose Quiet
// then watches the write's replies.
func (b *stmtBook) onExecute(l *link, cr msgReader, n int, quiet *Probe, set []Setting) (p *Probe, err error) {
	if len(b.portals) > 0 || b.portalGone || b.portalStale {
		body, err := peekBody(cr, n)
		if err != nil {
			return nil, err
		}
		if m, ok := decodeExecute(body); ok {
			p = b.portals[string(m.portal)]
			if len(m.portal) == 0 {
				b.settleStale(l)
			}
			if len(m.portal) == 0 && b.portalGone {
				if err := b.closeUnnamedPortal(l); err != nil {
					return nil, err
				}
			}
		}
	}
	w := executeWait
	if ww := l.watch(p, quiet, set); ww != nil {
		w, p = ww, nil
	}
	l.pipe.push(w)
	return p, forward(l.sw, cr, n)
}

// close forwards through l a Close (n bytes in cr), forgetting what the
// book has of what it closes, and the statement prepared for reuse (r)
// the client's unnamed statement stood for.
func (b *stmtBook) onClose(l *link, cr msgReader, r *reuseState, n int) error {
	l.pipe.loose++
	if len(b.stmts) == 0 && len(b.portals) == 0 {
		return forward(l.sw, cr, n)
	}
	body, err := peekBody(cr, n)
	if err != nil {
		return err
	}
	// Only a Close that Postgres will carry out: after a malformed one the
	// server keeps the statement, and so must the book, or a later Bind of
	// it would go unplanned.
	if m, ok := decodeClose(body); ok && m.exact() {
		switch m.target {
		case targetStatement:
			delete(b.stmts, string(m.name))
			if len(m.name) == 0 && (r.unnamed != nil || r.unnamedSeq != 0) {
				// If Postgres skips this Close (after an error in its
				// batch), the client's unnamed statement stays, but the
				// server's may be the proxy's stand-in: fail a Bind of it
				// rather than run that.
				r.unnamedGone(b)
			}
		case targetPortal:
			delete(b.portals, string(m.name))
		}
	}
	return forward(l.sw, cr, n)
}

// Closes of the unnamed statement and portal.
var (
	closeUnnamedMessage       = []byte{byte(clientMsgClose), 0, 0, 0, 6, byte(targetStatement), 0}
	closeUnnamedPortalMessage = []byte{byte(clientMsgClose), 0, 0, 0, 6, byte(targetPortal), 0}
)

// closeUnnamed closes the server's unnamed statement, which the client's
// view of the session says a Query destroyed (see stmtBook.unnamedGone).
func (b *stmtBook) closeUnnamed(l *link) error {
	return closeGone(l, &b.unnamedGone, &b.unnamedClosed, &b.closeRecs[0], closeUnnamedMessage)
}

// closeUnnamedPortal does the same for the unnamed portal (see
// stmtBook.portalGone).
func (b *stmtBook) closeUnnamedPortal(l *link) error {
	return closeGone(l, &b.portalGone, &b.portalClosed, &b.closeRecs[1], closeUnnamedPortalMessage)
}

// closeGone sends through l the Close message m for what gone says is gone, noting
// it in rec (or a new record while a reply to the last is owed), unless
// Postgres confirmed the one sent last (closed), which clears gone, or has
// yet to answer it: that one is ahead of whatever the client sends now,
// and if Postgres skips it, it skips what follows in its batch too. (A
// second Close would close the portal a client's Bind after the first
// made.)
func closeGone(l *link, gone *bool, closed **serverStmt, rec *serverStmt, m []byte) error {
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
	return l.closeQuietly(m, c)
}

// replan plans a statement prepared under an older configuration again.
// If what should be sent for it changed (a table became guarded, say), the
// statement is re-prepared under its own name before the Bind, so a
// configuration change reaches statements prepared before it. So is one
// marked to be prepared again (prepared.again). stmt is the statement's
// name as the Bind holds it: made a string only here, off the path of
// every Bind. It is sent through l; the statement prepared for reuse (r)
// that the client's unnamed statement stood for is dropped.
func (b *stmtBook) replan(l *link, r *reuseState, pl replanner, stmt []byte, st *prepared) error {
	gen := pl.ic.Generation()
	redo := st.again != nil && st.again.state.Load() != stmtReady
	if !redo {
		st.again = nil
	}
	if st.gen == gen && !redo {
		return nil
	}
	name := string(stmt)
	if name != "" && l.failedNow() {
		// Postgres refuses the Bind (a statement to plan again is no
		// ROLLBACK), so prepare it at the next: a named Parse here can
		// crash Postgres (see blockMayHaveFailed).
		return nil
	}
	plan := pl.ic.Parse(pl.c, st.text)
	st.gen, st.probe, st.setting, st.token = gen, plan.probe(), plan.Setting, plan.NeedsToken
	if plan.SQL == st.sent && !redo {
		return nil
	}
	st.sent = plan.SQL
	if name == "" {
		r.unnamed = nil // it stood for the statement of the old rewrite
	}
	sql := plan.SQL
	if sql == "" {
		sql = st.text
	}
	pl.log.Debug("re-preparing a statement after a configuration or setting change", "statement", name)
	st.again = &serverStmt{name: name}
	st.again.state.Store(stmtPending)
	w := l.pipe.get(waitSwallow)
	w.want, w.origin, w.reuse = 2, plan.Origin, st.again
	l.pushSwallow(w)
	out, _ := (&pgproto3.Close{ObjectType: byte(targetStatement), Name: name}).Encode(l.out[:0])
	l.out = out
	if _, err := l.sw.Write(out); err != nil {
		return err
	}
	l.out = append(append(append(l.out[:0], byte(clientMsgParse), 0, 0, 0, 0), name...), 0)
	l.out = append(append(append(l.out, sql...), 0), st.params...)
	binary.BigEndian.PutUint32(l.out[1:5], uint32(len(l.out)-1))
	_, err := l.sw.Write(l.out)
	return err
}

// replanner is what replan plans a statement's text again with: the
// Interceptor, for the session's client, logging to log.
type replanner struct {
	ic  Interceptor
	c   *Client
	log *slog.Logger
}

// replanText returns the text of the prepared statement that the Bind or
// Describe f next in cr plans again before it is sent (see replan), under
// the Interceptor's generation gen, without reading it; ok is false when
// it plans none.
func (b *stmtBook) replanText(cr msgReader, f *clientFrame, gen uint64) (text string, ok bool) {
	if len(b.stmts) == 0 {
		return "", false
	}
	var name []byte
	switch f.typ {
	case clientMsgBind:
		m, ok, err := f.decodedBind(cr)
		if err != nil || !ok {
			return "", false
		}
		name = m.stmt
	case clientMsgDescribe:
		// Only a Describe of the unnamed statement plans it again.
		m, ok, err := f.decodedDescribe(cr)
		if err != nil || !ok || !m.exact() || !m.unnamed(targetStatement) {
			return "", false
		}
	}
	st := b.stmts[string(name)]
	if st == nil || st.gen == gen && (st.again == nil || st.again.state.Load() == stmtReady) {
		return "", false
	}
	return st.text, true
}

// peekBody returns up to peekLimit bytes of the body of the message next
// in cr, leaving it there.
func peekBody(cr msgReader, n int) ([]byte, error) {
	b, err := cr.Peek(5 + min(n, peekLimit))
	if err != nil {
		return nil, err
	}
	return b[5:], nil
}
