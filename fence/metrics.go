package fence

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/internal/loopstat"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Metrics are pgfence's Prometheus series. The counters a statement may
// touch on its way (queries, the caches, guarded writes, rejects, errors)
// are split per event loop (see internal/loopstat), so that loops on other
// cores never contend for one cache line, and resolved once, so a
// statement costs an uncontended atomic add, not a label lookup.
//
// The series of guarded tables and lock domains, and those of a
// configuration (guarded tables, discovery, backstop), carry a database
// label: each database's policy has a DatabaseMetrics of its own (see
// Database), so that a table of one name in two databases has two sets of
// series. The others count every database at once.
type Metrics struct {
	queries       *loopstat.CounterVec
	errors        *loopstat.CounterVec
	connsTotal    prometheus.Counter
	connsActive   prometheus.Gauge
	cacheHits     *loopstat.Counter
	cacheMisses   *loopstat.Counter
	bound         *loopstat.Counter
	setsAnswered  *loopstat.Counter
	probesOut     *loopstat.Counter
	passthrough   *loopstat.Counter
	fenced        *loopstat.Counter
	refused       *loopstat.Counter
	serverErrors  *loopstat.Counter
	fenceErrors   *loopstat.Counter
	sessionErrors *loopstat.Counter
	// all are the series with a database label, for every database: a
	// DatabaseMetrics holds them curried with its own.
	all struct {
		rejects       *loopstat.CounterVec
		withoutToken  *loopstat.CounterVec
		guardedWrites *loopstat.CounterVec
		unfenced      *loopstat.CounterVec
		guarded       *prometheus.GaugeVec
		discoveryOK   *prometheus.GaugeVec
		backstop      *prometheus.GaugeVec
		backstopOK    *prometheus.GaugeVec
		exposed       *prometheus.GaugeVec
		differs       *prometheus.GaugeVec
		unfenceable   *prometheus.GaugeVec
		// tokenGap is how far the epoch that beat a stale write was ahead
		// of its token; acceptedTable and acceptedDomain the highest token
		// a write went through with, per table and per lock domain.
		tokenGap       *loopstat.HistogramVec
		acceptedTable  *tokenMaxes
		acceptedDomain *tokenMaxes
		counts         *dbCounts
	}
	viewsMu sync.Mutex
	views   map[string]*DatabaseMetrics
}

// DatabaseMetrics are the series of one database's policy: its own, with
// its database label, and the Metrics every database shares.
type DatabaseMetrics struct {
	*Metrics
	database string // the label's value
	// The series of Metrics.all with this database's label curried in.
	rejects       loopstat.CurriedCounterVec
	withoutToken  loopstat.CurriedCounterVec
	guardedWrites loopstat.CurriedCounterVec
	unfenced      loopstat.CurriedCounterVec
	tokenGap      loopstat.CurriedHistogramVec
	guarded       prometheus.Gauge
	discoveryOK   prometheus.Gauge
	backstopOK    prometheus.Gauge
	// acceptedTable and acceptedDomain are Metrics.all's for this
	// database.
	acceptedTable  tokenMaxesOf
	acceptedDomain tokenMaxesOf
	// watched are the table and domain labels of the guards in force, so
	// that a reload retires the series of those no longer guarded.
	watchMu sync.Mutex
	watched map[string]bool
	domains map[string]bool
}

// tokenGapBuckets: a lease that expired under its holder is usually beaten
// by the next grant or few; large gaps mean a long pause, or tokens from
// two sources.
var tokenGapBuckets = []float64{1, 2, 3, 5, 10, 100, 1000, 10000, 100000, 1e6}

// NewMetrics registers pgfence's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *loopstat.CounterVec {
		return loopstat.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels...)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	cacheHits := counter("pgfence_rewrite_cache_hits_total", "Statements served from the rewrite cache.")
	cacheMisses := counter("pgfence_rewrite_cache_misses_total", "Statements parsed because the rewrite cache did not have them.")
	bound := counter("pgfence_bound_queries_total",
		"Fenced simple-protocol writes run as a statement prepared once per session and bound to their literals, rather than rewritten as sent.")
	setsAnswered := counter("pgfence_token_sets_answered_total",
		"SETs of the fencing token that pgfence answered itself, setting the token on the server ahead of the client's next statement (set_config), rather than forwarded to it as sent.")
	probesOut := counter("pgfence_probes_left_out_total",
		"Fenced writes whose probe pgfence left out: it took their token from a SET it answered right ahead of them, and their stale rows from the notices the write raised (where the backstop's helpers are in place).")
	m := &Metrics{
		queries: counter("pgfence_queries_total",
			"Query and Parse messages by what pgfence did with them: passthrough, fenced or refused.",
			"action"),
		errors: counter("pgfence_errors_total",
			"Errors by source: server (ErrorResponse from Postgres), fence (raised for pgfence), session (a client session ended abnormally).",
			"source"),
		connsTotal:   prometheus.NewCounter(prometheus.CounterOpts{Name: "pgfence_client_connections_total", Help: "Client sessions started."}),
		connsActive:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgfence_client_connections", Help: "Client sessions open now."}),
		cacheHits:    cacheHits.With(),
		cacheMisses:  cacheMisses.With(),
		bound:        bound.With(),
		setsAnswered: setsAnswered.With(),
		probesOut:    probesOut.With(),
		views:        map[string]*DatabaseMetrics{},
	}
	a := &m.all
	a.rejects = counter("fencing_reject_total",
		"Statements that a stale fencing token kept from changing at least one row they matched (mode=shadow: would have kept); kind=row when a row's epoch was newer, kind=domain when the table's lock domain had a newer token; via=rewrite when pgfence's rewrite of the statement kept them, via=backstop when the database's triggers did (a write pgfence could not see in the SQL text).",
		"database", "table", "mode", "kind", "via")
	a.withoutToken = counter("critical_write_without_token_total",
		"Writes to a guarded table made with no fencing token set; action says whether they were refused or let through.",
		"database", "table", "mode", "action")
	a.guardedWrites = counter("pgfence_guarded_writes_total",
		"Statements that wrote a guarded table and completed, by whether a fencing token was set.",
		"database", "table", "mode", "token")
	a.unfenced = counter("pgfence_unfenced_writes_total",
		"Writes to a guarded table let through unfenced by configuration (TRUNCATE, COPY FROM, CURRENT OF).",
		"database", "table", "form")
	a.guarded = gauge("pgfence_guarded_tables", "Guarded tables in force, per database.", "database")
	a.discoveryOK = gauge("pgfence_discovery_ok", "1 if the last catalog discovery of the database succeeded, 0 if it failed.", "database")
	a.backstop = gauge("pgfence_backstop_installed",
		"1 if the database backstop (pgfence's triggers) is in place, enabled and current on the guarded table, 0 if not (missing, disabled, edited, or pgfence's role may not create it): see the log and /readyz.",
		"database", "table")
	a.backstopOK = gauge("pgfence_backstop_ok",
		"1 if the database backstop is in place on every guarded table of the database (or is turned off), 0 if not.", "database")
	a.exposed = gauge("pgfence_backstop_owner_exposed",
		"1 for each guarded table whose owner is a role other than pgfence's while the DDL guard is not in place (pgfence's role is not a superuser): that owner can switch the table's backstop off, unseen until pgfence's next read of the catalog.",
		"database", "table", "owner")
	a.differs = gauge("pgfence_backstop_config_differs",
		"The settings in which this instance's configuration differs from the one the database records for its backstop (which every instance installs): 0 when they agree. Roll a change out with pgfence init.",
		"database")
	a.unfenceable = gauge("pgfence_guarded_table_unfenceable",
		"1 for each guarded table pgfence cannot fence (it has no epoch column, or one that is not an integer): its writes are refused, saying how to fix it (/readyz says it too).",
		"database", "table")
	a.counts = &dbCounts{dbs: map[string]*dbCount{}}
	a.tokenGap = loopstat.NewHistogramVec(prometheus.HistogramOpts{Name: "fencing_token_gap",
		Help:    "For each stale write fenced (on either path), the epoch or lock domain token that beat it minus the token it carried; kind as in fencing_reject_total.",
		Buckets: tokenGapBuckets}, "database", "table", "kind")
	a.acceptedTable = newTokenMaxes("pgfence_token_accepted_max",
		"The highest fencing token a write to the guarded table went through with, through this pgfence (0 until one does); take max() across instances.", "table")
	a.acceptedDomain = newTokenMaxes("pgfence_domain_token_accepted_max",
		"The highest fencing token a write to a table of the lock domain went through with, through this pgfence (0 until one does).", "domain")
	reg.MustRegister(a.rejects, a.withoutToken, a.guardedWrites, a.unfenced, a.guarded, a.discoveryOK,
		a.backstop, a.backstopOK, a.exposed, a.differs, a.unfenceable, a.counts, a.tokenGap, a.acceptedTable, a.acceptedDomain)
	reg.MustRegister(m.queries, m.errors, m.connsTotal, m.connsActive, cacheHits, cacheMisses, bound, setsAnswered, probesOut)
	m.passthrough = m.queries.With("passthrough")
	m.fenced = m.queries.With("fenced")
	m.refused = m.queries.With("refused")
	m.serverErrors = m.errors.With("server")
	m.fenceErrors = m.errors.With("fence")
	m.sessionErrors = m.errors.With("session")
	return m
}

// Database returns the series of database name, making its
// configuration's (guarded tables, discovery, backstop) exist at 0 on the
// first call. A Policy made by New, which serves every database, has
// those of database "".
func (m *Metrics) Database(name string) *DatabaseMetrics {
	// A label value must be UTF-8; a database name need not be.
	label := strings.ToValidUTF8(name, "\uFFFD")
	m.viewsMu.Lock()
	defer m.viewsMu.Unlock()
	if d := m.views[label]; d != nil {
		return d
	}
	a := &m.all
	d := &DatabaseMetrics{Metrics: m, database: label,
		rejects:        a.rejects.Curry(label),
		withoutToken:   a.withoutToken.Curry(label),
		guardedWrites:  a.guardedWrites.Curry(label),
		unfenced:       a.unfenced.Curry(label),
		tokenGap:       a.tokenGap.Curry(label),
		guarded:        a.guarded.WithLabelValues(label),
		discoveryOK:    a.discoveryOK.WithLabelValues(label),
		backstopOK:     a.backstopOK.WithLabelValues(label),
		acceptedTable:  tokenMaxesOf{a.acceptedTable, label},
		acceptedDomain: tokenMaxesOf{a.acceptedDomain, label},
	}
	m.views[label] = d
	return d
}

// Retire removes every series of the database, as when it is gone: a
// later Database call for it starts over.
func (d *DatabaseMetrics) Retire() {
	d.viewsMu.Lock()
	defer d.viewsMu.Unlock()
	if d.views[d.database] == d {
		delete(d.views, d.database)
	}
	a := &d.all
	db := prometheus.Labels{"database": d.database}
	a.rejects.DeletePartialMatch(db)
	a.withoutToken.DeletePartialMatch(db)
	a.guardedWrites.DeletePartialMatch(db)
	a.unfenced.DeletePartialMatch(db)
	a.tokenGap.DeletePartialMatch(db)
	a.guarded.DeletePartialMatch(db)
	a.discoveryOK.DeletePartialMatch(db)
	a.backstop.DeletePartialMatch(db)
	a.backstopOK.DeletePartialMatch(db)
	a.exposed.DeletePartialMatch(db)
	a.differs.DeletePartialMatch(db)
	a.unfenceable.DeletePartialMatch(db)
	a.acceptedTable.deleteDatabase(d.database)
	a.acceptedDomain.deleteDatabase(d.database)
	a.counts.delete(d.database)
}

// guards makes the series of gs exist at zero (see watch) and retires
// those of tables and lock domains no longer guarded: a table guarded by
// another name now (public.accounts once the catalog says what accounts
// is) keeps one set of series.
func (d *DatabaseMetrics) guards(gs []sqlrewrite.Guard) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	tables, domains := map[string]bool{}, map[string]bool{}
	for _, g := range gs {
		d.watch(g.Label(), g.Rollout.String(), g.Domain)
		tables[g.Label()] = true
		if g.Domain != "" {
			domains[g.Domain] = true
		}
	}
	a := &d.all
	a.unfenceable.DeletePartialMatch(prometheus.Labels{"database": d.database})
	for _, g := range gs {
		if g.Unfenceable != "" {
			a.unfenceable.WithLabelValues(d.database, g.Label()).Set(1)
		}
	}
	for t := range d.watched {
		if !tables[t] {
			l := prometheus.Labels{"database": d.database, "table": t}
			a.rejects.DeletePartialMatch(l)
			a.withoutToken.DeletePartialMatch(l)
			a.guardedWrites.DeletePartialMatch(l)
			a.unfenced.DeletePartialMatch(l)
			a.tokenGap.DeletePartialMatch(l)
			d.acceptedTable.delete(t)
		}
	}
	for dom := range d.domains {
		if !domains[dom] {
			d.acceptedDomain.delete(dom)
		}
	}
	d.watched, d.domains = tables, domains
}

// watch makes a table's main series exist from the start, at zero, so a
// dashboard can tell "no rejects" from "not guarded".
func (d *DatabaseMetrics) watch(table, mode, domain string) {
	// So that increase() sees a table's first write without a token, and
	// its first guarded write, these start at 0 too.
	for _, action := range []string{"refused", "allowed"} {
		d.withoutToken.With(table, mode, action)
	}
	for _, token := range []string{"set", "missing"} {
		d.guardedWrites.With(table, mode, token)
	}
	for _, via := range []string{"rewrite", "backstop"} {
		d.rejects.With(table, mode, "row", via)
		if domain != "" {
			d.rejects.With(table, mode, "domain", via)
		}
	}
	d.tokenGap.With(table, "row")
	d.acceptedTable.of(table)
	if domain != "" {
		d.tokenGap.With(table, "domain")
		d.acceptedDomain.of(domain)
	}
}

// DiscoveryOK records whether the database's catalog discovery worked.
func (d *DatabaseMetrics) DiscoveryOK(ok bool) {
	if ok {
		d.discoveryOK.Set(1)
	} else {
		d.discoveryOK.Set(0)
	}
}

// Backstop records the database backstop's state per table (schema.table)
// and overall; tables no longer listed lose their series.
func (d *DatabaseMetrics) Backstop(installed map[string]bool) {
	d.all.backstop.DeletePartialMatch(prometheus.Labels{"database": d.database})
	ok := 1.0
	for table, in := range installed {
		v := 0.0
		if in {
			v = 1
		} else {
			ok = 0
		}
		d.all.backstop.WithLabelValues(d.database, table).Set(v)
	}
	d.backstopOK.Set(ok)
}

// BackstopExposure records the guarded tables (schema.table) whose
// owners (the values) can switch their backstop off unseen; tables no
// longer listed lose their series.
func (d *DatabaseMetrics) BackstopExposure(owners map[string]string) {
	d.all.exposed.DeletePartialMatch(prometheus.Labels{"database": d.database})
	for table, owner := range owners {
		d.all.exposed.WithLabelValues(d.database, table, owner).Set(1)
	}
}

// BackstopDifferences records in how many settings this instance's
// configuration differs from the one the database records.
func (d *DatabaseMetrics) BackstopDifferences(n int) {
	d.all.differs.WithLabelValues(d.database).Set(float64(n))
}

// BackstopCounts records the backstop's counters as the database last
// showed them: stale rows its triggers kept out on every path, by table,
// and rows exempt roles wrote.
func (d *DatabaseMetrics) BackstopCounts(rejects map[string]int64, exempt int64) {
	c := d.all.counts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dbs[d.database] = &dbCount{rejects: rejects, exempt: exempt}
}

// dbCounts exports counters kept in each database, read at each discovery:
// Prometheus counters cannot be set, so it is a collector of its own.
type dbCounts struct {
	mu  sync.Mutex
	dbs map[string]*dbCount // by database label; absent until read
}

type dbCount struct {
	rejects map[string]int64
	exempt  int64
}

func (c *dbCounts) delete(database string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.dbs, database)
}

var (
	dbRejectsDesc = prometheus.NewDesc("pgfence_backstop_rejects_total",
		"Stale rows the database backstop kept out (mode=shadow: would have), on every path, direct connections included, as counted in the database and read at each discovery.",
		[]string{"database", "table"}, nil)
	dbExemptDesc = prometheus.NewDesc("pgfence_backstop_exempt_writes_total",
		"Rows written to guarded tables of the database without the fence by the backstop's exempt roles, as counted in the database and read at each discovery.",
		[]string{"database"}, nil)
)

func (c *dbCounts) Describe(ch chan<- *prometheus.Desc) {
	ch <- dbRejectsDesc
	ch <- dbExemptDesc
}

func (c *dbCounts) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for database, d := range c.dbs {
		for table, n := range d.rejects {
			ch <- prometheus.MustNewConstMetric(dbRejectsDesc, prometheus.CounterValue, float64(n), database, table)
		}
		ch <- prometheus.MustNewConstMetric(dbExemptDesc, prometheus.CounterValue, float64(d.exempt), database)
	}
}

// tokenMaxes is a gauge per database and label value that only rises: the
// highest token seen. Writes raise it with an atomic compare-and-swap, no
// lock.
type tokenMaxes struct {
	desc *prometheus.Desc
	m    sync.Map // [2]string{database, label value} -> *tokenMax
}

type tokenMax struct{ v atomic.Int64 }

func newTokenMaxes(name, help, label string) *tokenMaxes {
	return &tokenMaxes{desc: prometheus.NewDesc(name, help, []string{"database", label}, nil)}
}

// tokenMaxesOf are the gauges of one database.
type tokenMaxesOf struct {
	t        *tokenMaxes
	database string
}

// of returns the gauge for a label value, creating it at 0.
func (t tokenMaxesOf) of(label string) *tokenMax {
	key := [2]string{t.database, label}
	if v, ok := t.t.m.Load(key); ok {
		return v.(*tokenMax)
	}
	v, _ := t.t.m.LoadOrStore(key, &tokenMax{})
	return v.(*tokenMax)
}

func (t tokenMaxesOf) delete(label string) { t.t.m.Delete([2]string{t.database, label}) }

func (t *tokenMaxes) deleteDatabase(database string) {
	t.m.Range(func(k, _ any) bool {
		if k.([2]string)[0] == database {
			t.m.Delete(k)
		}
		return true
	})
}

func (m *tokenMax) raise(token int64) {
	for {
		cur := m.v.Load()
		if token <= cur || m.v.CompareAndSwap(cur, token) {
			return
		}
	}
}

func (t *tokenMaxes) Describe(ch chan<- *prometheus.Desc) { ch <- t.desc }

func (t *tokenMaxes) Collect(ch chan<- prometheus.Metric) {
	t.m.Range(func(k, v any) bool {
		key := k.([2]string)
		ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, float64(v.(*tokenMax).v.Load()), key[0], key[1])
		return true
	})
}
