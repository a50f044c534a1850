package fence

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Error implements proxy.Interceptor: errors pgfence made the server raise
// are restated with their own SQLSTATE, message and hint.
func (p *Policy) Error(c *proxy.Client, e *pgproto3.ErrorResponse) *pgproto3.ErrorResponse {
	r, ok := sqlrewrite.ParseErrorMarker(e.Code, e.Message)
	if !ok {
		p.m.serverErrors.Inc(shardOf(c))
		return nil
	}
	p.m.fenceErrors.Inc(shardOf(c))
	setting := p.state.Load().cfg.TokenSetting
	switch r.Code {
	case "0A000":
		if h := unreadableHint(r.Message); h != "" {
			r.Hint = h
		}
	case "55000":
		r.Hint = fmt.Sprintf("set the lease's fencing token first: SET %s = '<token>' (or SET LOCAL inside a transaction)", setting)
		table := sqlrewrite.RefusedTable(r.Message)
		p.counter(c, withoutTokenSeries, table, "enforce", "refused", "").Inc(shardOf(c))
		p.log.Warn("write without fencing token refused", "table", table,
			"client", c.RemoteAddr, "application_name", c.ApplicationName(), "user", c.User)
	case "22023":
		if h, ok := sqlrewrite.TokenConflictHint(r.Message); ok {
			r.Hint = h // a lock domain's setting and the general one disagree
		} else {
			r.Hint = fmt.Sprintf("the fencing token must be a whole number, e.g. SET %s = '42'", setting)
		}
	case codeStaleDomain:
		table := sqlrewrite.RefusedTable(r.Message)
		token, newer, _ := sqlrewrite.StaleDomainTokens(r.Message)
		p.staleWrite(c, p.counter(c, rejectsSeries, table, "enforce", "domain", "rewrite"), p.gap(c, table, "domain"), table, "enforce", "domain", "rewrite", token, newer)
	}
	return &pgproto3.ErrorResponse{
		Severity:            e.Severity,
		SeverityUnlocalized: e.SeverityUnlocalized,
		Code:                r.Code,
		Message:             r.Message,
		Hint:                r.Hint,
	}
}
