package fence

import (
	"crypto/subtle"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Notice implements proxy.Interceptor. The database backstop raises a
// notice (backstop.CodeStaleNotice) once per statement and table whose
// stale rows it skipped: a write pgfence could not see in the SQL text (a
// view, a function, a cascade). It counts as a reject, via the backstop,
// and is kept from the client unless NotifyStale asks for stale writers to
// be told. Every other notice reaches the client as sent, and so does one
// with the backstop's code that the backstop did not raise: a client's own
// function can raise any notice, but not one whose mark holds (see
// backstop.NoticeMark), nor raise one of the backstop's again.
//
// The notices of pgfence.note_stale (sqlrewrite.StaleNoticeCode), a
// rewritten write's stale rows, are kept from the client too: one whose
// write pgfence watches is counted there (see quiet.go), and any other is
// counted by the write's probe, from the flag it raised.
func (p *Policy) Notice(c *proxy.Client, n *pgproto3.NoticeResponse) bool {
	if n.Code == sqlrewrite.StaleNoticeCode {
		return false
	}
	if n.Code != backstop.CodeStaleNotice {
		return true
	}
	var kind, mode, epoch, token, rel, at, mark string
	for _, f := range strings.Fields(n.Detail) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "kind":
			kind = v
		case "mode":
			mode = v
		case "epoch":
			epoch = v
		case "token":
			token = v
		case "rel":
			rel = v
		case "at":
			at = v
		case "mark":
			mark = v
		}
	}
	st := p.state.Load()
	sess := sessionOf(c)
	if !markHolds(st.cfg.NoticeKey, at, rel, kind, mark) || !sess.newNotice(rel+" "+kind, at) {
		if !sess.forgedNotice {
			sess.forgedNotice = true
			p.log.Warn("a notice with the backstop's code that the backstop did not raise, or raised before: not counted",
				"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
		}
		return true
	}
	table := sqlrewrite.Guard{Schema: n.SchemaName, Table: n.TableName}.Name()
	p.staleWrite(c, p.counter(c, rejectsSeries, table, mode, kind, "backstop"), p.gap(c, table, kind), table, mode, kind, "backstop", token, epoch)
	return st.cfg.NotifyStale
}

// markHolds reports whether mark is the backstop's for a notice of (at,
// rel, kind) under key, pgfence's secret in the database.
func markHolds(key, at, rel, kind, mark string) bool {
	if key == "" || mark == "" {
		return false
	}
	want := backstop.NoticeMark(key, at, rel, kind)
	return subtle.ConstantTimeCompare([]byte(want), []byte(mark)) == 1
}

// newNotice reports whether a backstop notice of key (table and kind)
// raised at the statement time at (microseconds) comes after the last one
// counted in the session, and notes it: the backstop raises one per
// statement and table, so one raised again (by a client that kept an
// earlier one) is not.
func (s *session) newNotice(key, at string) bool {
	t, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return false
	}
	if s.noticed == nil {
		s.noticed = map[string]int64{}
	}
	if last, ok := s.noticed[key]; ok && t <= last {
		return false
	}
	s.noticed[key] = t
	return true
}
