package fence

import (
	"strings"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// session is pgfence's state for one client session: the SQL-level prepared
// statements that write guarded tables, so EXECUTE of one gets its probe.
// Only the client-to-server relay touches it.
type session struct {
	prepared map[string][]string
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

// mayExecute reports whether sql could EXECUTE a prepared write of this
// session, which the text need not name.
func (s *session) mayExecute(sql string) bool {
	return len(s.prepared) > 0 && containsFold(sql, "execute")
}

// containsFold is an ASCII case-insensitive strings.Contains for a
// lower-case needle.
func containsFold(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(lower)], lower) {
			return true
		}
	}
	return false
}
