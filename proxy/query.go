package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"
)

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
	apply := s.apply.takeAfterPlan()
	if plan.Setting != nil && s.mayAnswer(plan.Setting) {
		// As for a bound Query, the server keeps the unnamed statement the
		// client's view of the session says the Query destroyed, and in a
		// block the unnamed portal too. (An idle session has none: its
		// transaction ended.)
		delete(s.book.portals, "")
		s.reuse.unnamedGone(&s.book)
		return s.answerQuery(plan.Setting)
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
			s.sets.pooledQuery(s.pooledSet(), &plan, text)
		}
	}
	if s.forget.onText(plan.Forget) {
		s.forgetStatements()
	}
	// A simple Query destroys the unnamed statement and portal; but in a
	// failed block Postgres refuses its statements before they replace
	// the portal, so one a bound Query left stays (see portalGone; a
	// Close of a portal that is not there is no error).
	delete(s.book.stmts, "")
	delete(s.book.portals, "")
	s.reuse.dropUnnamed()
	if !s.blockMayHaveFailed() {
		s.book.portalGone = false
	}
	s.forget.sent(plan.Forget)
	if plan.ParamTypes != nil {
		return s.queryBound(plan)
	}
	if changes := s.forget.takeChanging(); len(plan.Probes) > 0 || plan.SQL != "" && plan.Origin != nil || changes {
		w := s.pipe.get(waitQuery)
		w.probes, w.origin, w.changes = plan.Probes, plan.Origin, changes
		s.pipe.push(w)
	} else {
		s.pipe.push(queryWait)
	}
	if plan.SQL == "" {
		_, err := s.sw.Write(m)
		return err
	}
	s.out = append(append(s.out[:0], plan.SQL...), 0)
	return writeMessage(s.sw, clientMsgQuery, s.out)
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
	st := s.book.stmts[string(name)]
	if !st.is(text, params) {
		if len(name) == 0 {
			st = s.book.recentUnnamed(text, params)
		} else {
			st = &prepared{text: string(text), params: bytes.Clone(params)}
		}
		if s.book.stmts == nil {
			s.book.stmts = make(map[string]*prepared)
		}
		s.book.stmts[string(name)] = st
	}
	plan := ic.Parse(s.c, st.text)
	if len(name) == 0 && plan.Setting != nil && s.sets.quiet() {
		if ok, err := s.answerParse(st, plan.Setting, gen); ok || err != nil {
			s.apply.afterPlan = false // the settings stay deferred, this one with them
			return err
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
	if s.forget.onText(plan.Forget) {
		s.forgetStatements()
		// which drops the record of an unnamed statement whose last Parse
		// failed: not this one's.
		s.book.stmts[string(name)] = st
	}
	s.forget.sent(plan.Forget)
	st.sent, st.probe, st.setting, st.gen, st.again = plan.SQL, plan.probe(), plan.Setting, gen, nil
	st.token = plan.NeedsToken
	if plan.Setting == nil {
		st.parsed = nil
	}
	w := parseWait
	if len(name) == 0 {
		// In a failed transaction block Postgres refuses the Parse (and
		// the stand-in): send the text itself, to be refused.
		reuse := plan.Reuse && plan.SQL != "" && !plan.Forget && !s.failed.Load() && !s.txPool() && s.reuse.standIn != nil
		s.reuse.parseUnnamed(reuse)
		s.book.unnamedGone = false
		if reuse {
			return s.reuse.parseReused(&s.link, s.tag, plan, params)
		}
		w = s.reuse.parseWait(&s.pipe, plan)
	} else if plan.SQL != "" {
		w = s.pipe.parseWait(plan)
	}
	if plan.Setting != nil {
		w = s.trackParsed(st, w)
		s.sets.haveStmts = true
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
	return writeMessage(s.sw, clientMsgParse, s.out)
}

// Bound Queries: see the package documentation.

// syncMessage is a Sync.
var syncMessage = []byte{byte(clientMsgSync), 0, 0, 0, 4}

// queryBound sends a Query's Plan.SQL as a prepared statement bound to
// Plan.Params.
func (s *session) queryBound(plan Plan) error {
	// In a block known to have failed Postgres refuses the Parse, which
	// leaves the unnamed portal as it was, as it would leave it for the
	// Query.
	s.book.unnamedGone, s.book.unnamedClosed = true, nil
	s.book.portalGone, s.book.portalClosed = !s.failedNow(), nil
	ss := s.reuse.lookup(plan.SQL, plan.ParamTypes)
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
	case ss != nil && ss.state.Load() == stmtPending, ss == nil && s.reuse.full(), s.blockMayHaveFailed(), s.txPool():
		// Parse it unnamed: the pending Parse may yet fail, or the session
		// prepared all it may, or a named Parse might meet a failed block.
	default:
		if ss == nil {
			ss = s.reuse.add(s.tag, plan.SQL, plan.ParamTypes)
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
	s.out = append(append(s.out[:0], byte(clientMsgBind), 0, 0, 0, 0, 0), name...)
	s.out = append(s.out, 0, 0, 0)
	s.out = binary.BigEndian.AppendUint16(s.out, uint16(len(plan.Params)))
	for _, v := range plan.Params {
		s.out = binary.BigEndian.AppendUint32(s.out, uint32(len(v)))
		s.out = append(s.out, v...)
	}
	s.out = append(s.out, 0, 0)
	binary.BigEndian.PutUint32(s.out[1:5], uint32(len(s.out)-1))
	s.out = append(s.out, byte(clientMsgExecute), 0, 0, 0, 9, 0, 0, 0, 0, 0) // Execute the unnamed portal, all rows
	if _, err := s.sw.Write(s.out); err != nil {
		return err
	}
	s.pipe.push(executeWait)
	if p := plan.probe(); p != nil {
		if err := s.injectProbe(p); err != nil {
			return err
		}
	}
	s.pipe.push(s.forget.syncWait(&s.pipe))
	_, err := s.sw.Write(syncMessage)
	return err
}
