package fence

import "github.com/prometheus/client_golang/prometheus"

// Metrics are pgfence's Prometheus series. Counters that the hot path
// touches are resolved once, so a statement costs an atomic add, not a label
// lookup.
type Metrics struct {
	rejects       *prometheus.CounterVec
	withoutToken  *prometheus.CounterVec
	queries       *prometheus.CounterVec
	errors        *prometheus.CounterVec
	connsTotal    prometheus.Counter
	connsActive   prometheus.Gauge
	passthrough   prometheus.Counter
	fenced        prometheus.Counter
	refused       prometheus.Counter
	serverErrors  prometheus.Counter
	fenceErrors   prometheus.Counter
	sessionErrors prometheus.Counter
}

// NewMetrics registers pgfence's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencing_reject_total",
			Help: "Statements that a stale fencing token kept from changing at least one row they matched.",
		}, []string{"table"}),
		withoutToken: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "critical_write_without_token_total",
			Help: "Writes to a guarded table made with no fencing token set (refused).",
		}, []string{"table"}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgfence_queries_total",
			Help: "Query and Parse messages by what pgfence did with them: passthrough, fenced or refused.",
		}, []string{"action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgfence_errors_total",
			Help: "Errors by source: server (ErrorResponse from Postgres), fence (raised by pgfence), session (a client session ended abnormally).",
		}, []string{"source"}),
		connsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgfence_client_connections_total",
			Help: "Client sessions started.",
		}),
		connsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pgfence_client_connections",
			Help: "Client sessions open now.",
		}),
	}
	reg.MustRegister(m.rejects, m.withoutToken, m.queries, m.errors, m.connsTotal, m.connsActive)
	m.passthrough = m.queries.WithLabelValues("passthrough")
	m.fenced = m.queries.WithLabelValues("fenced")
	m.refused = m.queries.WithLabelValues("refused")
	m.serverErrors = m.errors.WithLabelValues("server")
	m.fenceErrors = m.errors.WithLabelValues("fence")
	m.sessionErrors = m.errors.WithLabelValues("session")
	return m
}

// watch makes a table's series exist from the start, at zero, so a
// dashboard can tell "no rejects" from "not guarded".
func (m *Metrics) watch(table string) {
	m.rejects.WithLabelValues(table)
	m.withoutToken.WithLabelValues(table)
}
