package fence

import (
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// SetDDLHook has the policy read the catalog again after DDL seen in a
// session, before that session's next statement: read is called (from the
// relay, so it must not block) and returns a channel closed once a read of
// the catalog that started after the call is done. A text that may create,
// rename, move, attach or inherit a table (sqlrewrite.MayChangeTables)
// holds the session's next Query or Parse until then; so does the first
// text that ends the transaction it ran in, after which the change is
// committed and visible to the read. Other sessions are not held: a write
// of theirs that comes first finds a renamed, moved or attached table
// still fenced by the backstop, whose triggers go with it, and a new table
// empty.
func (p *Policy) SetDDLHook(read func() <-chan struct{}) { p.onDDL.Store(&read) }

// noteDDL holds the session's next statement as SetDDLHook says. It
// reports whether sql may change tables, in which case the session must
// not memoise it as a text passed for good.
func (p *Policy) noteDDL(c *proxy.Client, sess *session, sql string) bool {
	read := p.onDDL.Load()
	if read == nil {
		return false
	}
	switch {
	case sqlrewrite.MayChangeTables(sql):
		sess.ddl = true
		c.HoldNextStatement(*read)
		return true
	case sess.ddl && sqlrewrite.EndsTransaction(sql):
		sess.ddl = false
		c.HoldNextStatement(*read)
	}
	return false
}
