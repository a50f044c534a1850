package fence

import (
	"strings"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// pooledPlan is plan behind a transaction pooler (Config.TransactionPooling),
// where the proxy keeps the session's token settings and sets them for
// each transaction that may need them (see proxy/txpooling.go). It only knows
// them from a plain SET or RESET outside a transaction block, which the
// proxy answers; every other way to change one for the session is refused
// here, as the server connection would keep that change for the next
// client while pgfence went on with its own value.
func (p *Policy) pooledPlan(st *state, c *proxy.Client, t *text, mode sqlrewrite.Mode) proxy.Plan {
	sess := sessionOf(c)
	sql := t.sql
	a := t.analysis(st)
	if set, ok := a.Setting(); ok {
		p.m.passthrough.Inc(shardOf(c))
		plan := proxy.Plan{Setting: sess.setting(set)}
		if set.Local {
			// Runs on the server as sent, after the session's values.
			plan.NeedsToken = true
			return plan
		}
		// Answered by the proxy when it may; else refused, as it would
		// stay on the server connection.
		plan.SQL = st.setRefusal(set.Name, set.Reset)
		return plan
	}
	if form, ok, unread := a.SessionChange(); ok {
		var pl *planned
		if unread != nil {
			// pgfence cannot read it, and the server may (see
			// sqlrewrite/skew.go).
			pl = p.newPlanned(st, sql, sqlrewrite.Refuse(unread))
		} else {
			pl = p.pooledRefusal(st, sql, form)
		}
		p.m.refused.Inc(shardOf(c))
		p.log.Info("statement refused", "code", pl.res.Refusal.Code, "reason", pl.res.Refusal.Message,
			"client", c.RemoteAddr, "application_name", c.ApplicationName())
		return pl.plan
	}
	plan, pl := p.planIn(st, c, t, mode)
	plan.NeedsToken = needsToken(a, plan)
	if plan.NeedsToken && mode == sqlrewrite.Simple && plan.ParamTypes == nil {
		var tx txStarts
		switch {
		case plan.SQL == "":
			tx = st.passedTxStarts(c, sql, a)
		case pl != nil && pl.plan.SQL == plan.SQL:
			tx = *pl.txStarts() // the rewrite's, another text: found once per plan
		default:
			tx = newTxStarts(sqlrewrite.TxStarts(plan.SQL)) // no plan to keep them in
		}
		if tx.unread != nil {
			pl := p.newPlanned(st, sql, sqlrewrite.Refuse(tx.unread))
			p.m.refused.Inc(shardOf(c))
			p.log.Info("statement refused", "code", tx.unread.Code, "reason", tx.unread.Message,
				"client", c.RemoteAddr, "application_name", c.ApplicationName())
			return pl.plan
		}
		plan.TxStarts = tx.starts
	}
	return plan
}

// txStarts are where a Query's SQL starts transactions of its own behind a
// transaction pooler (proxy.Plan.TxStarts), or, when pgfence cannot read
// it, the refusal to send instead (see sqlrewrite.TxStarts).
type txStarts struct {
	starts []proxy.TxStart // shared by every plan of the SQL: read only
	unread *sqlrewrite.Refusal
}

func newTxStarts(starts []sqlrewrite.TxStart, unread *sqlrewrite.Refusal) txStarts {
	if unread != nil {
		return txStarts{unread: unread}
	}
	var tx txStarts
	if len(starts) > 0 {
		tx.starts = make([]proxy.TxStart, len(starts))
		for i, s := range starts {
			tx.starts[i] = proxy.TxStart{Offset: s.Offset, Index: s.Index}
		}
	}
	return tx
}

// passedTxStarts returns the txStarts of sql, a Query that runs as the
// client sent it, kept in the shard's caches when finding them took a
// parse: a text of several statements that spells COMMIT or END (BEGIN;
// ...; COMMIT, sent again and again) would otherwise be parsed at each
// execution, on the event loop its session shares with others.
func (st *state) passedTxStarts(c *proxy.Client, sql string, a *sqlrewrite.Analysis) txStarts {
	cs := st.cachesOf(c)
	if cs == nil || len(sql) > maxCachedText || !a.TxStartsParse() {
		return newTxStarts(a.TxStarts())
	}
	if tx, ok := cs.passed.Get(sql); ok {
		return *tx
	}
	tx := newTxStarts(a.TxStarts())
	cs.passed.Add(strings.Clone(sql), &tx) // kept: see proxy.Interceptor
	return tx
}

// txStarts returns the txStarts of pl.plan.SQL, found at the first call
// and kept with pl, which the caches keep: a cache hit then costs no
// parse, and a rewrite pgfence cannot read is refused every time. Two
// sessions of a shard may both find them at once, which costs a parse.
func (pl *planned) txStarts() *txStarts {
	if tx := pl.tx.Load(); tx != nil {
		return tx
	}
	tx := newTxStarts(sqlrewrite.TxStarts(pl.plan.SQL))
	pl.tx.Store(&tx)
	return &tx
}

// PooledSet implements proxy.PooledSets: the statement that sets every
// token setting of the configuration in force (the token setting and
// each lock domain's), made once per configuration.
func (p *Policy) PooledSet(*proxy.Client) *proxy.PooledSet {
	st := p.state.Load()
	if ps := p.pooled.Load(); ps != nil && ps.st == st {
		return ps.set
	}
	names := st.rw.Tokens().Names()
	ext, text := sqlrewrite.PooledSetSQL(names)
	set, err := proxy.NewPooledSet(names, ext, text)
	if err != nil {
		panic(err) // sqlrewrite.PooledSetSQL makes both forms
	}
	p.pooled.Store(&pooledSet{st, set})
	return set
}

// pooledSet is the PooledSet of a configuration.
type pooledSet struct {
	st  *state
	set *proxy.PooledSet
}

// needsToken reports whether, behind a transaction pooler, the session's
// token must be set in the transaction of the text a analyses ahead of
// it: the text is fenced here, or reads or sets the token (however it
// spells it), or may write (a write keyword), or may call a function (a
// parenthesis), which may write a guarded table that the database
// backstop fences with the token (see sqlrewrite.Analysis.MayUseToken). A
// text with none of these (SELECT abalance FROM accounts WHERE id = $1,
// BEGIN, SHOW work_mem) runs without it: should it write anyway (through
// an operator's function, say) the backstop finds there no token but one
// a transaction of this server connection left for the session where
// pgfence could not see it (see sqlrewrite.PooledSet), which fails
// closed.
func needsToken(a *sqlrewrite.Analysis, plan proxy.Plan) bool {
	return plan.SQL != "" || len(plan.Probes) > 0 || a.MayUseToken()
}

// settingKey names a plain SET (or RESET) of a token setting.
type settingKey struct {
	name  string
	reset bool
}

// setRefusals are the statements that refuse a plain SET or RESET of each
// token setting behind a transaction pooler, where the proxy cannot answer
// it (see pooledPlan): one per setting and form, made once per
// configuration, as a pooled session sends the SET in every transaction.
func setRefusals(rw *sqlrewrite.Rewriter, setting string) map[settingKey]string {
	m := make(map[settingKey]string)
	for _, name := range rw.Tokens().Names() {
		for _, reset := range []bool{false, true} {
			m[settingKey{name, reset}] = setRefusalSQL(setting, name, reset)
		}
	}
	return m
}

// setRefusal returns the statement that refuses a plain SET (or RESET) of
// the token setting name behind a transaction pooler.
func (st *state) setRefusal(name string, reset bool) string {
	if sql, ok := st.setRefusals[settingKey{name, reset}]; ok {
		return sql
	}
	return setRefusalSQL(st.cfg.TokenSetting, name, reset)
}

func setRefusalSQL(setting, name string, reset bool) string {
	form := "SET "
	if reset {
		form = "RESET "
	}
	form += name + ", pipelined behind another statement or inside a transaction block,"
	return sqlrewrite.Refuse(sqlrewrite.PooledRefusal(form, setting)).SQL
}

// pooledRefusal is the plan that refuses sql, which would change a token
// setting for the session (form says how) behind a transaction pooler.
func (p *Policy) pooledRefusal(st *state, sql, form string) *planned {
	return p.newPlanned(st, sql, sqlrewrite.Refuse(sqlrewrite.PooledRefusal(form, st.cfg.TokenSetting)))
}
