package fence

import (
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/loopstat"
)

// The first stale write of a key gets a line, then at most one per
// interval, carrying how many of its key went unlogged since the last;
// keys are counted apart, and an interval of 0 logs every one.
func TestStaleLogAdmit(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	a, b := loopstat.NewCounter(), loopstat.NewCounter() // two keys' reject series
	var l staleLog
	for i, step := range []struct {
		k        *loopstat.Counter
		at       time.Duration
		interval time.Duration
		ok       bool
		unlogged int64
	}{
		{a, 0, time.Second, true, 0},
		{a, 10 * time.Millisecond, time.Second, false, 0},
		{a, 500 * time.Millisecond, time.Second, false, 0},
		{b, 600 * time.Millisecond, time.Second, true, 0}, // another kind: a line of its own
		{a, 999 * time.Millisecond, time.Second, false, 0},
		{a, time.Second, time.Second, true, 3},
		{a, 1500 * time.Millisecond, time.Second, false, 0},
		{a, 5 * time.Second, time.Second, true, 1},
		{a, 5 * time.Second, 0, true, 0}, // 0: every one
		{a, 5 * time.Second, 0, true, 0},
		{b, 5 * time.Second, time.Second, true, 0},
	} {
		ok, unlogged := l.admit(step.k, i, t0.Add(step.at), step.interval)
		if ok != step.ok || unlogged != step.unlogged {
			t.Errorf("step %d (key %p at %v): admit = %v, %d; want %v, %d", i, step.k, step.at, ok, unlogged, step.ok, step.unlogged)
		}
	}
}
