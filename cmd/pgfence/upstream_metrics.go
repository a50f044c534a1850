package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// upstreamCheckTimeout bounds the check each scrape of pgfence_upstream_up
// runs, well inside Prometheus's default scrape timeout (10 s): an
// upstream that does not answer in time counts as down.
const upstreamCheckTimeout = 2 * time.Second

// healthzUpstreamWait bounds /healthz's note on whether Postgres is
// reachable, so that the liveness answer never waits on Postgres.
const healthzUpstreamWait = 500 * time.Millisecond

var upstreamUpDesc = prometheus.NewDesc("pgfence_upstream_up",
	"1 if the Postgres that client sessions go to now answers pgfence's role and is a writable primary (what /readyz checks), 0 if not: unreachable, refusing pgfence's role, or read-only (a standby, default_transaction_read_only). Checked at each scrape, with a 2 s timeout; while Postgres refuses the role's login, the refusal stands until pgfence's next try is due.",
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
