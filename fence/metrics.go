package fence

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// Metrics are pgfence's Prometheus series. Counters that every statement
// touches are resolved once, so a statement costs an atomic add, not a label
// lookup.
type Metrics struct {
	rejects       *prometheus.CounterVec
	withoutToken  *prometheus.CounterVec
	guardedWrites *prometheus.CounterVec
	unfenced      *prometheus.CounterVec
	queries       *prometheus.CounterVec
	errors        *prometheus.CounterVec
	connsTotal    prometheus.Counter
	connsActive   prometheus.Gauge
	guarded       prometheus.Gauge
	discoveryOK   prometheus.Gauge
	cacheHits     prometheus.Counter
	cacheMisses   prometheus.Counter
	bound         prometheus.Counter
	setsAnswered  prometheus.Counter
	passthrough   prometheus.Counter
	fenced        prometheus.Counter
	refused       prometheus.Counter
	serverErrors  prometheus.Counter
	fenceErrors   prometheus.Counter
	sessionErrors prometheus.Counter
	backstop      *prometheus.GaugeVec
	backstopOK    prometheus.Gauge
	dbCounts      *dbCounts
	// tokenGap is how far the epoch that beat a stale write was ahead of
	// its token; acceptedTable and acceptedDomain the highest token a
	// write went through with, per table and per lock domain.
	tokenGap       *prometheus.HistogramVec
	acceptedTable  *tokenMaxes
	acceptedDomain *tokenMaxes
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
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		rejects: counter("fencing_reject_total",
			"Statements that a stale fencing token kept from changing at least one row they matched (mode=shadow: would have kept); kind=row when a row's epoch was newer, kind=domain when the table's lock domain had a newer token; via=rewrite when pgfence's rewrite of the statement kept them, via=backstop when the database's triggers did (a write pgfence could not see in the SQL text).",
			"table", "mode", "kind", "via"),
		withoutToken: counter("critical_write_without_token_total",
			"Writes to a guarded table made with no fencing token set; action says whether they were refused or let through.",
			"table", "mode", "action"),
		guardedWrites: counter("pgfence_guarded_writes_total",
			"Statements that wrote a guarded table and completed, by whether a fencing token was set.",
			"table", "mode", "token"),
		unfenced: counter("pgfence_unfenced_writes_total",
			"Writes to a guarded table let through unfenced by configuration (TRUNCATE, COPY FROM, CURRENT OF).",
			"table", "form"),
		queries: counter("pgfence_queries_total",
			"Query and Parse messages by what pgfence did with them: passthrough, fenced or refused.",
			"action"),
		errors: counter("pgfence_errors_total",
			"Errors by source: server (ErrorResponse from Postgres), fence (raised for pgfence), session (a client session ended abnormally).",
			"source"),
		connsTotal:  prometheus.NewCounter(prometheus.CounterOpts{Name: "pgfence_client_connections_total", Help: "Client sessions started."}),
		connsActive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgfence_client_connections", Help: "Client sessions open now."}),
		guarded:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgfence_guarded_tables", Help: "Guarded tables in force."}),
		discoveryOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgfence_discovery_ok", Help: "1 if the last catalog discovery succeeded, 0 if it failed."}),
		cacheHits:   prometheus.NewCounter(prometheus.CounterOpts{Name: "pgfence_rewrite_cache_hits_total", Help: "Statements served from the rewrite cache."}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgfence_rewrite_cache_misses_total", Help: "Statements parsed because the rewrite cache did not have them."}),
		bound: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgfence_bound_queries_total",
			Help: "Fenced simple-protocol writes run as a statement prepared once per session and bound to their literals, rather than rewritten as sent."}),
		setsAnswered: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgfence_token_sets_answered_total",
			Help: "SETs of the fencing token that pgfence answered itself, setting the token on the server ahead of the client's next statement (set_config), rather than forwarded to it as sent."}),
	}
	m.backstop = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgfence_backstop_installed",
		Help: "1 if the database backstop (pgfence's triggers) is in place, enabled and current on the guarded table, 0 if not (missing, disabled, edited, or pgfence's role may not create it): see the log and /readyz."},
		[]string{"table"})
	m.backstopOK = prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgfence_backstop_ok",
		Help: "1 if the database backstop is in place on every guarded table (or is turned off), 0 if not."})
	m.dbCounts = &dbCounts{}
	m.tokenGap = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fencing_token_gap",
		Help:    "For each stale write fenced (on either path), the epoch or lock domain token that beat it minus the token it carried; kind as in fencing_reject_total.",
		Buckets: tokenGapBuckets}, []string{"table", "kind"})
	m.acceptedTable = newTokenMaxes("pgfence_token_accepted_max",
		"The highest fencing token a write to the guarded table went through with, through this pgfence (0 until one does); take max() across instances.", "table")
	m.acceptedDomain = newTokenMaxes("pgfence_domain_token_accepted_max",
		"The highest fencing token a write to a table of the lock domain went through with, through this pgfence (0 until one does).", "domain")
	reg.MustRegister(m.backstop, m.backstopOK, m.dbCounts, m.tokenGap, m.acceptedTable, m.acceptedDomain)
	reg.MustRegister(m.rejects, m.withoutToken, m.guardedWrites, m.unfenced, m.queries, m.errors,
		m.connsTotal, m.connsActive, m.guarded, m.discoveryOK, m.cacheHits, m.cacheMisses, m.bound, m.setsAnswered)
	m.passthrough = m.queries.WithLabelValues("passthrough")
	m.fenced = m.queries.WithLabelValues("fenced")
	m.refused = m.queries.WithLabelValues("refused")
	m.serverErrors = m.errors.WithLabelValues("server")
	m.fenceErrors = m.errors.WithLabelValues("fence")
	m.sessionErrors = m.errors.WithLabelValues("session")
	return m
}

// guards makes the series of gs exist at zero (see watch) and retires
// those of tables and lock domains no longer guarded: a table guarded by
// another name now (public.accounts once the catalog says what accounts
// is) keeps one set of series.
func (m *Metrics) guards(gs []sqlrewrite.Guard) {
	m.watchMu.Lock()
	defer m.watchMu.Unlock()
	tables, domains := map[string]bool{}, map[string]bool{}
	for _, g := range gs {
		m.watch(g.Label(), g.Rollout.String(), g.Domain)
		tables[g.Label()] = true
		if g.Domain != "" {
			domains[g.Domain] = true
		}
	}
	for t := range m.watched {
		if !tables[t] {
			l := prometheus.Labels{"table": t}
			m.rejects.DeletePartialMatch(l)
			m.withoutToken.DeletePartialMatch(l)
			m.guardedWrites.DeletePartialMatch(l)
			m.unfenced.DeletePartialMatch(l)
			m.tokenGap.DeletePartialMatch(l)
			m.acceptedTable.m.Delete(t)
		}
	}
	for d := range m.domains {
		if !domains[d] {
			m.acceptedDomain.m.Delete(d)
		}
	}
	m.watched, m.domains = tables, domains
}

// watch makes a table's main series exist from the start, at zero, so a
// dashboard can tell "no rejects" from "not guarded".
func (m *Metrics) watch(table, mode, domain string) {
	// So that increase() sees a table's first write without a token, and
	// its first guarded write, these start at 0 too.
	for _, action := range []string{"refused", "allowed"} {
		m.withoutToken.WithLabelValues(table, mode, action)
	}
	for _, token := range []string{"set", "missing"} {
		m.guardedWrites.WithLabelValues(table, mode, token)
	}
	for _, via := range []string{"rewrite", "backstop"} {
		m.rejects.WithLabelValues(table, mode, "row", via)
		if domain != "" {
			m.rejects.WithLabelValues(table, mode, "domain", via)
		}
	}
	m.tokenGap.WithLabelValues(table, "row")
	m.acceptedTable.of(table)
	if domain != "" {
		m.tokenGap.WithLabelValues(table, "domain")
		m.acceptedDomain.of(domain)
	}
}

// DiscoveryOK records whether catalog discovery worked.
func (m *Metrics) DiscoveryOK(ok bool) {
	if ok {
		m.discoveryOK.Set(1)
	} else {
		m.discoveryOK.Set(0)
	}
}

// Backstop records the database backstop's state per table (schema.table)
// and overall; tables no longer listed lose their series.
func (m *Metrics) Backstop(installed map[string]bool) {
	m.backstop.Reset()
	ok := 1.0
	for table, in := range installed {
		v := 0.0
		if in {
			v = 1
		} else {
			ok = 0
		}
		m.backstop.WithLabelValues(table).Set(v)
	}
	m.backstopOK.Set(ok)
}

// BackstopCounts records the backstop's counters as the database last
// showed them: stale rows its triggers kept out on every path, by table,
// and rows exempt roles wrote.
func (m *Metrics) BackstopCounts(rejects map[string]int64, exempt int64) {
	m.dbCounts.mu.Lock()
	defer m.dbCounts.mu.Unlock()
	m.dbCounts.rejects, m.dbCounts.exempt, m.dbCounts.known = rejects, exempt, true
}

// dbCounts exports counters kept in the database, read at each discovery:
// Prometheus counters cannot be set, so it is a collector of its own.
type dbCounts struct {
	mu      sync.Mutex
	known   bool
	rejects map[string]int64
	exempt  int64
}

var (
	dbRejectsDesc = prometheus.NewDesc("pgfence_backstop_rejects_total",
		"Stale rows the database backstop kept out (mode=shadow: would have), on every path, direct connections included, as counted in the database and read at each discovery.",
		[]string{"table"}, nil)
	dbExemptDesc = prometheus.NewDesc("pgfence_backstop_exempt_writes_total",
		"Rows written to guarded tables without the fence by the backstop's exempt roles, as counted in the database and read at each discovery.",
		nil, nil)
)

func (d *dbCounts) Describe(ch chan<- *prometheus.Desc) {
	ch <- dbRejectsDesc
	ch <- dbExemptDesc
}

func (d *dbCounts) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.known {
		return
	}
	for table, n := range d.rejects {
		ch <- prometheus.MustNewConstMetric(dbRejectsDesc, prometheus.CounterValue, float64(n), table)
	}
	ch <- prometheus.MustNewConstMetric(dbExemptDesc, prometheus.CounterValue, float64(d.exempt))
}

// tokenMaxes is a gauge per label value that only rises: the highest token
// seen. Writes raise it with an atomic compare-and-swap, no lock.
type tokenMaxes struct {
	desc *prometheus.Desc
	m    sync.Map // label value -> *tokenMax
}

type tokenMax struct{ v atomic.Int64 }

func newTokenMaxes(name, help, label string) *tokenMaxes {
	return &tokenMaxes{desc: prometheus.NewDesc(name, help, []string{label}, nil)}
}

// of returns the gauge for a label value, creating it at 0.
func (t *tokenMaxes) of(label string) *tokenMax {
	if v, ok := t.m.Load(label); ok {
		return v.(*tokenMax)
	}
	v, _ := t.m.LoadOrStore(label, &tokenMax{})
	return v.(*tokenMax)
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
		ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, float64(v.(*tokenMax).v.Load()), k.(string))
		return true
	})
}
