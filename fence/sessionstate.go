package fence

import (
	"strings"
	"sync/atomic"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// session is pgfence's state for one client session: the SQL-level prepared
// statements that write guarded tables, so EXECUTE of one gets its probe.
// Only the client-to-server relay touches it.
type session struct {
	// policy is the Policy that started the session: the one of its
	// database (see Databases).
	policy   *Policy
	prepared map[string][]string
	// changed is set by a text that may have changed a setting, until a
	// text that ends a transaction.
	changed bool
	// last is the last text the policy passed untouched under lastState
	// for reasons that hold while it is in force and the session has no
	// SQL-level prepared writes (see passes): drivers send the same few
	// texts again and again.
	last      []byte
	lastState *state
	// lastSet are the last token settings planned (see setting), SET and
	// SET LOCAL; the proxy keeps them and never changes them.
	lastSet [2]*proxy.Setting
	// ddl is set by a text that may have changed which tables exist or
	// what they are called, until a text that ends a transaction (see
	// noteDDL).
	ddl bool
	// bind plans a simple-protocol write's templates (see binder).
	bind binder
	// noticed is the statement time of the last backstop notice counted,
	// by table and kind, and forgedNotice says one that was not the
	// backstop's was met (see Notice); the server side's only.
	noticed      map[string]int64
	forgedNotice bool
	// probeNext is set when a write that went without its probe left a
	// stale row alone, until a probed write leaves none (see quiet.go).
	// Read by the client side, written by the server side: both on the
	// event loop, the only relay that answers SETs, but atomic all the
	// same.
	probeNext atomic.Bool
	// serverSeries are the series of events the server side resolved
	// (see Policy.counter), clientSeries the client side's.
	serverSeries, clientSeries seriesCache
}

// passes reports whether sql is the text last passed untouched, under the
// configuration st, for reasons that still hold: it names no guarded table
// or is an ASCII text that spells no write keyword (see readOnly), sets no
// token, and neither invalidates prepared statements nor ends a
// transaction (so it changes nothing in the session either).
func (s *session) passes(st *state, sql string) bool {
	return s.lastState == st && len(s.prepared) == 0 && !s.ddl && string(s.last) == sql
}

// passed notes sql, which the policy passes untouched under st because no
// guarded table may be in it and it invalidates nothing, for passes.
func (s *session) passed(st *state, sql string, cl sqlrewrite.Class) {
	if len(s.prepared) > 0 || len(sql) > maxCachedText || cl.Has(sqlrewrite.EndsTx) {
		return
	}
	s.last, s.lastState = append(s.last[:0], sql...), st
}

// setting returns the Setting set makes (its value may share the proxy's
// buffer): the session's last one when it is the same, as a client sets
// the same token transaction after transaction.
func (s *session) setting(set sqlrewrite.TokenSet) *proxy.Setting {
	last := &s.lastSet[0]
	if set.Local {
		last = &s.lastSet[1]
	}
	if l := *last; l != nil && l.Name == set.Name && l.Value == set.Value && l.Reset == set.Reset {
		return l
	}
	*last = &proxy.Setting{Name: set.Name, Value: strings.Clone(set.Value), Local: set.Local, Reset: set.Reset}
	return *last
}

func sessionOf(c *proxy.Client) *session {
	if s, ok := c.Local.(*session); ok {
		return s
	}
	return &session{} // a client that never went through SessionStart
}

// PreparedWrite implements sqlrewrite.Session.
func (s *session) PreparedWrite(name string) []string { return s.prepared[name] }

func (s *session) remember(ps []sqlrewrite.PreparedWrite) {
	for _, p := range ps {
		if s.prepared == nil {
			s.prepared = make(map[string][]string)
		}
		s.prepared[p.Name] = p.Tables
	}
}

// invalidates reports whether sql may drop the proxy's prepared statements
// or change what they stand for (sqlrewrite.Invalidates), or ends a
// transaction after a text that may have changed a setting, which then
// changes back (SET LOCAL, or a SET rolled back). The proxy sees a
// transaction end in ReadyForQuery too, but only after it has sent what
// the client pipelined behind it.
func (s *session) invalidates(cl sqlrewrite.Class) bool {
	if cl.Has(sqlrewrite.Invalidates) {
		s.changed = true
		return true
	}
	if s.changed && cl.Has(sqlrewrite.EndsTx) {
		s.changed = false
		return true
	}
	return false
}

// mayExecute reports whether a text of class cl could EXECUTE a prepared
// write of this session, which the text need not name.
func (s *session) mayExecute(cl sqlrewrite.Class) bool {
	return len(s.prepared) > 0 && cl.Has(sqlrewrite.Executes)
}
