package proxy

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"sync/atomic"
)

// Drivers in the extended protocol without named statements (pgx's default,
// libpq's PQexecParams, pgbench -M extended) send the same Parse of the
// unnamed statement before every execution, and Postgres parses, analyses
// and plans the text each time. For a text the Interceptor rewrote (Plan.
// Reuse) that is pgfence's cost: the fenced text is several times the
// client's. So the session prepares the rewritten text once under a name of
// its own and answers later Parses of it with a Parse of a stand-in (see
// standInParse), whose ParseComplete the client takes for its own, and
// points the client's Binds and Describes of the unnamed statement at the
// prepared one.

// maxReused bounds the statements one session prepares for reuse (for the
// lifetime of the session, so that forgetting them cannot make the backend's
// memory grow without bound). Past it, texts are parsed as the client sends
// them.
const maxReused = 100

// reusePrefix starts the names of the statements the proxy prepares for
// reuse. Postgres takes any name; a client would have to pick this one on
// purpose. The rest is the session's tag (see names.go) and a number.
const reusePrefix = "pgfence.s."

// reusedName names the session's latest statement prepared for reuse.
func (s *session) reusedName() string {
	return reusePrefix + s.tag + "." + strconv.Itoa(s.reuses)
}

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

// standInParse is the body of the Parse of the unnamed statement that
// answers a client's Parse the proxy reuses a statement for. Postgres
// parses its text without a catalog lookup, and refuses it, as it would
// the client's, in a failed transaction block. It is never bound while the
// proxy knows what the server's unnamed statement is; should it be (a
// Parse Postgres skipped in a batch the client sent before Postgres
// answered the one before, see docs/relaying.md), it fails with 26000 saying what
// to do, rather than run as an empty statement, a write silently not done.
var standInParse = []byte("\x00EXECUTE \"pgfence: Parse the unnamed statement again\"\x00\x00\x00")

// parseMark is where the server side notes what became of the Parses of
// the unnamed statement the client side numbers (session.unnamedSeq): the
// last answered with ParseComplete, and the last that failed or that
// Postgres skipped after an earlier error in its batch.
type parseMark struct {
	done, dropped atomic.Uint64
}

// unnamedParseWait is the wait for a Parse of the unnamed statement whose
// rewrite plan gives: one that notes its fate while the session numbers
// such Parses.
func (s *session) unnamedParseWait(plan Plan) *wait {
	if s.unnamedSeq == 0 {
		return s.parseWaitFor(plan)
	}
	return s.numberedParseWait(plan)
}

// numberedParseWait is a wait of its own for the Parse numbered
// session.unnamedSeq.
func (s *session) numberedParseWait(plan Plan) *wait {
	w := s.pipe.get(waitParse)
	w.origin, w.mark, w.seq = plan.Origin, &s.parsed, s.unnamedSeq
	return w
}

// parseReused sends the Parse of the unnamed statement whose rewrite is
// sql, reusing this session's server-side statement of sql when it has one,
// else preparing one.
func (s *session) parseReused(plan Plan, params []byte) error {
	sql := plan.SQL
	ss := s.reused[sql]
	if ss != nil && !bytes.Equal(ss.params, params) {
		ss = nil // the same text with other parameter types: a new statement
	}
	switch {
	case ss != nil && ss.state.Load() == stmtReady:
		s.unnamed = ss
		s.pipe.push(s.unnamedParseWait(plan))
		return writeMessage(s.sw, 'P', standInParse)
	case ss != nil && ss.state.Load() == stmtPending:
		// Its Parse may yet fail: parse this one as sent.
		return s.parseAs("", sql, params, s.unnamedParseWait(plan))
	case s.blockMayHaveFailed():
		return s.parseAs("", sql, params, s.unnamedParseWait(plan))
	case ss != nil:
		// Its Parse failed or was skipped, so the name is free: try again.
	case s.reuses == maxReused:
		return s.parseAs("", sql, params, s.unnamedParseWait(plan))
	default:
		s.reuses++
		ss = &serverStmt{name: s.reusedName(), params: bytes.Clone(params)}
		if s.reused == nil {
			s.reused = make(map[string]*serverStmt)
		}
		s.reused[sql] = ss
	}
	ss.state.Store(stmtPending)
	// Postgres drops its unnamed statement before it parses the next one,
	// even one that fails; a Parse of ss.name leaves it, so close it.
	if err := s.closeQuietly(closeUnnamedMessage, nil); err != nil {
		return err
	}
	// Binds that follow reach the statement before anything else the
	// server runs, or are skipped with it if its Parse fails.
	s.unnamed = ss
	w := s.numberedParseWait(plan) // parse numbers every Parse reused for
	w.reuse = ss
	return s.parseAs(ss.name, sql, params, w)
}

// blockMayHaveFailed reports whether the transaction block may have
// failed by the time Postgres reads what the client sends now: the last
// ReadyForQuery said so, or the client is ahead of the replies. The proxy
// then sends no Parse of a name of its own: Postgres 15 (15.18 here)
// crashes, every session with it, on a named Parse refused in a block
// that an error such as DISCARD ALL's or a missing savepoint's failed,
// followed by an Execute of the unnamed portal that failed statement
// left, where the client's unnamed Parse in its place does not (see
// README).
func (s *session) blockMayHaveFailed() bool {
	return s.failed.Load() || s.pipe.awaitsReady()
}

// failedNow reports whether the transaction block is known to have failed
// when Postgres reads what the client sends now: the last ReadyForQuery
// said so, and the client sent nothing since that ends with another.
func (s *session) failedNow() bool {
	return s.failed.Load() && !s.pipe.awaitsReady()
}

// parseAs sends a Parse of sql named name, answered by w.
func (s *session) parseAs(name, sql string, params []byte, w *wait) error {
	s.pipe.push(w)
	s.out = append(append(s.out[:0], 'P', 0, 0, 0, 0), name...)
	s.out = append(append(append(s.out, 0), sql...), 0)
	s.out = append(s.out, params...)
	binary.BigEndian.PutUint32(s.out[1:5], uint32(len(s.out)-1))
	_, err := s.sw.Write(s.out)
	return err
}

// bindReused forwards the client's Bind of the unnamed statement to portal,
// whose body is n bytes, as a Bind of ss.
func (s *session) bindReused(ss *serverStmt, portal []byte, n int) error {
	prefix := len(portal) + 2
	s.out = append(append(s.out[:0], 'B', 0, 0, 0, 0), portal...)
	s.out = append(append(append(s.out, 0), ss.name...), 0)
	binary.BigEndian.PutUint32(s.out[1:5], uint32(4+n+len(ss.name)))
	if _, err := s.sw.Write(s.out); err != nil {
		return err
	}
	if _, err := s.cr.Discard(5 + prefix); err != nil {
		return err
	}
	return forwardBytes(s.sw, s.cr, n-prefix)
}

// describe forwards a Describe, pointing one of the unnamed statement at
// the statement it stands for, closing it first if a bound Query
// destroyed it for the client (see session.unnamedGone), or preparing it
// again first if it must be (see replan).
func (s *session) describe(n int) error {
	if len(s.stmts) == 0 && !s.unnamedGone && !s.portalGone || n != 2 {
		return forward(s.sw, s.cr, n)
	}
	b, err := s.peek(n)
	if err != nil {
		return err
	}
	if b[0] == 'P' && b[1] == 0 && s.portalGone {
		if err := s.closeUnnamedPortal(); err != nil {
			return err
		}
	}
	if b[0] != 'S' || b[1] != 0 {
		return forward(s.sw, s.cr, n)
	}
	s.reusedUnnamed() // first: its Parse may have failed
	if st := s.stmts[""]; st != nil {
		if err := s.replan(nil, st); err != nil {
			return err
		}
	}
	if s.reusedUnnamed() == nil {
		if s.unnamedGone {
			if err := s.closeUnnamed(); err != nil {
				return err
			}
		}
		return forward(s.sw, s.cr, n)
	}
	if _, err := s.cr.Discard(5 + n); err != nil {
		return err
	}
	s.out = append(append(append(s.out[:0], 'S'), s.unnamed.name...), 0)
	return writeMessage(s.sw, 'D', s.out)
}

// reusedUnnamed returns the statement the client's unnamed statement
// stands for (session.unnamed), nil when it is the server's own. One whose
// Parse failed stands for none: Postgres drops the unnamed statement before
// it parses the next, so the unnamed statement is then gone (see
// session.unnamedGone). A Parse skipped after an earlier error in its batch
// counts as failed too, where Postgres would still have the statement
// before it: a Bind of it then fails rather than runs what the client
// meant to replace, or the proxy's stand-in. So does any Parse of
// the unnamed statement that the session numbers (see session.unnamedSeq).
// What the session remembers of a gone statement is dropped with it, so
// it is not prepared again.
func (s *session) reusedUnnamed() *serverStmt {
	if s.unnamedSeq != 0 {
		switch s.unnamedSeq {
		case s.parsed.dropped.Load():
			s.unnamedGoneNow()
		case s.parsed.done.Load():
			s.unnamedSeq = 0
		}
	}
	if s.unnamed != nil && s.unnamed.state.Load() == stmtAbsent {
		s.unnamedGoneNow()
	}
	return s.unnamed
}

// unnamedGoneNow notes that the client's unnamed statement is gone: its
// last Parse failed or was skipped.
func (s *session) unnamedGoneNow() {
	s.unnamed, s.unnamedGone, s.unnamedSeq, s.unnamedClosed = nil, true, 0, nil
	delete(s.stmts, "")
}

// forgetReused drops what the session knows of its server-side statements,
// after a text that may have deallocated them or changed what they mean.
func (s *session) forgetReused() {
	if s.reusedUnnamed() != nil { // not one whose Parse failed
		// The client still has its unnamed statement (unless this is a
		// Query or a Parse of it, which drop this record).
		s.unnamed = nil
		if st := s.stmts[""]; st != nil {
			st.again = unprepared
		}
	}
	for _, ss := range s.reused {
		ss.state.Store(stmtAbsent)
	}
	clear(s.reused)
}

// A simple Query whose Plan has ParamTypes runs as a prepared statement:
// the proxy sends Parse (unless the session's backend has the statement),
// Bind, Execute, the probe and Sync in its place, and keeps ParseComplete
// and BindComplete from the client, which sees what its Query would get:
// CommandComplete (or an error) and ReadyForQuery. A simple Query runs in
// an implicit transaction that ends with it, as this one does at its Sync.

// syncMessage is a Sync.
var syncMessage = []byte{'S', 0, 0, 0, 4}

// queryBound sends a Query's Plan.SQL as a prepared statement bound to
// Plan.Params.
func (s *session) queryBound(plan Plan) error {
	// In a block known to have failed Postgres refuses the Parse, which
	// leaves the unnamed portal as it was, as it would leave it for the
	// Query.
	s.unnamedGone, s.portalGone = true, !s.failedNow()
	s.unnamedClosed, s.portalClosed = nil, nil
	ss := s.reused[plan.SQL]
	if ss != nil && !bytes.Equal(ss.params, plan.ParamTypes) {
		ss = nil
	}
	name := ""
	swallow := s.pipe.get(waitSwallow)
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
	case ss != nil && ss.state.Load() == stmtPending, ss == nil && s.reuses == maxReused, s.blockMayHaveFailed(), s.txPool():
		// Parse it unnamed: the pending Parse may yet fail, or the session
		// prepared all it may, or a named Parse might meet a failed block.
	default:
		if ss == nil {
			s.reuses++
			ss = &serverStmt{name: s.reusedName(), params: bytes.Clone(plan.ParamTypes)}
			if s.reused == nil {
				s.reused = make(map[string]*serverStmt)
			}
			s.reused[plan.SQL] = ss
		}
		ss.state.Store(stmtPending)
		name, swallow.reuse = ss.name, ss
	}
	if swallow.want == 2 {
		if err := s.parseAs(name, plan.SQL, plan.ParamTypes, swallow); err != nil {
			return err
		}
	} else {
		s.pipe.push(swallow)
	}
	// Bind the unnamed portal, all values in text, all results in text.
	s.out = append(append(s.out[:0], 'B', 0, 0, 0, 0, 0), name...)
	s.out = append(s.out, 0, 0, 0)
	s.out = binary.BigEndian.AppendUint16(s.out, uint16(len(plan.Params)))
	for _, v := range plan.Params {
		s.out = binary.BigEndian.AppendUint32(s.out, uint32(len(v)))
		s.out = append(s.out, v...)
	}
	s.out = append(s.out, 0, 0)
	binary.BigEndian.PutUint32(s.out[1:5], uint32(len(s.out)-1))
	s.out = append(s.out, 'E', 0, 0, 0, 9, 0, 0, 0, 0, 0) // Execute the unnamed portal, all rows
	if _, err := s.sw.Write(s.out); err != nil {
		return err
	}
	s.pipe.push(executeWait)
	if p := plan.probe(); p != nil {
		if err := s.injectProbe(p); err != nil {
			return err
		}
	}
	s.pipe.push(s.syncWait())
	_, err := s.sw.Write(syncMessage)
	return err
}
