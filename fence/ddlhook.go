package fence

import (
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// SetDDLHook has the policy read the catalog again after DDL seen in a
// session, before that session's next statement: read is called once the
// server has answered the DDL (from any goroutine; it must not block) and
// returns a channel closed once a read of the catalog that started after
// the call is done. A text that may create,
// rename, move, attach or inherit a table (sqlrewrite.ChangesTables)
// holds the session's next Query or Parse until then, unless the server's
// answer leaves the session in a transaction block, where no read could
// see the change yet (see committed); the first text that ends the
// transaction it ran in holds the next one too, after which the change is
// committed and visible to the read, and the proxy holds the first one
// after the Sync of an extended-protocol batch the hold came in (see
// Statement holds in package proxy). Other sessions are not held: a write
// of theirs that comes first finds a renamed, moved or attached table
// still fenced by the backstop, whose triggers go with it, and a new table
// empty.
func (p *Policy) SetDDLHook(read func() <-chan struct{}) { p.onDDL.Store(&read) }

// noteChange holds the session's next statement after a text that may
// change what later texts mean, until pgfence knows what they mean: after
// DDL, until the catalog is read again (see SetDDLHook); after a text
// that names a setting that changes how Postgres reads SQL
// (client_encoding, standard_conforming_strings), until the server has
// answered it and the proxy knows the new value (a write pipelined behind
// SET client_encoding would otherwise be judged in the old encoding; one
// behind a statement that changes it without naming it waits too, see
// DependsOnReading). A session that waits for each reply before it sends
// on never waits. It reports whether sql is such a text, which the
// session must not memoise as passed for good.
func (p *Policy) noteChange(c *proxy.Client, sess *session, cl sqlrewrite.Class) bool {
	if cl.Has(sqlrewrite.ChangesReading) {
		c.HoldNextStatement(nil)
		p.noteDDL(c, sess, cl)
		return true
	}
	return p.noteDDL(c, sess, cl)
}

// noteDDL holds the session's next statement as SetDDLHook says. It
// reports whether sql may change tables.
func (p *Policy) noteDDL(c *proxy.Client, sess *session, cl sqlrewrite.Class) bool {
	read := p.onDDL.Load()
	if read == nil {
		return false
	}
	switch {
	case cl.Has(sqlrewrite.ChangesTables) && cl.Has(sqlrewrite.EndsTx):
		// It may have committed its DDL, whatever block it leaves open
		// (BEGIN; ALTER ...; COMMIT; BEGIN): read, as committed cannot
		// tell (red team 8).
		sess.ddl = true
		c.HoldNextStatement(*read)
		return true
	case cl.Has(sqlrewrite.ChangesTables):
		sess.ddl = true
		c.HoldNextStatement(committed(c, *read))
		return true
	case sess.ddl && cl.Has(sqlrewrite.EndsTx):
		sess.ddl = false
		c.HoldNextStatement(*read)
	}
	return false
}

// committed is read for a hold after a text with DDL that ends no
// transaction, which may still be in a transaction block when the hold
// starts (after the server answered it):
// no catalog read can see uncommitted DDL, so there it reads nothing and
// holds for nothing, and the hold of the text that ends the block reads
// instead. Behind a transaction pooler such a read waited for a server
// connection of the pool the client's own open block held: with every
// one taken, the client's next statement waited out the read's timeout
// three times (30 s each); and a migration's every DDL in one block
// waited for a read of the whole catalog.
func committed(c *proxy.Client, read func() <-chan struct{}) func() <-chan struct{} {
	return func() <-chan struct{} {
		if c.InTransactionBlock() {
			return closedChan
		}
		return read()
	}
}

// closedChan is a channel closed from the start.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()
