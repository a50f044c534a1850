// Package server wires pgfence's parts into one proxy: the fencing policy
// (fence), one for every session or one per database (fence.Databases), as
// the relay's (proxy) interceptor, and the series of both in one
// Prometheus registry. The command, the test harness, the torture check and
// the benchmark's profiling build all build their servers here, so each runs
// what the others run.
package server

import (
	"log/slog"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/loopstat"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Config is what a Server is made of.
type Config struct {
	// Proxy configures the relay; its Interceptor and Logger are set by
	// New, and its UpstreamFailed and RoundTrip hooks when left nil.
	Proxy proxy.Config
	// Fence is the fencing policy, for every session whatever its
	// database, unless Route is set.
	Fence fence.Config
	// Route, if set, fences each session with the policy of its database
	// that it finds (see fence.Databases), made with
	// Server.Databases.New; Fence is then unused and Server.Policy nil.
	Route *fence.Routes
	// Logger receives the relay's and the policy's events; nil discards
	// them.
	Logger *slog.Logger
	// Registry receives the series; nil makes one.
	Registry *prometheus.Registry
}

// Server is a proxy with its policy (or policies) and their series.
type Server struct {
	*proxy.Server
	Policy    *fence.Policy    // without Config.Route
	Databases *fence.Databases // with Config.Route
	Metrics   *fence.Metrics
	Registry  *prometheus.Registry
}

// New builds a Server; it starts serving at Serve.
func New(cfg Config) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	metrics := fence.NewMetrics(reg)
	relay := newRelayMetrics(reg)
	built := &Server{Metrics: metrics, Registry: reg}
	pc := cfg.Proxy
	if cfg.Route != nil {
		built.Databases = fence.NewDatabases(metrics, *cfg.Route)
		pc.Interceptor = built.Databases
	} else {
		policy, err := fence.New(cfg.Fence, metrics, log)
		if err != nil {
			return nil, err
		}
		built.Policy, pc.Interceptor = policy, policy
	}
	pc.Logger = log
	if pc.SettingSQL == "" {
		pc.SettingSQL = sqlrewrite.SettingSQL
	}
	if pc.StandInSQL == "" {
		pc.StandInSQL = sqlrewrite.StandInSQL
	}
	if pc.UpstreamFailed == nil {
		pc.UpstreamFailed = relay.upstreamFailed
	}
	if pc.RoundTrip == nil {
		pc.RoundTrip = relay.roundTrip
	}
	srv, err := proxy.New(pc)
	if err != nil {
		return nil, err
	}
	built.Server = srv
	reg.MustRegister(loopCollector{srv})
	return built, nil
}

// loopCollector exports the event loops, the Ps they run on, and how many
// sessions each holds, read at each scrape (under the proxy's lock, once
// per scrape).
type loopCollector struct{ srv *proxy.Server }

var (
	eventLoopsDesc = prometheus.NewDesc("pgfence_event_loops",
		"Event loops relaying client sessions (--event-loops; 0 off Linux, where goroutines relay them).", nil, nil)
	coresDesc = prometheus.NewDesc("pgfence_cores",
		"Go Ps pgfence runs on now (GOMAXPROCS): how many threads run its code at once. With the core governor (--core-governor, on by default) it follows the load, from 1 up to the usable cores, and the event loops share them.", nil, nil)
	loopSessionsDesc = prometheus.NewDesc("pgfence_loop_sessions",
		"Client sessions each event loop holds now, past startup: each new one goes to the loop that holds the fewest.", []string{"loop"}, nil)
)

func (loopCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- eventLoopsDesc
	ch <- coresDesc
	ch <- loopSessionsDesc
}

func (c loopCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(eventLoopsDesc, prometheus.GaugeValue, float64(c.srv.EventLoops()))
	ch <- prometheus.MustNewConstMetric(coresDesc, prometheus.GaugeValue, float64(runtime.GOMAXPROCS(0)))
	for i, n := range c.srv.LoopSessions() {
		ch <- prometheus.MustNewConstMetric(loopSessionsDesc, prometheus.GaugeValue, float64(n), strconv.Itoa(i))
	}
}

// relayMetrics are the relay's own series: why sessions could not be
// connected to Postgres, and the time pgfence adds to a round trip.
type relayMetrics struct {
	failures *prometheus.CounterVec
	// latency is observed at every round trip, from every loop: split
	// per loop (see internal/loopstat).
	latency *loopstat.Histogram
}

func newRelayMetrics(reg prometheus.Registerer) *relayMetrics {
	m := &relayMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgfence_upstream_connect_failures_total",
			Help: "Client sessions pgfence could not connect to Postgres, by cause: refused, timeout, network (connecting), tls, auth (Postgres refused the credentials, SQLSTATE class 28), rejected (Postgres refused the session otherwise: too many connections, starting up or shutting down, no such database)."},
			[]string{"cause"}),
		// From a few microseconds (a plain relay) to milliseconds (a
		// rewrite, or a machine short of CPU).
	}
	latency := loopstat.NewHistogramVec(prometheus.HistogramOpts{Name: "pgfence_added_latency_seconds",
		Help:    "Per round trip (a client's messages up to the ReadyForQuery that answers them), the time pgfence spent handling its bytes both ways, from reading them to writing them on: what it adds to the time Postgres takes, apart from waiting for sockets. Measured on the event loops (Linux).",
		Buckets: []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 50e-3}})
	m.latency = latency.With()
	for _, c := range proxy.UpstreamFailures {
		m.failures.WithLabelValues(string(c))
	}
	reg.MustRegister(m.failures, latency)
	return m
}

func (m *relayMetrics) upstreamFailed(c proxy.UpstreamFailure) {
	m.failures.WithLabelValues(string(c)).Inc()
}
func (m *relayMetrics) roundTrip(c *proxy.Client, d time.Duration) {
	m.latency.Observe(loopstat.Shard(c.Loop(), c.ID), d.Seconds())
}
