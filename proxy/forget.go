package proxy

import "sync/atomic"

// forgetState follows what may have deallocated the proxy's own prepared
// statements (its probes' statements, setStmt, those prepared for reuse)
// or changed what they stand for, so that the session prepares them again
// before their next use (see Plan.Forget).
//
// changing is the client side's, reverting the server side's. lost, set by
// the server side and taken by the client side, is what passes between
// them: once set, the client side forgets the statements at the next text
// it plans (see forgetStatements), and until then prepares a probe's
// statement or setStmt again wherever it uses one.
type forgetState struct {
	// lost is set when the proxy's own prepared statements may be gone or
	// stand for other tables: the server said a prepared statement does
	// not exist (26000), so they may have been deallocated where the proxy
	// cannot see (by a function, say), or a setting changed in a
	// transaction block changed back as it ended (see settled).
	lost atomic.Bool
	// changing is set by a text whose Plan says Forget, until the wait for
	// the next ReadyForQuery carries it (see wait.changes).
	changing bool
	// reverting is set while a setting a text changed inside a
	// transaction block may change back when the block ends.
	reverting bool
}

// lostNow reports, once, that the proxy's statements may have been lost
// since the last call (see lost).
func (f *forgetState) lostNow() bool {
	return f.lost.Load() && f.lost.Swap(false) // a load is cheaper than a swap on every message
}

// settled follows a setting that a text may have changed (Plan.Forget) to
// where the change ends. Changed inside a transaction block (SET LOCAL, or
// any SET the block rolls back), it changes back as the block ends, after
// the proxy prepared its statements again for the changed one: they must be
// prepared again then too. changed says the unit of work that a
// ReadyForQuery ends had such a text, status is the transaction status
// that ReadyForQuery gives.
func (f *forgetState) settled(changed bool, status txStatus) {
	switch {
	case status != txIdle:
		f.reverting = true
	case changed || f.reverting:
		// A block ended, or may have ended inside the unit itself
		// (BEGIN; SET LOCAL ...; COMMIT). After a change outside any block
		// this prepares again only what the unit prepared after it.
		f.reverting = false
		f.lost.Store(true)
	}
}

// syncWait returns the wait for the ReadyForQuery that a Sync (or a
// FunctionCall) ends with: marked when a Parse since the last one may have
// changed a setting.
func (s *session) syncWait() *wait {
	if !s.forget.changing {
		return readyWait
	}
	s.forget.changing = false
	w := s.pipe.get(waitReady)
	w.changes = true
	return w
}

// forgetStatements has every probe, setStmt and statement prepared for
// reuse prepared again before its next use, and stops the session
// answering Binds of the client's SET statements until they are parsed
// again.
func (s *session) forgetStatements() {
	s.probes.forget()
	s.apply.ready = false
	s.forgetReused()
	s.book.forgetParsed()
}
