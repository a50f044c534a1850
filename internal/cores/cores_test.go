package cores

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/poll"
)

// TestSizing follows the decision through loads: up at once when the Ps
// are busy, down only after holdDown quiet intervals in a row, to the
// most any of them needed, and steady between.
func TestSizing(t *testing.T) {
	low := func(busy float64, n int) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = busy
		}
		return s
	}
	cat := func(parts ...[]float64) []float64 {
		var s []float64
		for _, p := range parts {
			s = append(s, p...)
		}
		return s
	}
	for _, c := range []struct {
		name        string
		max, procs  int
		loads       []float64
		want        int
		wantChanges int
	}{
		{"quiet for less than the hold keeps every P", 2, 2, low(0.3, holdDown-1), 2, 0},
		{"quiet for the hold gives one back", 2, 2, low(0.3, holdDown), 1, 1},
		{"a busy interval within the hold starts it again", 2, 2, cat(low(0.3, holdDown-1), []float64{0.9}, low(0.3, holdDown-1)), 2, 0},
		{"a steady load between the thresholds stays", 2, 2, low(0.9, 3*holdDown), 2, 0},
		{"two Ps just past perP stay two", 2, 2, low(0.61, 3*holdDown), 2, 0},
		{"one P busy past upAt gets a second", 2, 1, []float64{0.71}, 2, 1},
		{"one P just under upAt stays one", 2, 1, low(0.69, 3*holdDown), 1, 0},
		{"never past max", 2, 2, low(5, 3), 2, 0},
		{"a big host ramps up in a few intervals", 16, 1, []float64{0.95, 1.9, 3.9, 7.5, 10.6}, 16, 5},
		{"down to the most the quiet intervals needed", 16, 16, cat(low(2.2, holdDown/2), []float64{4.4}, low(2.2, holdDown/2-1)), 8, 1},
		{"an idle host ends on one", 16, 16, low(0, holdDown), 1, 1},
		{"the load the Ps were cut to does not bring them back", 2, 2, cat(low(0.5, holdDown), low(0.6, 3*holdDown)), 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			z := sizing{max: c.max, procs: c.procs}
			changes := 0
			for _, b := range c.loads {
				before := z.procs
				n, changed := z.next(b)
				if changed != (n != before) {
					t.Fatalf("next(%v) = %d, changed %v, from %d", b, n, changed, before)
				}
				if n < 1 || n > c.max {
					t.Fatalf("next(%v) = %d: outside [1, %d]", b, n, c.max)
				}
				if changed {
					changes++
				}
			}
			if z.procs != c.want || changes != c.wantChanges {
				t.Errorf("ended on %d Ps after %d changes; want %d after %d", z.procs, changes, c.want, c.wantChanges)
			}
		})
	}
}

// TestRunSizesTheRuntime runs a Governor on the real runtime: an idle
// process comes down to one P, a load it reads brings the second back, and
// stopping gives back every P. The process's real CPU time drives the
// first step; the second reads a clock the test moves, as a real load on a
// busy machine may not keep one P past upAt.
func TestRunSizesTheRuntime(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(2)
	var fake atomic.Int64 // extra CPU time the test says was used
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Max: 2, Interval: 10 * time.Millisecond, CPU: func() time.Duration {
			return processCPU() + time.Duration(fake.Load())
		}})
	}()
	poll.Eventually(t, time.Minute, "an idle process down to one P", func() bool { return runtime.GOMAXPROCS(0) == 1 })
	// From now on, every wall-clock nanosecond counts as one of CPU: a
	// P fully busy.
	base := time.Since(start)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				fake.Store(int64(time.Since(start) - base))
			}
		}
	}()
	poll.Eventually(t, time.Minute, "a busy P gets a second", func() bool { return runtime.GOMAXPROCS(0) == 2 })
	close(stop)
	poll.Eventually(t, time.Minute, "quiet again, down to one", func() bool { return runtime.GOMAXPROCS(0) == 1 })
	cancel()
	<-done
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Errorf("a stopped Governor left %d Ps; want its Max, 2", n)
	}
}

// TestOneAtATime: a second Governor waits while one runs, so two servers
// in one process never both size GOMAXPROCS, and takes over when it stops.
func TestOneAtATime(t *testing.T) {
	first, stopFirst := context.WithCancel(context.Background())
	defer stopFirst()
	var firstReads, secondReads atomic.Int64
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		Run(first, Options{Max: 4, Interval: time.Millisecond, CPU: func() time.Duration { firstReads.Add(1); return 0 },
			Set: func(int) {}})
	}()
	poll.Eventually(t, time.Minute, "the first Governor measuring", func() bool { return firstReads.Load() > 0 })
	second, stopSecond := context.WithCancel(context.Background())
	secondDone := make(chan struct{})
	go func() {
		defer close(secondDone)
		Run(second, Options{Max: 4, Interval: time.Millisecond, CPU: func() time.Duration { secondReads.Add(1); return 0 },
			Set: func(int) {}})
	}()
	// The first measures on, many intervals: the second, waiting, has not
	// started.
	n := firstReads.Load()
	poll.Eventually(t, time.Minute, "the first Governor measuring on", func() bool { return firstReads.Load() > n+50 })
	if r := secondReads.Load(); r != 0 {
		t.Fatalf("a second Governor measured %d times while the first ran", r)
	}
	stopFirst()
	<-firstDone
	poll.Eventually(t, time.Minute, "the second Governor taking over", func() bool { return secondReads.Load() > 0 })
	stopSecond()
	<-secondDone
	// One whose context ends while it waits returns, having set nothing.
	third, stopThird := context.WithCancel(context.Background())
	thirdDone := make(chan struct{})
	var thirdReads atomic.Int64
	go func() {
		defer close(thirdDone)
		Run(third, Options{Max: 4, Interval: time.Hour, CPU: func() time.Duration { thirdReads.Add(1); return 0 }, Set: func(int) {}})
	}()
	poll.Eventually(t, time.Minute, "a third Governor running", func() bool { return thirdReads.Load() > 0 })
	waiting, stopWaiting := context.WithCancel(context.Background())
	stopWaiting()
	Run(waiting, Options{Max: 4, CPU: func() time.Duration {
		t.Error("a Governor whose context ended while it waited ran")
		return 0
	}})
	stopThird()
	<-thirdDone
}

// TestUnmeasurable: where the process's CPU time cannot be read, the
// runtime is left alone.
func TestUnmeasurable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	reads := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Max: 2, Interval: time.Millisecond,
			CPU: func() time.Duration {
				select {
				case reads <- struct{}{}:
				default:
				}
				return -1
			},
			Set: func(n int) { t.Errorf("set GOMAXPROCS to %d without a measure", n) }})
	}()
	<-reads
	cancel()
	<-done
}
