package fence

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Databases is a proxy.Interceptor that fences each session with the
// Policy of the database it connects to: a table is guarded, and how, by
// what its own database's catalog says, and a table of the same name in
// another database is another table. Route picks the policy once, at
// SessionStart, or, for a database pgfence has no policy for yet, at the
// session's first statement, which waits for Await first: the first read
// of a database's catalog (which may install the backstop there) is
// started only once Postgres has authenticated a client of it. The
// session keeps its policy to its end.
type Databases struct {
	m *Metrics
	Routes
	// gen is the generation of every policy made by New: a prepared
	// statement is planned again after any of them reloads, which costs a
	// plan (usually a cache hit) and keeps Generation one atomic load.
	gen atomic.Uint64
}

// codeNoPolicy is the SQLSTATE of every statement of a session Route found
// no policy for.
const codeNoPolicy = "08004"

// Routes are how a Databases finds a session's policy.
type Routes struct {
	// Policy returns the policy (made by New) of a session's database, or
	// nil when there is none.
	Policy func(*proxy.Client) *Policy
	// Await, if not nil, returns, for a session Policy found none for, a
	// channel closed once pgfence has tried to make one (read the
	// database's catalog); the session's first statement (or FunctionCall)
	// waits for it, after the server has answered what came before: its
	// authentication. If Policy still finds none then, every statement of
	// the session is refused (fail closed), as pgfence cannot tell which
	// of its tables to fence, saying why: Why, if not nil, says.
	Await func(*proxy.Client) <-chan struct{}
	Why   func(*proxy.Client) string
}

// NewDatabases returns a Databases reporting to m, finding each session's
// policy by r.
func NewDatabases(m *Metrics, r Routes) *Databases {
	return &Databases{m: m, Routes: r}
}

// New returns a policy for cfg, for the sessions of database name, with
// series labelled database=name (see Metrics.Database).
func (d *Databases) New(name string, cfg Config, log *slog.Logger) (*Policy, error) {
	return newPolicy(cfg, d.m.Database(name), log, &d.gen)
}

// unrouted is the Local of a session Route found no policy for.
type unrouted struct{ database string }

// policyOf returns the session's policy, nil for an unrouted one.
func policyOf(c *proxy.Client) *Policy {
	if s, ok := c.Local.(*session); ok {
		return s.policy
	}
	return nil
}

// SessionStart implements proxy.Interceptor.
func (d *Databases) SessionStart(c *proxy.Client) {
	if p := d.Policy(c); p != nil {
		p.SessionStart(c)
		return
	}
	c.Local = unrouted{database: c.Database}
	d.m.connsTotal.Inc()
	d.m.connsActive.Inc()
	if d.Await != nil {
		c.HoldNextStatement(func() <-chan struct{} { return d.Await(c) })
	}
}

// policyFor returns the session's policy, taking the one of its database
// if it has none yet and there is one now (see Databases), nil if it has
// none.
func (d *Databases) policyFor(c *proxy.Client) *Policy {
	if p := policyOf(c); p != nil {
		return p
	}
	if _, ok := c.Local.(unrouted); !ok {
		return nil
	}
	p := d.Policy(c)
	if p != nil {
		c.Local = &session{policy: p} // counted at SessionStart already
	}
	return p
}

// SessionEnd implements proxy.Interceptor.
func (d *Databases) SessionEnd(c *proxy.Client, err error) {
	if p := policyOf(c); p != nil {
		p.SessionEnd(c, err)
		return
	}
	d.m.connsActive.Dec()
	if err != nil {
		d.m.sessionErrors.Inc(shardOf(c))
	}
}

// Query implements proxy.Interceptor.
func (d *Databases) Query(c *proxy.Client, sql string) proxy.Plan {
	if p := d.policyFor(c); p != nil {
		return p.Query(c, sql)
	}
	return d.refuse(c)
}

// Parse implements proxy.Interceptor.
func (d *Databases) Parse(c *proxy.Client, sql string) proxy.Plan {
	if p := d.policyFor(c); p != nil {
		return p.Parse(c, sql)
	}
	return d.refuse(c)
}

func (d *Databases) refuse(c *proxy.Client) proxy.Plan {
	d.m.refused.Inc(shardOf(c))
	db, _ := c.Local.(unrouted)
	why := "reconnect"
	if d.Why != nil {
		why = d.Why(c)
	}
	ref := &sqlrewrite.Refusal{Code: codeNoPolicy, Message: fmt.Sprintf(
		"pgfence has no fencing policy for database %q, so it cannot tell which of its tables to fence: %s", db.database, why)}
	return proxy.Plan{SQL: sqlrewrite.Refuse(ref).SQL}
}

// Error implements proxy.Interceptor.
func (d *Databases) Error(c *proxy.Client, e *pgproto3.ErrorResponse) *pgproto3.ErrorResponse {
	if p := policyOf(c); p != nil {
		return p.Error(c, e)
	}
	r, ok := sqlrewrite.ParseErrorMarker(e.Code, e.Message)
	if !ok {
		d.m.serverErrors.Inc(shardOf(c))
		return nil
	}
	d.m.fenceErrors.Inc(shardOf(c))
	return &pgproto3.ErrorResponse{Severity: e.Severity, SeverityUnlocalized: e.SeverityUnlocalized, Code: r.Code, Message: r.Message}
}

// Notice implements proxy.Interceptor.
func (d *Databases) Notice(c *proxy.Client, n *pgproto3.NoticeResponse) bool {
	if p := policyOf(c); p != nil {
		return p.Notice(c, n)
	}
	return true
}

// SettingAnswered implements proxy.Interceptor.
func (d *Databases) SettingAnswered(c *proxy.Client, set *proxy.Setting) {
	if p := policyOf(c); p != nil {
		p.SettingAnswered(c, set)
	}
}

// DependsOnReading implements proxy.Interceptor: the session's policy's
// answer (a session without one has every statement refused).
func (d *Databases) DependsOnReading(c *proxy.Client, sql string) bool {
	if p := d.policyFor(c); p != nil {
		return p.DependsOnReading(c, sql)
	}
	return false
}

// ReadingProbe implements proxy.Interceptor.
func (d *Databases) ReadingProbe() *proxy.Probe { return readingProbe }

// PooledSet implements proxy.PooledSets: the session's policy's. A
// session without one sets no token setting (every statement it sends is
// refused).
func (d *Databases) PooledSet(c *proxy.Client) *proxy.PooledSet {
	if p := policyOf(c); p != nil {
		return p.PooledSet(c)
	}
	return noPooledSet
}

// noPooledSet sets no token setting.
var noPooledSet = func() *proxy.PooledSet {
	ext, text := sqlrewrite.PooledSetSQL(nil)
	set, err := proxy.NewPooledSet(nil, ext, text)
	if err != nil {
		panic(err)
	}
	return set
}()

// Generation implements proxy.Interceptor: it changes whenever a policy
// made by New reloads.
func (d *Databases) Generation() uint64 { return d.gen.Load() }

var (
	_ proxy.Interceptor = (*Databases)(nil)
	_ proxy.PooledSets  = (*Databases)(nil)
)
