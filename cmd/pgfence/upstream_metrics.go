package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/proxy"
)

// upstreamCheckTimeout bounds the check each scrape of pgfence_upstream_up
// runs, well inside Prometheus's default scrape timeout (10 s): an
// upstream that does not answer in time counts as down.
const upstreamCheckTimeout = 2 * time.Second

// healthzUpstreamWait bounds /healthz's note on whether Postgres is
// reachable, so that the liveness answer never waits on Postgres.
const healthzUpstreamWait = 500 * time.Millisecond

var upstreamUpDesc = prometheus.NewDesc("pgfence_upstream_up",
	"1 if the Postgres that client sessions go to now answers pgfence's role and is a writable primary (what /readyz checks), 0 if not: unreachable, refusing pgfence's role, or read-only (a standby, default_transaction_read_only). Checked at each scrape, with a 2 s timeout.",
	nil, nil)

// upstreamCollector exports pgfence_upstream_up, from the check /readyz
// makes (see (*instance).readiness), run at each scrape.
type upstreamCollector struct{ i *instance }

// newUpstreamCollector returns the collector of pgfence_upstream_up for i.
// Register it once i is complete, hosts included (its Collect calls
// i.readiness).
func newUpstreamCollector(i *instance) prometheus.Collector {
	return upstreamCollector{i: i}
}

func (c upstreamCollector) Describe(ch chan<- *prometheus.Desc) { ch <- upstreamUpDesc }

func (c upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), upstreamCheckTimeout)
	defer cancel()
	up := 0.0
	if ok, _ := c.i.readiness(ctx); ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(upstreamUpDesc, prometheus.GaugeValue, up)
}

// relayMetrics are the proxy's own series: why sessions could not be
// connected to Postgres, and the time pgfence adds to a round trip.
type relayMetrics struct {
	failures *prometheus.CounterVec
	latency  prometheus.Histogram
}

func newRelayMetrics(reg prometheus.Registerer) *relayMetrics {
	m := &relayMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgfence_upstream_connect_failures_total",
			Help: "Client sessions pgfence could not connect to Postgres, by cause: refused, timeout, network (connecting), tls, auth (Postgres refused the credentials, SQLSTATE class 28), rejected (Postgres refused the session otherwise: too many connections, starting up or shutting down, no such database)."},
			[]string{"cause"}),
		// From a few microseconds (a plain relay) to milliseconds (a
		// rewrite, or a machine short of CPU).
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pgfence_added_latency_seconds",
			Help:    "Per round trip (a client's messages up to the ReadyForQuery that answers them), the time pgfence spent handling its bytes both ways, from reading them to writing them on: what it adds to the time Postgres takes, apart from waiting for sockets. Measured on the event loop (not with --goroutine-relay).",
			Buckets: []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 50e-3}}),
	}
	for _, c := range proxy.UpstreamFailures {
		m.failures.WithLabelValues(string(c))
	}
	reg.MustRegister(m.failures, m.latency)
	return m
}

func (m *relayMetrics) upstreamFailed(c proxy.UpstreamFailure) {
	m.failures.WithLabelValues(string(c)).Inc()
}
func (m *relayMetrics) roundTrip(d time.Duration) { m.latency.Observe(d.Seconds()) }
