package fence

import (
	"encoding/binary"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// text is the text of a Query or Parse with sqlrewrite's analysis of it,
// made on first use: the one pass over the text whose result the policy's
// decisions switch over (see sqlrewrite.Analysis). A text the session's
// memo passes is not analysed at all.
type text struct {
	sql      string
	a        sqlrewrite.Analysis
	analyzed bool
}

// analysis returns t's analysis under st, made at the first call.
func (t *text) analysis(st *state) *sqlrewrite.Analysis {
	if !t.analyzed {
		t.a, t.analyzed = st.rw.Analyze(t.sql, st.cfg.TransactionPooling), true
	}
	return &t.a
}

func (p *Policy) plan(c *proxy.Client, sql string, mode sqlrewrite.Mode) proxy.Plan {
	st := p.state.Load()
	t := text{sql: sql}
	// pgfence's own settings are its alone, in every mode. (The text the
	// session's memo passes passed this too.)
	if !sessionOf(c).passes(st, sql) {
		if ref := t.analysis(st).InternalChange(); ref != nil {
			p.m.refused.Inc(shardOf(c))
			p.log.Info("statement refused", "code", ref.Code, "reason", ref.Message,
				"client", c.RemoteAddr, "application_name", c.ApplicationName())
			return p.newPlanned(st, sql, sqlrewrite.Refuse(ref)).plan
		}
	}
	if st.cfg.TransactionPooling {
		return p.pooledPlan(st, c, &t, mode)
	}
	plan, _ := p.planIn(st, c, &t, mode)
	return plan
}

// planIn plans t, but for what only a transaction pooler needs (see
// pooledPlan). A plan made from a rewrite comes with the planned it was
// made from (always one with SQL set), where pooledPlan keeps what it
// finds of that SQL (planned.txStarts); nil otherwise.
func (p *Policy) planIn(st *state, c *proxy.Client, t *text, mode sqlrewrite.Mode) (proxy.Plan, *planned) {
	sess := sessionOf(c)
	sql := t.sql
	// The name prefilter, and the memo of the last text it passed, compare
	// the guarded names' bytes with the client's: when the server may read
	// the client's non-ASCII bytes as other characters (see
	// misreadsNonASCII), they cannot clear such a text, which must not be
	// passed on their word. A text that spells no write keyword still
	// cannot write (Writes looks at ASCII letters and the bytes around
	// them only, which stand for the same characters in every client
	// encoding); any other goes on to unreadable, which refuses it. Only
	// sessions whose client encoding is not UTF8 pay for the check, and
	// only when a guarded name is not ASCII.
	var a *sqlrewrite.Analysis
	if st.nonASCIINames && misreadsNonASCII(c) && !isASCII(sql) {
		a = t.analysis(st)
		p.noteChange(c, sess, a.Class)
		if !a.Class.Has(sqlrewrite.Writes) && !a.MayBeDDL() {
			p.m.passthrough.Inc(shardOf(c))
			return proxy.Plan{Forget: sess.invalidates(a.Class)}, nil
		}
	} else {
		if sess.passes(st, sql) {
			p.m.passthrough.Inc(shardOf(c))
			return proxy.Plan{}, nil
		}
		a = t.analysis(st)
		ddl := p.noteChange(c, sess, a.Class)
		if set, ok := a.Setting(); ok && !set.Reset {
			// It changes no prepared statement and touches no table; the
			// proxy may answer it itself (see proxy.Plan.Setting).
			p.m.passthrough.Inc(shardOf(c))
			return proxy.Plan{Setting: sess.setting(set)}, nil
		}
		// Plan.Forget has the proxy prepare its own statements again: on a
		// false alarm that costs a Parse, a miss fails the next write that
		// uses one (once: the proxy also forgets them on a 26000).
		if !a.Class.Has(sqlrewrite.Touches) && !sess.mayExecute(a.Class) {
			p.m.passthrough.Inc(shardOf(c))
			forget := sess.invalidates(a.Class)
			if !forget && !ddl {
				sess.passed(st, sql, a.Class)
			}
			return proxy.Plan{Forget: forget}, nil
		}
		if readOnly(c, sql, a) {
			p.m.passthrough.Inc(shardOf(c))
			forget := sess.invalidates(a.Class)
			if !forget && !ddl && isASCII(sql) {
				// An ASCII text reads the same in every client encoding,
				// so it stays read-only while st is in force: a query of
				// a guarded table sent again and again is not scanned
				// again.
				sess.passed(st, sql, a.Class)
			}
			return proxy.Plan{Forget: forget}, nil
		}
	}
	forget := sess.invalidates(a.Class)
	pl, params := p.rewrite(st, c, sess, sql, mode, forget, a)
	if st.nonASCIISpliced && pl.res.Refusal == nil && pl.plan.SQL != "" && misreadsNonASCII(c) && !isASCII(pl.plan.SQL) {
		// The fence spells guarded names and epoch columns in UTF-8 (and
		// the rewrite may be another session's, from the cache), which
		// this session's server would read as other names, even from an
		// ASCII text (U&"..."): refuse rather than send it.
		pl, params = p.newPlanned(st, sql, sqlrewrite.Refuse(&sqlrewrite.Refusal{Code: "0A000",
			Message: "pgfence: writes to guarded tables whose names or epoch columns are not ASCII " + msgNeedUTF8 +
				encodingOf(c) + " (the fence names them)",
			Hint: hintEncoding})), nil
	}
	res := pl.res
	plan := pl.plan
	plan.Forget = forget
	plan.Params = params
	switch {
	case res.Refusal != nil:
		p.m.refused.Inc(shardOf(c))
		p.log.Info("statement refused", "code", res.Refusal.Code, "reason", res.Refusal.Message,
			"client", c.RemoteAddr, "application_name", c.ApplicationName())
		return plan, pl
	case pl.plan.SQL == "" && len(pl.plan.Probes) == 0:
		p.m.passthrough.Inc(shardOf(c))
	default:
		p.m.fenced.Inc(shardOf(c))
		if plan.ParamTypes != nil {
			p.m.bound.Inc(shardOf(c))
		}
	}
	sess.remember(res.Prepared)
	for _, f := range res.Fenced {
		if f.Backstop {
			continue // fenced by the database's triggers, not let through unfenced
		}
		switch f.Kind {
		case "TRUNCATE", "COPY FROM", "CURRENT OF":
			p.counter(c, unfencedSeries, f.Table, f.Kind, "", "").Inc(shardOf(c))
			p.log.Warn("unfenced write let through by configuration", "table", f.Table, "form", f.Kind,
				"client", c.RemoteAddr, "application_name", c.ApplicationName())
		}
	}
	return plan, pl
}

// readOnly reports, from its analysis a, that sql spells no write keyword
// (see sqlrewrite.Writes) and is no DDL that may weaken a guarded table's
// backstop (sqlrewrite.MayBeDDL): a query of a guarded table, which then
// needs neither the rewriter nor the cache. Postgres converts other client
// encodings to UTF8 before it parses, so the bytes are taken for what the
// server reads only in an encoding that needs no conversion, or when they
// are all ASCII.
func readOnly(c *proxy.Client, sql string, a *sqlrewrite.Analysis) bool {
	if a.Class.Has(sqlrewrite.Writes) || a.MayBeDDL() {
		return false
	}
	enc := c.ClientEncoding()
	return enc == "UTF8" || enc == "SQL_ASCII" || isASCII(sql)
}

// planned is a rewrite and the proxy plan made from it, cached together so
// that a cache hit allocates nothing.
type planned struct {
	res  *sqlrewrite.Result
	plan proxy.Plan
	// params, for a whole text in state.texts, are the values it binds to
	// its template's plan (see boundPlan).
	params []string
	// keep, for a template in state.bound, says that it has no plan but
	// the template with these strings left in the text may (see
	// sqlrewrite.StringsToKeep).
	keep []int
	// tx, behind a transaction pooler, is where plan.SQL starts
	// transactions of its own, found at its first use (see
	// planned.txStarts): a cache hit would otherwise parse the rewrite
	// again. Atomic, as sessions relayed by goroutines share a shard's
	// caches; nil until found, which is never taken for none.
	tx atomic.Pointer[txStarts]
}

// newPlanned makes the plan of res, the rewrite of sql, which it may keep.
func (p *Policy) newPlanned(st *state, sql string, res *sqlrewrite.Result) *planned {
	pl := &planned{res: res}
	if res.SQL != sql {
		pl.plan.SQL = res.SQL // a rewrite, or a refusal the server raises
		if res.Refusal == nil {
			pl.plan.Origin = textOrigin{res, sql}
		}
		// pgfence's rewrite made the text costlier for Postgres to parse
		// and plan; a session that parses it again and again may reuse one
		// server-side statement of it instead.
		pl.plan.Reuse = res.NoRows && res.Refusal == nil
	}
	if res.Refusal != nil || len(res.Probes) == 0 {
		return pl
	}
	pl.plan.Probes = make([]proxy.ProbeAt, len(res.Probes))
	for i, pr := range res.Probes {
		pl.plan.Probes[i] = proxy.ProbeAt{Index: pr.Index, Probe: p.probe(st, pr)}
	}
	return pl
}

// rewrite returns sql's rewrite and plan, from the cache when it can. For
// a simple-protocol write it may instead return the plan of sql's
// parameterized form with the values to bind to it (see boundPlan).
func (p *Policy) rewrite(st *state, c *proxy.Client, sess *session, sql string, mode sqlrewrite.Mode, forget bool, a *sqlrewrite.Analysis) (*planned, []string) {
	if ref := unreadable(st, c, sql); ref != nil {
		return p.newPlanned(st, sql, sqlrewrite.Refuse(ref)), nil
	}
	key := cacheKey{mode, sql}
	cs := st.cachesOf(c)
	cacheable := cs != nil && len(sql) <= maxCachedText
	if cacheable {
		if pl, ok := cs.cache.Get(key); ok {
			p.m.cacheHits.Inc(shardOf(c))
			return pl, nil
		}
	}
	// A text longer than --max-parse-size is not bound: its literals' scan
	// may need Postgres's scanner, and the rewrite refuses it anyway.
	if mode == sqlrewrite.Simple && cs != nil && !forget && !sess.mayExecute(a.Class) && !c.SimpleOnly() &&
		(st.cfg.MaxParse <= 0 || len(sql) <= st.cfg.MaxParse) {
		if pl, ok := cs.texts.Get(sql); ok {
			p.m.cacheHits.Inc(shardOf(c))
			return pl, pl.params
		}
		b := &sess.bind
		b.p, b.st, b.cs, b.c, b.last = p, st, cs, c, nil
		par, ok, writes := sqlrewrite.BindLiterals(sql, a.Class, b)
		if !writes && !a.MayBeDDL() {
			// What Rewrite would say, without scanning the text again.
			p.m.cacheMisses.Inc(shardOf(c))
			text := strings.Clone(sql) // kept: see proxy.Interceptor
			pl := &planned{res: &sqlrewrite.Result{SQL: text}}
			if cacheable {
				cs.cache.Add(cacheKey{mode, text}, pl)
			}
			return pl, nil
		}
		if pl := b.last; ok && writes {
			if cacheable && cs.seen.again(sql) { // a text sent again is then a plain cache hit
				whole := &planned{res: pl.res, plan: pl.plan, params: make([]string, len(par.Values))}
				for i, v := range par.Values {
					whole.params[i] = strings.Clone(v)
				}
				cs.texts.Add(strings.Clone(sql), whole)
			}
			return pl, par.Values
		}
	}
	if cacheable {
		p.m.cacheMisses.Inc(shardOf(c))
	}
	return p.rewriteText(st, cs, c, sess, sql, key, cacheable, a), nil
}

// boundPlan returns the plan of a parameterized simple-protocol write, nil
// when its text must be rewritten as sent, or a planned with only keep set
// when some of its strings must stay in the text. Its literals change with
// every execution, so the plan is cached by template, where a text with
// new literals finds it, and the proxy prepares its rewrite once per
// session.
// binder plans templates for sqlrewrite.BindLiterals through the policy's
// caches (boundPlan); last is the plan of the last template it planned.
// Each session has one, so that planning allocates no closure.
type binder struct {
	p    *Policy
	st   *state
	cs   *caches
	c    *proxy.Client
	last *planned
}

func (b *binder) PlanTemplate(par sqlrewrite.Parameterized) (bool, []int) {
	pl := b.p.boundPlan(b.st, b.cs, b.c, par)
	b.last = pl
	if pl == nil {
		return false, nil
	}
	return pl.keep == nil, pl.keep
}

func (p *Policy) boundPlan(st *state, cs *caches, c *proxy.Client, par sqlrewrite.Parameterized) *planned {
	if par.SQL == "" || len(par.SQL) > maxCachedText {
		return nil
	}
	key := boundKey(par)
	if pl, ok := cs.bound.Get(key); ok {
		if pl != nil && pl.keep == nil {
			p.m.cacheHits.Inc(shardOf(c))
		}
		return pl
	}
	res, ok, err := st.rw.RewriteTemplate(par)
	if err != nil {
		p.log.Error("rewriter failed on a parameterized write; rewriting it as sent", "err", err, "client", c.RemoteAddr)
	}
	var pl *planned
	if ok {
		p.m.cacheMisses.Inc(shardOf(c))
		pl = p.newPlanned(st, par.SQL, res)
		pl.plan.Reuse = false // Params says it: see proxy.Plan
		pl.plan.ParamTypes = paramTypes(par.Types)
		pl.plan.Origin = nil
		if tp := par.Positions(res); tp != nil {
			pl.plan.Origin = templateOrigin{tp}
		}
	} else if keep := sqlrewrite.StringsToKeep(par); keep != nil && err == nil {
		pl = &planned{keep: keep}
	}
	cs.bound.Add(key, pl)
	return pl
}

// boundKey is the cache key of a template: its text and parameter types
// (the same text with a bigger literal binds another type).
func boundKey(par sqlrewrite.Parameterized) string {
	var b strings.Builder
	b.Grow(len(par.SQL) + 1 + 4*len(par.Types))
	b.WriteString(par.SQL)
	b.WriteByte(0)
	for _, t := range par.Types {
		b.WriteString(strconv.FormatUint(uint64(t), 10))
		b.WriteByte(',')
	}
	return b.String()
}

// textOrigin maps error positions in the rewrite res of sql back to sql.
type textOrigin struct {
	res *sqlrewrite.Result
	sql string
}

func (o textOrigin) Position(c *proxy.Client, pos int, _ []string) int {
	return o.res.Position(o.sql, pos, countsBytes(c))
}

func (textOrigin) Param(*proxy.Client, int, []string) int { return 0 }

// templateOrigin maps error positions in the rewrite of a template back to
// the text whose literals were bound to it.
type templateOrigin struct{ tp *sqlrewrite.TemplatePositions }

func (o templateOrigin) Position(c *proxy.Client, pos int, params []string) int {
	return o.tp.Position(pos, params, countsBytes(c))
}

func (o templateOrigin) Param(c *proxy.Client, n int, params []string) int {
	return o.tp.Param(n, params, countsBytes(c))
}

// countsBytes reports whether c's server counts error positions in bytes
// rather than characters.
func countsBytes(c *proxy.Client) bool { return c.ServerEncoding() == "SQL_ASCII" }

// paramTypes encodes the parameter-type section of a Parse message.
func paramTypes(oids []uint32) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(oids)))
	for _, o := range oids {
		b = binary.BigEndian.AppendUint32(b, o)
	}
	return b
}

// rewriteText rewrites sql as sent and caches the outcome under key.
func (p *Policy) rewriteText(st *state, cs *caches, c *proxy.Client, sess *session, sql string, key cacheKey, cacheable bool, a *sqlrewrite.Analysis) *planned {
	mode := key.mode
	// The proxy's text is only lent (see proxy.Interceptor): the rewrite
	// and the cache keep this copy.
	sql = strings.Clone(sql)
	key.sql = sql
	if c.ClientEncoding() == "UTF8" && !utf8.ValidString(sql) {
		// Postgres rejects the whole text (22021) before it parses any of
		// it, so it writes nothing: let Postgres say so, as it would
		// without pgfence, rather than refuse it for pg_query's sake.
		return &planned{res: &sqlrewrite.Result{SQL: sql}}
	}
	var s sqlrewrite.Session
	if len(sess.prepared) > 0 {
		s = sess
	}
	res, err := st.rw.RewriteAnalyzed(sql, mode, s, a)
	if err != nil {
		// Never forward a statement the rewriter could not judge.
		p.log.Error("rewriter failed; refusing the statement", "err", err, "client", c.RemoteAddr)
		return p.newPlanned(st, sql, sqlrewrite.Refuse(&sqlrewrite.Refusal{Code: "XX000",
			Message: "pgfence: internal error while fencing this statement: " + err.Error(),
			Hint:    "please report this statement to the pgfence maintainers"}))
	}
	pl := p.newPlanned(st, sql, res)
	if cacheable && !res.SessionDependent {
		cs.cache.Add(key, pl)
	}
	return pl
}
