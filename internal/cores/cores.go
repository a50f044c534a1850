// Package cores sizes the Go runtime to pgfence's load: how many Ps
// (threads running Go code at once, GOMAXPROCS) it may use, from one up to
// the cores it was given.
//
// Why: pgfence's event loops are goroutines that park in Go's netpoller
// while their sessions are quiet. With a P for each, the runtime runs each
// loop on a thread of its own as soon as its sessions have bytes, so at a
// load one core could carry every loop wakes, and the kernel switches to,
// a thread per loop: each wake handles fewer events, and each costs a
// context switch. Measured beside Postgres on 2 cores (BENCHMARKS.md,
// "Event loops"), two loops on two Ps spent 1.16–1.28× the CPU per
// transaction of one loop on one P, and two loops sharing one P
// 1.00–1.07×.
// The loops' cores pay off only when the load needs them.
//
// So a Governor measures the process's CPU time (getrusage) every
// Interval and gives the runtime as many Ps as that keeps busy:
//   - more as soon as the Ps it has are busy on average past upAt: at
//     once as many as would each carry perP of the load, so that a big
//     host ramps from one P to sixteen in a few intervals;
//   - fewer only once the load has needed fewer for holdDown intervals in
//     a row, and then as many as the busiest of them needed.
//
// The gap between upAt and perP keeps it from swinging between two sizes
// at a steady load, even though the same load costs more CPU on more Ps.
//
// Nothing else changes: each session stays on the loop that took it, and
// each loop owns its sessions and buffers; loops sharing a P take turns
// on it, as goroutines do. A loop that finds events ready on every poll
// only yields its P when the runtime preempts it (10 ms), which keeps the
// P busy past upAt, and the next interval adds one.
//
// GOMAXPROCS is the process's: one Governor runs at a time (Run waits for
// the one running to stop), and it gives the runtime back the Ps it
// started with when it stops. Setting GOMAXPROCS stops the world for a
// moment; it happens at most once an interval, and only when the load has
// changed.
package cores

import (
	"context"
	"math"
	"runtime"
	"time"
)

const (
	// upAt is how busy the Ps may be on average before more are added.
	upAt = 0.7
	// perP is the load each P is sized for when Ps are added or taken.
	perP = 0.6
	// holdDown is how many intervals in a row the load must need fewer
	// Ps before they are taken: a second, by default.
	holdDown = 10
	// DefaultInterval is how often the load is measured.
	DefaultInterval = 100 * time.Millisecond
)

// usable is GOMAXPROCS as the process started: the cores it was given
// (the machine's, or its cgroup's CPU limit, or the GOMAXPROCS variable).
var usable = runtime.GOMAXPROCS(0)

// Usable is how many cores pgfence was given, whatever a Governor has set
// GOMAXPROCS to since: what its Ps may grow back to, and the default
// number of event loops.
func Usable() int { return usable }

// Options configure a Governor; zero values take the defaults.
type Options struct {
	// Max is the most Ps it gives: Usable by default.
	Max int
	// Interval is how often the load is measured: DefaultInterval by
	// default.
	Interval time.Duration
	// CPU reads the process's CPU time so far, user and system: getrusage
	// by default. Tests give their own.
	CPU func() time.Duration
	// Set gives the runtime n Ps: runtime.GOMAXPROCS by default.
	Set func(n int)
}

// turn lets one Governor run at a time: it holds the token while it runs.
var turn = make(chan struct{}, 1)

// Run sizes the runtime's Ps to the load until ctx ends, then gives it
// back Max. While another Governor runs it waits for its turn (two
// servers in one process do not both size GOMAXPROCS). With a Max of 1
// there is nothing to size, and it only waits.
func Run(ctx context.Context, o Options) {
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-turn }()
	if o.Max <= 0 {
		o.Max = usable
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.CPU == nil {
		o.CPU = processCPU
	}
	if o.CPU() < 0 { // not measurable here: leave the runtime as it is
		<-ctx.Done()
		return
	}
	if o.Set == nil {
		o.Set = func(n int) { runtime.GOMAXPROCS(n) }
	}
	if o.Max == 1 {
		<-ctx.Done()
		return
	}
	defer o.Set(o.Max)
	z := sizing{max: o.Max, procs: o.Max}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	lastCPU, lastAt := o.CPU(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu := o.CPU()
			if cpu < 0 {
				continue
			}
			busy := float64(cpu-lastCPU) / float64(now.Sub(lastAt))
			lastCPU, lastAt = cpu, now
			if n, changed := z.next(busy); changed {
				o.Set(n)
			}
		}
	}
}

// sizing is a Governor's decision: how many Ps, given the load it has
// seen. procs stays within [1, max]; low counts the intervals in a row
// that needed fewer than procs, and need is the most any of them needed.
type sizing struct {
	max, procs int
	low, need  int
}

// next takes an interval's load (cores kept busy, on average) and says
// how many Ps to have now, and whether that changed.
func (z *sizing) next(busy float64) (procs int, changed bool) {
	need := min(max(int(math.Ceil(busy/perP)), 1), z.max)
	switch {
	case busy > upAt*float64(z.procs) && z.procs < z.max:
		z.low, z.need = 0, 0
		z.procs = max(need, z.procs+1)
		return z.procs, true
	case need >= z.procs:
		z.low, z.need = 0, 0
	default:
		z.low++
		z.need = max(z.need, need)
		if z.low >= holdDown {
			z.procs = z.need
			z.low, z.need = 0, 0
			return z.procs, true
		}
	}
	return z.procs, false
}
