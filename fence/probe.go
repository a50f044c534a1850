package fence

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/loopstat"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// probe returns the proxy probe for a rewriter probe, built once per
// configuration and probe text.
func (p *Policy) probe(st *state, pr sqlrewrite.Probe) *proxy.Probe {
	if v, ok := st.probes.Load(pr.SQL); ok {
		return v.(*proxy.Probe)
	}
	notify := st.cfg.NotifyStale
	// Every fenced write counts itself per table: resolve those series once.
	series := make([]probeSeries, len(pr.Tables))
	for i, t := range pr.Tables {
		mode := t.Rollout.String()
		series[i] = probeSeries{
			set:      p.m.guardedWrites.With(t.Table, mode, "set"),
			missing:  p.m.guardedWrites.With(t.Table, mode, "missing"),
			allowed:  p.m.withoutToken.With(t.Table, mode, "allowed"),
			accepted: p.m.acceptedTable.of(t.Table),
		}
		for _, k := range []sqlrewrite.Stale{sqlrewrite.StaleRow, sqlrewrite.StaleDomain} {
			series[i].rejects[k] = p.m.rejects.With(t.Table, mode, k.String(), "rewrite")
			series[i].gaps[k] = p.m.tokenGap.With(t.Table, k.String())
		}
		if t.Domain != "" && t.Rollout != sqlrewrite.Observe {
			series[i].domainAccepted = p.m.acceptedDomain.of(t.Domain)
		}
	}
	probe := proxy.NewProbe(pr.SQL, func(c *proxy.Client, row [][]byte) *pgproto3.NoticeResponse {
		return p.probed(c, &pr, series, notify, row)
	})
	if st.cfg.StaleNotice {
		probe.SetQuiet(p.quiet(st, &pr, series, notify))
	}
	v, _ := st.probes.LoadOrStore(pr.SQL, probe)
	return v.(*proxy.Probe)
}

// probeSeries are a probed table's series, resolved once per probe.
type probeSeries struct {
	set, missing   *loopstat.Counter // pgfence_guarded_writes_total, with and without a token
	allowed        *loopstat.Counter // critical_write_without_token_total, let through
	rejects        [sqlrewrite.StaleDomain + 1]*loopstat.Counter
	gaps           [sqlrewrite.StaleDomain + 1]*loopstat.Histogram
	accepted       *tokenMax // the table's highest accepted token
	domainAccepted *tokenMax // its lock domain's, nil outside an enforced one
}

// probed classifies what a guarded write left behind: the token it ran
// with, and per table whether it met a stale row and what beat it.
func (p *Policy) probed(c *proxy.Client, pr *sqlrewrite.Probe, series []probeSeries, notify bool, row [][]byte) *pgproto3.NoticeResponse {
	var stale []string
	var token []byte
	fresh := true
	for i, t := range pr.Tables {
		o, ok := pr.Outcome(row, i)
		if !ok {
			p.log.Error("probe returned a short row; reject counts may be low", "columns", len(row), "tables", len(pr.Tables))
			return nil
		}
		if p.outcome(c, t, &series[i], o) {
			fresh, token = false, o.Token
			if t.Rollout == sqlrewrite.Enforce {
				stale = append(stale, t.Table)
			}
		}
	}
	if sess := sessionOf(c); fresh && sess.probeNext.Load() {
		sess.probeNext.Store(false) // see quiet.go
	}
	return staleNotice(notify, stale, token)
}

// outcome counts what a guarded write left behind in table t, as its probe
// (or, left out, its replies: see quiet.go) found it, and reports whether
// a stale row was skipped (Enforce) or would have been (Shadow).
func (p *Policy) outcome(c *proxy.Client, t sqlrewrite.ProbeTable, series *probeSeries, o sqlrewrite.ProbeOutcome) (stale bool) {
	mode := t.Rollout.String()
	shard := shardOf(c)
	if len(o.Token) > 0 {
		series.set.Inc(shard)
	} else {
		series.missing.Inc(shard)
		series.allowed.Inc(shard)
		p.log.Warn("write without fencing token let through", "table", t.Table, "mode", mode,
			"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
	}
	if o.Stale == sqlrewrite.NotStale {
		if tok, ok := parseToken(o.Token); ok && t.Rollout != sqlrewrite.Observe {
			series.accepted.raise(tok)
			if d := series.domainAccepted; d != nil {
				d.raise(tok)
			}
		}
		return false
	}
	if o.Stale > sqlrewrite.StaleDomain {
		p.log.Error("probe returned an unknown outcome; reject counts may be low", "table", t.Table)
		return false
	}
	p.staleWrite(c, series.rejects[o.Stale], series.gaps[o.Stale], t.Table, mode, o.Stale.String(), "rewrite", string(o.Token), string(o.Winner), "domain", t.Domain)
	return true
}

// staleNotice is the WARNING a stale writer gets when notify (NotifyStale)
// asks for one: stale are the Enforce tables whose rows it left alone,
// token the token it ran with.
func staleNotice(notify bool, stale []string, token []byte) *pgproto3.NoticeResponse {
	if !notify || len(stale) == 0 {
		return nil
	}
	return &pgproto3.NoticeResponse{
		Severity:            "WARNING",
		SeverityUnlocalized: "WARNING",
		Code:                "01000",
		Message: fmt.Sprintf("pgfence: stale write fenced: rows of %s were written under a newer fencing token than %s and were left unchanged",
			strings.Join(quoteAll(stale), ", "), token),
		Hint: "your lease has likely expired: stop acting as its holder and acquire it again",
	}
}

// staleWrite counts a stale write in rejects (its fencing_reject_total
// series) and its token gap in gap, how far the epoch (or lock domain
// token) that beat it was ahead of its token, and logs it if staleLog
// admits it. epoch is "" when pgfence cannot know it. extra are more
// attributes for the line.
func (p *Policy) staleWrite(c *proxy.Client, rejects *loopstat.Counter, gap *loopstat.Histogram, table, mode, kind, via, token, epoch string, extra ...any) {
	shard := shardOf(c)
	rejects.Inc(shard)
	tok, okTok := parseToken([]byte(token))
	won, okWon := parseToken([]byte(epoch))
	if okTok && okWon && won > tok {
		gap.Observe(shard, float64(won)-float64(tok))
	}
	ok, unlogged := p.staleLog.admit(rejects, shard, time.Now(), p.state.Load().cfg.StaleLogInterval)
	if !ok {
		return
	}
	if epoch == "" {
		epoch = "unknown"
	}
	msg := "stale write fenced"
	if mode == "shadow" {
		msg = "stale write would have been fenced (shadow mode: it landed)"
	}
	attrs := append([]any{"table", table, "kind", kind, "via", via, "token", token, "epoch", epoch, "mode", mode,
		"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User}, extra...)
	if unlogged > 0 {
		attrs = append(attrs, "unlogged", unlogged)
	}
	p.log.Warn(msg, attrs...)
}

// parseToken reads a token as Postgres's int8 input would: surrounding
// white space and a sign allowed.
func parseToken(b []byte) (int64, bool) {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return n, err == nil
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = `"` + s + `"`
	}
	return out
}
