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

// onServerError notes an error from the server, of SQLSTATE code: one
// that says a prepared statement does not exist means the proxy's may be
// gone too (see lost).
func (f *forgetState) onServerError(code string) {
	if code == codeUndefinedStatement {
		f.lost.Store(true)
	}
}

// onReady notes a ReadyForQuery with status (0: unknown), which ends a
// unit of work that had a text that may have changed a setting if changed
// says so (see settled).
func (f *forgetState) onReady(changed bool, status txStatus) {
	if (changed || f.reverting) && status != 0 {
		f.settled(changed, status)
	}
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

// onPlan notes a Query or Parse planned with forget (Plan.Forget), on its
// way to the server, and reports whether the session's parts are to
// forget their statements before it goes: it says so, or something since
// the last text may have deallocated them (see lost). The wait for the
// ReadyForQuery that ends its unit of work carries it (see takeChanging).
func (f *forgetState) onPlan(forget bool) (forgetNow bool) {
	if forget {
		f.changing = true
		return true
	}
	return f.lostNow()
}

// takeChanging reports, once, whether a text since the last wait that
// ended a unit of work may have changed a setting (see wait.changes).
func (f *forgetState) takeChanging() bool {
	c := f.changing
	f.changing = false
	return c
}

// syncWait returns the wait for the ReadyForQuery that a Sync (or a
// FunctionCall) ends with, from p: marked when a Parse since the last one
// may have changed a setting.
func (f *forgetState) syncWait(p *pipeline) *wait {
	if !f.takeChanging() {
		return readyWait
	}
	w := p.get(waitReady)
	w.changes = true
	return w
}
