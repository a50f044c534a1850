package proxy

import (
	"bytes"
	"encoding/binary"
	"strconv"
)

// reuseState is the statements the session prepared for reuse (see
// Statement reuse in the package documentation), and what the client's
// unnamed statement stands for. The client side owns it, but for parsed
// and the state of each serverStmt, which the server side writes as
// Postgres answers.
//
// unnamed, when not nil, is one of bySQL, and the client's Binds and
// Describes of its unnamed statement go to it; nil, they go to the
// server's own unnamed statement. unnamedSeq is not 0 while the server's
// unnamed statement may be the proxy's stand-in (see standInParse) rather
// than what the client parsed last, until parsed says what became of the
// Parse it numbers (see unnamedNow). Both are cleared together whenever
// the client's unnamed statement is destroyed (see dropUnnamed).
type reuseState struct {
	// bySQL are the statements prepared for reuse, by the SQL they hold;
	// count is how many the session prepared, at most maxReused.
	bySQL map[string]*serverStmt
	count int
	// unnamed is the statement the client's unnamed statement now stands
	// for, nil when the server's own unnamed statement is the client's.
	unnamed *serverStmt
	// unnamedSeq numbers the last Parse of the unnamed statement while the
	// server's unnamed statement may be the proxy's (its stand-in, see
	// standInParse): from a Parse the proxy reuses for, or any after one,
	// until Postgres answers it (parsed, see reusedUnnamed). 0 when not
	// numbered; parses counts them.
	unnamedSeq uint64
	parses     uint64
	// parsed is written by the server side, read by the client side.
	parsed parseMark
	// standIn is the body of the stand-in Parse (see standInParse); nil,
	// no Parse of the unnamed statement is reused for.
	standIn []byte
}

// lookup returns the statement prepared for reuse for sql with the
// parameter types params, nil if there is none.
func (r *reuseState) lookup(sql string, params []byte) *serverStmt {
	ss := r.bySQL[sql]
	if ss != nil && !bytes.Equal(ss.params, params) {
		return nil // the same text with other parameter types: a new statement
	}
	return ss
}

// full reports whether the session has prepared all the statements it may
// for reuse.
func (r *reuseState) full() bool { return r.count == maxReused }

// add makes a new statement for sql with params, named for the session
// tagged tag, in place of any other of sql.
func (r *reuseState) add(tag, sql string, params []byte) *serverStmt {
	r.count++
	ss := &serverStmt{name: reusePrefix + tag + "." + strconv.Itoa(r.count), params: bytes.Clone(params)}
	if r.bySQL == nil {
		r.bySQL = make(map[string]*serverStmt)
	}
	r.bySQL[sql] = ss
	return ss
}

// parseUnnamed notes a Parse of the unnamed statement, reuse says one the
// proxy reuses a statement for: it numbers it, if the server's unnamed
// statement may be the proxy's after it, and the client's unnamed
// statement stands for none of the proxy's until it is answered.
func (r *reuseState) parseUnnamed(reuse bool) {
	if reuse || r.unnamed != nil || r.unnamedSeq != 0 {
		r.parses++
		r.unnamedSeq = r.parses
	}
	r.unnamed = nil
}

// onQuery notes a simple Query, which destroys the client's unnamed
// statement.
func (r *reuseState) onQuery() { r.dropUnnamed() }

// onAnsweredParse notes that the proxy answered a Parse of the unnamed
// statement itself: the client's stands for none of the proxy's.
func (r *reuseState) onAnsweredParse() { r.dropUnnamed() }

// onParse notes a Parse of the unnamed statement planned as plan, and
// reports whether the proxy reuses a statement for it (see reusable; failed
// and pooled as there), answered by parseReused.
func (r *reuseState) onParse(plan *Plan, failed, pooled bool) (reuse bool) {
	reuse = r.reusable(plan, failed, pooled)
	r.parseUnnamed(reuse)
	return reuse
}

// start sets what the part keeps of the configuration: the stand-in a
// reused statement's Parse is answered with (see standInParse).
func (r *reuseState) start(standIn []byte) { r.standIn = standIn }

// dropUnnamed notes that the client's unnamed statement was destroyed (or
// replaced by one the proxy answered): it stands for none of the proxy's,
// and no Parse of it is numbered.
func (r *reuseState) dropUnnamed() {
	r.unnamed, r.unnamedSeq = nil, 0
}

// dropAll forgets every statement prepared for reuse, which the server may
// no longer have or which may stand for other tables.
func (r *reuseState) dropAll() {
	for _, ss := range r.bySQL {
		ss.state.Store(stmtAbsent)
	}
	clear(r.bySQL)
}

// maxReused bounds the statements one session prepares for reuse (for the
// lifetime of the session, so that forgetting them cannot make the backend's
// memory grow without bound). Past it, texts are parsed as the client sends
// them.
const maxReused = 100

// reusePrefix starts the names of the statements the proxy prepares for
// reuse. Postgres takes any name; a client would have to pick this one on
// purpose. The rest is the session's tag (see Statement names in the
// package documentation) and a number.
const reusePrefix = "pgfence.s."

// standInParse returns the body of the Parse of the unnamed statement, of
// sql (Config.StandInSQL), that answers a client's Parse the proxy reuses
// a statement for, nil for no sql. It is never bound while the proxy knows
// what the server's unnamed statement is; should it be (a Parse Postgres
// skipped in a batch the client sent before Postgres answered the one
// before, see docs/relaying.md), the text the Interceptor's package gives
// fails saying what to do, rather than run as an empty statement, a write
// silently not done.
func standInParse(sql string) []byte {
	if sql == "" {
		return nil
	}
	return append(append([]byte{0}, sql...), 0, 0, 0)
}

// parseWait is the wait for a Parse of the unnamed statement whose
// rewrite plan gives: one that notes its fate while the session numbers
// such Parses.
func (r *reuseState) parseWait(p *pipeline, plan Plan) *wait {
	if r.unnamedSeq == 0 {
		return p.parseWait(plan)
	}
	return r.numberedParseWait(p, plan)
}

// numberedParseWait is a wait of its own for the Parse numbered
// unnamedSeq.
func (r *reuseState) numberedParseWait(p *pipeline, plan Plan) *wait {
	w := p.get(waitParse)
	w.origin, w.mark, w.seq = plan.Origin, &r.parsed, r.unnamedSeq
	return w
}

// parseReused sends through l the Parse of the unnamed statement whose
// rewrite is sql, reusing this session's server-side statement of sql
// when it has one, else preparing one named for the session tagged tag.
func (r *reuseState) parseReused(l *link, tag string, plan Plan, params []byte) error {
	sql := plan.SQL
	ss := r.lookup(sql, params)
	switch {
	case ss != nil && ss.state.Load() == stmtReady:
		r.unnamed = ss
		l.pipe.push(r.parseWait(&l.pipe, plan))
		return writeMessage(l.sw, clientMsgParse, r.standIn)
	case ss != nil && ss.state.Load() == stmtPending:
		// Its Parse may yet fail: parse this one as sent.
		return l.parseAs("", sql, params, r.parseWait(&l.pipe, plan))
	case l.blockMayHaveFailed():
		return l.parseAs("", sql, params, r.parseWait(&l.pipe, plan))
	case ss != nil:
		// Its Parse failed or was skipped, so the name is free: try again.
	case r.full():
		return l.parseAs("", sql, params, r.parseWait(&l.pipe, plan))
	default:
		ss = r.add(tag, sql, params)
	}
	ss.state.Store(stmtPending)
	// Postgres drops its unnamed statement before it parses the next one,
	// even one that fails; a Parse of ss.name leaves it, so close it.
	if err := l.closeQuietly(closeUnnamedMessage, nil); err != nil {
		return err
	}
	// Binds that follow reach the statement before anything else the
	// server runs, or are skipped with it if its Parse fails.
	r.unnamed = ss
	w := r.numberedParseWait(&l.pipe, plan) // parseUnnamed numbers every Parse reused for
	w.reuse = ss
	return l.parseAs(ss.name, sql, params, w)
}

// bind forwards through l the client's Bind of the unnamed statement to
// portal, whose body is n bytes in cr, as a Bind of the statement it
// stands for (unnamed, not nil).
func (r *reuseState) bind(l *link, cr msgReader, portal []byte, n int) error {
	ss := r.unnamed
	prefix := len(portal) + 2
	l.out = append(append(l.out[:0], byte(clientMsgBind), 0, 0, 0, 0), portal...)
	l.out = append(append(append(l.out, 0), ss.name...), 0)
	binary.BigEndian.PutUint32(l.out[1:5], uint32(4+n+len(ss.name)))
	if _, err := l.sw.Write(l.out); err != nil {
		return err
	}
	if _, err := cr.Discard(5 + prefix); err != nil {
		return err
	}
	return forwardBytes(l.sw, cr, n-prefix)
}

// unnamedNow returns the statement the client's unnamed statement stands
// for (unnamed), nil when it is the server's own. One whose Parse failed
// stands for none: Postgres drops the unnamed statement before it parses
// the next, so the unnamed statement is then gone (see
// stmtBook.unnamedGone). A Parse skipped after an earlier error in its
// batch counts as failed too, where Postgres would still have the
// statement before it: a Bind of it then fails rather than runs what the
// client meant to replace, or the proxy's stand-in. So does any Parse of
// the unnamed statement that the session numbers (see unnamedSeq). What
// the book remembers of a gone statement is dropped with it, so it is not
// prepared again.
func (r *reuseState) unnamedNow(b *stmtBook) *serverStmt {
	if r.unnamedSeq != 0 {
		switch r.unnamedSeq {
		case r.parsed.dropped.Load():
			r.unnamedGone(b)
		case r.parsed.done.Load():
			r.unnamedSeq = 0
		}
	}
	if r.unnamed != nil && r.unnamed.state.Load() == stmtAbsent {
		r.unnamedGone(b)
	}
	return r.unnamed
}

// unnamedGone notes that the client's unnamed statement is gone (its
// last Parse failed or was skipped, the client closed it, or the proxy
// answered a Query that destroyed it) where the server may still have
// one: a Bind or Describe of it closes that first (see
// stmtBook.unnamedGone).
func (r *reuseState) unnamedGone(b *stmtBook) {
	r.dropUnnamed()
	b.unnamedGone, b.unnamedClosed = true, nil
	delete(b.stmts, "")
}

// forget drops what the session knows of its server-side statements,
// after a text that may have deallocated them or changed what they mean;
// a client's unnamed statement that stood for one is marked in b to be
// prepared again.
func (r *reuseState) forget(b *stmtBook) {
	if r.unnamedNow(b) != nil { // not one whose Parse failed
		// The client still has its unnamed statement (unless this is a
		// Query or a Parse of it, which drop this record).
		r.unnamed = nil
		if st := b.stmts[""]; st != nil {
			st.again = unprepared
		}
	}
	r.dropAll()
}

// Bound Queries: see the package documentation.

// sendBound sends through l a Query's plan.SQL as a prepared statement
// bound to plan.Params, up to its Execute: Parse (unless the backend has
// the statement this session prepared of it, or prepares one named for
// the session tagged tag), Bind and Execute. pooled says a transaction
// pooler is behind the proxy, where no statement outlives a transaction.
func (r *reuseState) sendBound(l *link, tag string, plan *Plan, pooled bool, exec *wait) error {
	ss := r.lookup(plan.SQL, plan.ParamTypes)
	name := ""
	swallow := l.pipe.get(waitSwallow)
	swallow.want = 2 // ParseComplete, BindComplete
	swallow.origin = plan.Origin
	for _, v := range plan.Params {
		// Kept for an error reading them (see serverError); copied, for
		// they may share the read buffer.
		swallow.params = append(swallow.params, v...)
		swallow.ends = append(swallow.ends, int32(len(swallow.params)))
	}
	switch {
	case ss != nil && ss.state.Load() == stmtReady:
		name, swallow.want = ss.name, 1
	case ss != nil && ss.state.Load() == stmtPending, ss == nil && r.full(), l.blockMayHaveFailed(), pooled:
		// Parse it unnamed: the pending Parse may yet fail, or the session
		// prepared all it may, or a named Parse might meet a failed block.
	default:
		if ss == nil {
			ss = r.add(tag, plan.SQL, plan.ParamTypes)
		}
		ss.state.Store(stmtPending)
		name, swallow.reuse = ss.name, ss
	}
	if swallow.want == 2 {
		if err := l.parseAs(name, plan.SQL, plan.ParamTypes, swallow); err != nil {
			return err
		}
	} else {
		l.pipe.push(swallow)
	}
	// Bind the unnamed portal, all values in text, all results in text.
	l.out = append(append(l.out[:0], byte(clientMsgBind), 0, 0, 0, 0, 0), name...)
	l.out = append(l.out, 0, 0, 0)
	l.out = binary.BigEndian.AppendUint16(l.out, uint16(len(plan.Params)))
	for _, v := range plan.Params {
		l.out = binary.BigEndian.AppendUint32(l.out, uint32(len(v)))
		l.out = append(l.out, v...)
	}
	l.out = append(l.out, 0, 0)
	binary.BigEndian.PutUint32(l.out[1:5], uint32(len(l.out)-1))
	l.out = append(l.out, byte(clientMsgExecute), 0, 0, 0, 9, 0, 0, 0, 0, 0) // Execute the unnamed portal, all rows
	if _, err := l.sw.Write(l.out); err != nil {
		return err
	}
	l.pipe.push(exec)
	return nil
}

// reusable reports whether a Parse of the unnamed statement planned as
// plan may be answered with a statement prepared for reuse: the plan
// allows it, and there is a stand-in to answer it with; not in a failed
// transaction block (failed), where Postgres refuses the Parse and the
// stand-in, so the text itself is sent, to be refused; nor behind a
// transaction pooler (pooled), where no statement outlives a transaction.
func (r *reuseState) reusable(plan *Plan, failed, pooled bool) bool {
	return plan.Reuse && plan.SQL != "" && !plan.Forget && !failed && !pooled && r.standIn != nil
}
