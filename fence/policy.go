// Package fence is pgfence's policy: which tables are guarded, what a write
// to one becomes, how stale writes are classified and counted, and what the
// client is told. It implements proxy.Interceptor.
package fence

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Config is the fencing policy.
type Config struct {
	Guards       []sqlrewrite.Guard
	TokenSetting string // default "fence.token"
}

// Policy implements proxy.Interceptor. It is safe for concurrent use, and
// its configuration can be replaced while sessions run (Reload).
type Policy struct {
	m     *Metrics
	log   *slog.Logger
	state atomic.Pointer[state]
}

// state is one configuration, swapped as a whole on reload.
type state struct {
	cfg    Config
	rw     *sqlrewrite.Rewriter
	probes map[string]*proxy.Probe // by guarded table name
}

// New returns a Policy for cfg, reporting to m and log.
func New(cfg Config, m *Metrics, log *slog.Logger) (*Policy, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Policy{m: m, log: log}
	if err := p.Reload(cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// Reload switches to cfg. Statements already sent keep the configuration
// they were rewritten with.
func (p *Policy) Reload(cfg Config) error {
	if cfg.TokenSetting == "" {
		cfg.TokenSetting = "fence.token"
	}
	rw, err := sqlrewrite.New(sqlrewrite.Config{Guards: cfg.Guards, TokenSetting: cfg.TokenSetting})
	if err != nil {
		return err
	}
	st := &state{cfg: cfg, rw: rw, probes: make(map[string]*proxy.Probe, len(cfg.Guards))}
	for _, g := range cfg.Guards {
		table := g.Name()
		p.m.watch(table)
		st.probes[table] = proxy.NewProbe(rw.ProbeSQL(), func(c *proxy.Client, row [][]byte) {
			p.probed(c, table, row)
		})
	}
	p.state.Store(st)
	return nil
}

// Guards returns the guarded tables in force.
func (p *Policy) Guards() []sqlrewrite.Guard { return p.state.Load().cfg.Guards }

// SessionStart implements proxy.Interceptor.
func (p *Policy) SessionStart(c *proxy.Client) {
	p.m.connsTotal.Inc()
	p.m.connsActive.Inc()
}

// SessionEnd implements proxy.Interceptor.
func (p *Policy) SessionEnd(c *proxy.Client, err error) {
	p.m.connsActive.Dec()
	if err != nil {
		p.m.sessionErrors.Inc()
	}
}

// Query implements proxy.Interceptor.
func (p *Policy) Query(c *proxy.Client, sql string) proxy.Plan {
	return p.plan(c, sql, sqlrewrite.Simple)
}

// Parse implements proxy.Interceptor.
func (p *Policy) Parse(c *proxy.Client, sql string) proxy.Plan {
	return p.plan(c, sql, sqlrewrite.Prepared)
}

func (p *Policy) plan(c *proxy.Client, sql string, mode sqlrewrite.Mode) proxy.Plan {
	st := p.state.Load()
	if !st.rw.MayTouch(sql) {
		p.m.passthrough.Inc()
		return proxy.Plan{}
	}
	var res *sqlrewrite.Result
	var err error
	if ref := unreadable(c, sql); ref != nil {
		res = sqlrewrite.Refuse(ref)
	} else {
		res, err = st.rw.Rewrite(sql, mode)
	}
	if err != nil {
		// Never forward a statement the rewriter could not judge.
		p.log.Error("rewriter failed; refusing the statement", "err", err, "client", c.RemoteAddr)
		res = sqlrewrite.Refuse(&sqlrewrite.Refusal{Code: "XX000", Message: "pgfence: internal error while fencing this statement: " + err.Error(), Hint: "please report this statement to the pgfence maintainers"})
	}
	if res.Refusal != nil {
		p.m.refused.Inc()
		p.log.Info("statement refused", "code", res.Refusal.Code, "reason", res.Refusal.Message,
			"client", c.RemoteAddr, "application_name", c.ApplicationName())
		return proxy.Plan{SQL: res.SQL}
	}
	if len(res.Fenced) == 0 {
		p.m.passthrough.Inc()
		return proxy.Plan{}
	}
	p.m.fenced.Inc()
	plan := proxy.Plan{SQL: res.SQL, Probes: make([]proxy.ProbeAt, 0, len(res.Fenced))}
	for _, f := range res.Fenced {
		plan.Probes = append(plan.Probes, proxy.ProbeAt{Index: f.ProbeIndex, Probe: st.probes[f.Table]})
	}
	return plan
}

// unreadable refuses text that mentions a guarded table when the session
// reads SQL differently from the parser pgfence uses: with
// standard_conforming_strings off a backslash can end a literal elsewhere,
// and in a client-only multibyte encoding a quote byte can hide inside a
// character. Either could hide a write from the rewriter (fail closed).
func unreadable(c *proxy.Client, sql string) *sqlrewrite.Refusal {
	if !c.StandardConformingStrings() {
		return &sqlrewrite.Refusal{Code: "0A000",
			Message: "pgfence: statements that mention a guarded table need standard_conforming_strings = on",
			Hint:    "SET standard_conforming_strings = on (the default since PostgreSQL 9.1)"}
	}
	if enc := c.ClientEncoding(); enc != "UTF8" && enc != "SQL_ASCII" && !isASCII(sql) {
		return &sqlrewrite.Refusal{Code: "0A000",
			Message: "pgfence: statements that mention a guarded table and contain non-ASCII text need client_encoding UTF8, not " + enc,
			Hint:    "SET client_encoding = 'UTF8'"}
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// probed receives a fenced statement's probe row: the stale flag and the
// token in force.
func (p *Policy) probed(c *proxy.Client, table string, row [][]byte) {
	if len(row) < 2 || string(row[0]) != "1" {
		return
	}
	p.m.rejects.WithLabelValues(table).Inc()
	p.log.Warn("stale write fenced", "table", table, "token", string(row[1]),
		"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
}

// Error implements proxy.Interceptor: errors pgfence made the server raise
// are restated with their own SQLSTATE, message and hint.
func (p *Policy) Error(c *proxy.Client, e *pgproto3.ErrorResponse) *pgproto3.ErrorResponse {
	r, ok := sqlrewrite.ParseErrorMarker(e.Code, e.Message)
	if !ok {
		p.m.serverErrors.Inc()
		return nil
	}
	p.m.fenceErrors.Inc()
	setting := p.state.Load().cfg.TokenSetting
	switch r.Code {
	case "55000":
		r.Hint = fmt.Sprintf("set the lease's fencing token first: SET %s = '<token>' (or SET LOCAL inside a transaction)", setting)
		table := markerTable(r.Message)
		p.m.withoutToken.WithLabelValues(table).Inc()
		p.log.Warn("write without fencing token refused", "table", table,
			"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
	case "22023":
		r.Hint = fmt.Sprintf("the fencing token must be a whole number, e.g. SET %s = '42'", setting)
	}
	return &pgproto3.ErrorResponse{
		Severity:            e.Severity,
		SeverityUnlocalized: e.SeverityUnlocalized,
		Code:                r.Code,
		Message:             r.Message,
		Hint:                r.Hint,
	}
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
