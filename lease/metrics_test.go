package lease

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeLock grants leases it keeps, so the test can end them as a lock
// service would.
type fakeLock struct{ granted []*Lease }

func (f *fakeLock) Acquire(context.Context) (*Lease, error) {
	l := newLease(int64(len(f.granted)+1), time.Minute, time.Second, time.Now())
	f.granted = append(f.granted, l)
	return l, nil
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	fake := &fakeLock{}
	lock := m.Instrument("billing", fake)
	watched := 0 // leases watched by hand, not acquired through lock

	want := func(held, acquired, expired, gone int) {
		t.Helper()
		exp := fmt.Sprintf("acquire_seconds{billing}=%d acquired{billing}=%d held{billing}=%d lease_expired_while_executing{billing}=%d lost{billing,expired}=%d lost{billing,gone}=%d",
			acquired-watched, acquired, held, expired+gone, expired, gone)
		// The callbacks run on goroutines of their own: wait a little.
		var got string
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if got = gather(t, reg); got == exp {
				return
			}
		}
		t.Fatalf("metrics: %s\nwant:    %s", got, exp)
	}
	// The series exist before any lease, at zero.
	want(0, 0, 0, 0)

	acquire := func() *Lease {
		l, err := lock.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	released, expired, gone := acquire(), acquire(), acquire()
	want(3, 3, 0, 0)
	// Released: not lost, also when released again.
	released.Release(context.Background())
	released.Release(context.Background())
	want(2, 3, 0, 0)
	expired.lose(ErrExpired)
	want(1, 3, 1, 0)
	gone.lose(fmt.Errorf("%w: etcd lease not found", ErrLost))
	want(0, 3, 1, 1)
	// Releasing a lost lease (as holders must) counts it no further.
	expired.Release(context.Background())
	gone.Release(context.Background())
	want(0, 3, 1, 1)

	// A lease watched by hand counts the same, but for its Acquire's time,
	// which the Metrics did not see.
	watched = 1
	other := newLease(9, time.Minute, time.Second, time.Now())
	m.Watch("billing", other)
	want(1, 4, 1, 1)
	other.lose(ErrExpired)
	want(0, 4, 2, 1)
}

// gather renders reg's lease series as short, sorted text.
func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		name := strings.TrimSuffix(strings.TrimPrefix(mf.GetName(), "pgfence_lease_"), "_total")
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			v := m.GetCounter().GetValue()
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Histogram != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			out = append(out, fmt.Sprintf("%s{%s}=%g", name, strings.Join(labels, ","), v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
