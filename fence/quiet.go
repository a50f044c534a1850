package fence

import (
	"strings"
	"unsafe"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// A fenced write without its probe (see proxy.Quiet).
//
// The probe after a fenced write reads what the write left for pgfence:
// the token it ran with, and the flags its stale rows raised. Where the
// database has the backstop's helpers (Config.StaleNotice), a stale row
// raises its flag through pgfence.note_stale, which, in a transaction the
// proxy marked (see below), also raises a notice naming the flag and its
// value; and where the proxy set the token itself
// right ahead of the write, in the write's own transaction (a SET it
// answered, then a unit of one fenced write), pgfence knows the token
// without reading it. The proxy then leaves the probe out, keeps the
// write's stale notices from the client, and hands them to Done with the
// settings it set: Done counts the write from them exactly as probed
// counts it from the probe's row. That saves Postgres a statement per
// write, which in a lock domain every writer waits for (see
// BENCHMARKS.md, "Where a lock-domain write's time goes").
//
// The token a table's write runs with is the rewrite's: a lock domain's
// own setting (<token setting>.<domain>) when set, else the token
// setting. quietTokens.of reads it from the settings set ahead of the
// write:
//   - outside a lock domain, the token setting's value, if set;
//   - in one, the domain setting's value if set and not empty; if set
//     empty, the token setting's, if set; if not set at all, the token
//     setting's when that is set and not empty and the table is fenced
//     strictly (Enforce, a missing token refused): the write then fails
//     unless the domain setting is empty or holds the same text (see
//     sqlrewrite's strictCheck), so a write that completes ran with it.
//
// A notice costs the writer more than the probe would: Postgres sends each
// at once, a send of its own in the middle of the statement, which wakes
// pgfence for it. Straight to Postgres, 8 writers of one lock domain, half
// of them stale, ran at 0.73 of the throughput with the notice than with
// set_config alone. So pgfence.note_stale raises it only where the proxy
// left the probe out (sqlrewrite.QuietSetting, which the proxy's
// set_config statement sets for that transaction alone), and a session
// whose write went without its probe and left a stale row alone (a
// zombie, likely to go on writing stale) has its writes probed, and raise
// no notice, until one leaves no stale row.
//
// A notice counts only while the write it comes in is watched, and only
// for that write's tables: a client's own function can call the helper
// too, and so have its own write counted as a reject, which it can with
// the flags as well (see sqlrewrite's doc, pgfence's own settings).

// quiet returns the proxy.Quiet of pr's probe under st, whose counts go to
// series.
func (p *Policy) quiet(st *state, pr *sqlrewrite.Probe, series []probeSeries, notify bool) *proxy.Quiet {
	strict := make([]bool, len(pr.Tables))
	for i, t := range pr.Tables {
		if t.Guard < len(st.cfg.Guards) {
			g := st.cfg.Guards[t.Guard]
			strict[i] = g.Rollout == sqlrewrite.Enforce && !g.AllowMissingToken
		}
	}
	tokens := quietTokens{setting: st.cfg.TokenSetting, tables: pr.Tables, strict: strict}
	return &proxy.Quiet{
		Known: func(c *proxy.Client, set []proxy.Setting) bool {
			if sessionOf(c).probeNext.Load() {
				return false
			}
			for i := range pr.Tables {
				if _, ok := tokens.of(i, set); !ok {
					return false
				}
			}
			return true
		},
		Notice: func(c *proxy.Client, n *pgproto3.NoticeResponse) (string, bool) {
			if n.Code != sqlrewrite.StaleNoticeCode {
				return "", false
			}
			guard, _, _, ok := sqlrewrite.ParseStaleNotice(n.Detail)
			if !ok {
				return "", false
			}
			for _, t := range pr.Tables {
				if t.Guard == guard {
					return n.Detail, true
				}
			}
			return "", false
		},
		Done: func(c *proxy.Client, set []proxy.Setting, notes []string) *pgproto3.NoticeResponse {
			p.m.probesOut.Inc(shardOf(c))
			var stale []string
			var token []byte
			for i, t := range pr.Tables {
				tok, _ := tokens.of(i, set)
				// Read only, as a probe's row is: no copy per write.
				o := sqlrewrite.ProbeOutcome{Token: unsafe.Slice(unsafe.StringData(tok), len(tok))}
				for _, note := range notes {
					guard, kind, winner, ok := sqlrewrite.ParseStaleNotice(note)
					// The domain's flag wins over the row's, as in the probe's row.
					if ok && guard == t.Guard && kind >= o.Stale {
						o.Stale, o.Winner = kind, []byte(winner)
					}
				}
				if p.outcome(c, t, &series[i], o) {
					token = o.Token
					if t.Rollout == sqlrewrite.Enforce {
						stale = append(stale, t.Table)
					}
				}
			}
			if len(notes) > 0 {
				sessionOf(c).probeNext.Store(true)
			}
			return staleNotice(notify, stale, token)
		},
	}
}

// quietTokens reads, from the settings set ahead of a write, the token each
// table of its probe runs with (see the top of the file).
type quietTokens struct {
	setting string // the token setting
	tables  []sqlrewrite.ProbeTable
	strict  []bool // by table: fenced strictly
}

// of returns table i's token, and whether set tells it.
func (q quietTokens) of(i int, set []proxy.Setting) (string, bool) {
	tok, tokSet := value(set, q.setting)
	t := q.tables[i]
	if t.Domain == "" {
		return tok, tokSet
	}
	dom, domSet := value(set, q.setting+"."+t.Domain)
	switch {
	case domSet && dom != "":
		return dom, true
	case domSet:
		return tok, tokSet
	}
	return tok, tokSet && tok != "" && q.strict[i]
}

// value returns the value set last of the setting name in set.
func value(set []proxy.Setting, name string) (v string, ok bool) {
	for _, s := range set {
		if strings.EqualFold(s.Name, name) {
			v, ok = s.Value, true
		}
	}
	return v, ok
}
