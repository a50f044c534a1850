package lease

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts, for Prometheus, what becomes of the leases of the locks
// it instruments. Its series (the alert rules in deploy/prometheus/ use
// pgfence_lease_lost_total):
//
//	pgfence_lease_acquired_total{lock}     leases granted
//	pgfence_lease_held{lock}               leases held now: granted, and
//	                                       neither lost nor released yet
//	pgfence_lease_lost_total{lock,reason}  leases that ended before their
//	                                       holder released them, while it
//	                                       still held the lock:
//	                                       reason="expired" (no renewal
//	                                       succeeded before the safety
//	                                       deadline: ErrExpired) or
//	                                       reason="gone" (the lock service
//	                                       said the lease or the lock entry
//	                                       is gone: revoked, expired there,
//	                                       session expired, key deleted)
//	lease_expired_while_executing_total{lock}
//	                                       the same leases, under the name
//	                                       the usual fencing guidance gives
//	                                       them: lost while their holder was
//	                                       still at work (not released)
//	pgfence_lease_acquire_seconds{lock}    how long each successful Acquire
//	                                       of an Instrument-ed Lock took,
//	                                       waiting for the lock included
//
// A lost lease means the holder had to stop in the middle of its work (a
// GC or VM pause, a slow or cut network, a lock service in trouble, or a
// TTL too short for them); its late writes, if any, are what pgfence
// fences. lock is the name given to Instrument or Watch: keep the names
// few (one per lock, not per key).
//
//	m := lease.NewMetrics(prometheus.DefaultRegisterer)
//	lock := m.Instrument("billing", &lease.Etcd{Client: cli, Prefix: "/locks/billing"})
type Metrics struct {
	acquired  *prometheus.CounterVec
	held      *prometheus.GaugeVec
	lost      *prometheus.CounterVec
	executing *prometheus.CounterVec // lease_expired_while_executing_total
	acquire   *prometheus.HistogramVec
}

// NewMetrics registers the lease metrics with reg (it panics if they are
// registered there already, as prometheus.MustRegister does: make one
// Metrics per registry and share it between locks).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		acquired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgfence_lease_acquired_total",
			Help: "Leases granted, by lock."}, []string{"lock"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgfence_lease_held",
			Help: "Leases held now, by lock: granted, and neither lost nor released yet."}, []string{"lock"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgfence_lease_lost_total",
			Help: "Leases that ended before their holder released them, by lock and reason: expired (no renewal succeeded before the safety deadline) or gone (the lock service said the lease or its lock entry is gone)."},
			[]string{"lock", "reason"}),
		executing: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lease_expired_while_executing_total",
			Help: "Leases lost (expired, or gone at the lock service) while their holder was still at work, by lock: the sum over reason of pgfence_lease_lost_total."}, []string{"lock"}),
		// From a free lock on a nearby service (milliseconds) to waiting
		// out another holder's TTL (seconds to minutes).
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pgfence_lease_acquire_seconds",
			Help:    "How long each successful Acquire of an instrumented lock took, waiting for the lock included, by lock.",
			Buckets: []float64{.001, .005, .025, .1, .5, 1, 5, 15, 60, 300}}, []string{"lock"}),
	}
	reg.MustRegister(m.acquired, m.held, m.lost, m.executing, m.acquire)
	return m
}

// Instrument returns a Lock that is lock with every Lease it grants
// counted under name (see Watch). The lock's series exist from now on, at
// zero.
func (m *Metrics) Instrument(name string, lock Lock) Lock {
	m.series(name)
	return instrumented{m: m, name: name, lock: lock}
}

// Watch counts l, a lease of the lock called name: granted and held now,
// and, when it ends, lost or not. Leases of an Instrument-ed Lock are
// watched already; watch each other lease once, right after Acquire.
func (m *Metrics) Watch(name string, l *Lease) {
	m.series(name)
	m.acquired.WithLabelValues(name).Inc()
	held := m.held.WithLabelValues(name)
	held.Inc()
	context.AfterFunc(l.ctx, func() {
		held.Dec()
		switch cause := context.Cause(l.ctx); {
		case errors.Is(cause, ErrExpired):
			m.lost.WithLabelValues(name, "expired").Inc()
			m.executing.WithLabelValues(name).Inc()
		case errors.Is(cause, ErrLost):
			m.lost.WithLabelValues(name, "gone").Inc()
			m.executing.WithLabelValues(name).Inc()
		}
	})
}

// series makes name's series exist at zero, so that the first lease lost
// is an increase a rule can see.
func (m *Metrics) series(name string) {
	m.acquired.WithLabelValues(name)
	m.held.WithLabelValues(name)
	m.lost.WithLabelValues(name, "expired")
	m.lost.WithLabelValues(name, "gone")
	m.executing.WithLabelValues(name)
	m.acquire.WithLabelValues(name)
}

type instrumented struct {
	m    *Metrics
	name string
	lock Lock
}

func (i instrumented) Acquire(ctx context.Context) (*Lease, error) {
	start := time.Now()
	l, err := i.lock.Acquire(ctx)
	if err == nil {
		i.m.acquire.WithLabelValues(i.name).Observe(time.Since(start).Seconds())
		i.m.Watch(i.name, l)
	}
	return l, err
}
