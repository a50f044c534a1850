package fence

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// probe returns the proxy probe for a rewriter probe, built once per
// configuration and probe text.
func (p *Policy) probe(st *state, pr sqlrewrite.Probe) *proxy.Probe {
	if v, ok := st.probes.Load(pr.SQL); ok {
		return v.(*proxy.Probe)
	}
	tables := pr.Tables
	notify := st.cfg.NotifyStale
	// Every fenced write counts itself per table: resolve those series once.
	writes := make([][2]prometheus.Counter, len(tables))
	for i, t := range tables {
		mode := t.Rollout.String()
		writes[i] = [2]prometheus.Counter{
			p.m.guardedWrites.WithLabelValues(t.Table, mode, "set"),
			p.m.guardedWrites.WithLabelValues(t.Table, mode, "missing"),
		}
	}
	v, _ := st.probes.LoadOrStore(pr.SQL, proxy.NewProbe(pr.SQL, func(c *proxy.Client, row [][]byte) *pgproto3.NoticeResponse {
		return p.probed(c, tables, writes, notify, row)
	}))
	return v.(*proxy.Probe)
}

// probed classifies what a guarded write left behind: the token it ran
// with, and per table whether it met a stale row. writes are the tables'
// pgfence_guarded_writes_total series, with and without a token.
func (p *Policy) probed(c *proxy.Client, tables []sqlrewrite.ProbeTable, writes [][2]prometheus.Counter, notify bool, row [][]byte) *pgproto3.NoticeResponse {
	if len(row) < 1+2*len(tables) {
		p.log.Error("probe returned a short row; reject counts may be low", "columns", len(row), "tables", len(tables))
		return nil
	}
	missing := len(row[0]) == 0
	var stale []string
	for i, t := range tables {
		mode := t.Rollout.String()
		if !missing {
			writes[i][0].Inc()
		} else {
			writes[i][1].Inc()
			p.m.withoutToken.WithLabelValues(t.Table, mode, "allowed").Inc()
			p.log.Warn("write without fencing token let through", "table", t.Table, "mode", mode,
				"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
		}
		// Two flags per table: a row's epoch was newer, or the lock
		// domain's token was.
		kind := ""
		switch {
		case string(row[2+2*i]) == "1":
			kind = "domain"
		case string(row[1+2*i]) == "1":
			kind = "row"
		default:
			continue
		}
		token := string(row[0])
		p.m.rejects.WithLabelValues(t.Table, mode, kind, "rewrite").Inc()
		msg := "stale write fenced"
		if t.Rollout == sqlrewrite.Shadow {
			msg = "stale write would have been fenced (shadow mode: it landed)"
		}
		p.log.Warn(msg, "table", t.Table, "kind", kind, "domain", t.Domain, "token", token, "mode", mode,
			"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
		if t.Rollout == sqlrewrite.Enforce {
			stale = append(stale, t.Table)
		}
	}
	if !notify || len(stale) == 0 {
		return nil
	}
	return &pgproto3.NoticeResponse{
		Severity:            "WARNING",
		SeverityUnlocalized: "WARNING",
		Code:                "01000",
		Message: fmt.Sprintf("pgfence: stale write fenced: rows of %s were written under a newer fencing token than %s and were left unchanged",
			strings.Join(quoteAll(stale), ", "), row[0]),
		Hint: "your lease has likely expired: stop acting as its holder and acquire it again",
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = `"` + s + `"`
	}
	return out
}

// markerTable finds the table named in a pgfence error message
// (`... guarded table "T"; ...`).
func markerTable(msg string) string {
	const key = `guarded table "`
	i := strings.Index(msg, key)
	if i < 0 {
		return ""
	}
	rest := msg[i+len(key):]
	if j := strings.LastIndex(rest, `";`); j >= 0 {
		return rest[:j]
	}
	if j := strings.LastIndex(rest, `"`); j >= 0 {
		return rest[:j]
	}
	return rest
}
