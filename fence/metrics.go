package fence

import "github.com/prometheus/client_golang/prometheus"

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
}

// NewMetrics registers pgfence's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		rejects: counter("fencing_reject_total",
			"Statements that a stale fencing token kept from changing at least one row they matched (mode=shadow: would have kept); kind=row when a row's epoch was newer, kind=domain when the table's lock domain had a newer token.",
			"table", "mode", "kind"),
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
			Help: "SETs of the fencing token that pgfence answered itself, setting the token on the server ahead of the client's next statement (set_config), rather than forwarded (see --forward-token-sets)."}),
	}
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

// watch makes a table's main series exist from the start, at zero, so a
// dashboard can tell "no rejects" from "not guarded".
func (m *Metrics) watch(table, mode string, domain bool) {
	m.rejects.WithLabelValues(table, mode, "row")
	if domain {
		m.rejects.WithLabelValues(table, mode, "domain")
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
