package fence

import (
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
// be told. Every other notice reaches the client as sent.
func (p *Policy) Notice(c *proxy.Client, n *pgproto3.NoticeResponse) bool {
	if n.Code != backstop.CodeStaleNotice {
		return true
	}
	kind, mode, epoch, token := "row", "enforce", "", ""
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
		}
	}
	table := sqlrewrite.Guard{Schema: n.SchemaName, Table: n.TableName}.Name()
	p.m.rejects.WithLabelValues(table, mode, kind, "backstop").Inc()
	p.staleWrite(c, table, mode, kind, "backstop", token, epoch)
	return p.state.Load().cfg.NotifyStale
}
