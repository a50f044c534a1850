// Package loopstat holds Prometheus counters and histograms that each
// event loop adds to on cache lines of its own, summed when scraped.
//
// A statement on its way through pgfence counts itself several times (a
// query, a cache hit, a guarded write, its round trip's latency). With one
// counter shared by every core, each add takes the cache line from the
// core that added last: at a few million adds a second on a big machine
// the line ping-pongs between cores and every loop waits for it. Here a
// series has one cell per shard, each on cache lines of its own; a loop
// adds to its shard's cell (proxy.Client.Loop says which), and a scrape
// reads them all. Adds are atomic all the same, as sessions relayed by
// goroutines share shards; on a loop they are never contended.
package loopstat

import (
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Shards is how many cells a series has: GOMAXPROCS when the process
// started, rounded up to a power of two (the default number of event
// loops is GOMAXPROCS). Loops beyond it share cells, which costs them
// contention, not correctness.
var Shards = func() int {
	n := 1
	for n < runtime.GOMAXPROCS(0) && n < 1024 {
		n <<= 1
	}
	return n
}()

// Shard is the shard of a session relayed by event loop loop (-1 when
// goroutines relay it, which spreads sessions by their id).
func Shard(loop int, id uint64) int {
	if loop < 0 {
		return int(id & uint64(Shards-1))
	}
	return loop & (Shards - 1)
}

// lineSize is what a cell is padded to: two cache lines, as Intel's
// spatial prefetcher fetches lines in pairs.
const lineSize = 128

// cell is one shard's count.
type cell struct {
	n atomic.Uint64
	_ [lineSize - 8]byte
}

// Counter is a counter split per shard.
type Counter struct {
	values []string // its label values
	cells  []cell
}

func newCounter(values []string) *Counter {
	return &Counter{values: values, cells: make([]cell, Shards)}
}

// NewCounter returns a Counter of no vector, for a count of one's own.
func NewCounter() *Counter { return newCounter(nil) }

// Inc adds 1 in shard.
func (c *Counter) Inc(shard int) { c.cells[shard&(Shards-1)].n.Add(1) }

// Add adds n in shard.
func (c *Counter) Add(shard int, n uint64) { c.cells[shard&(Shards-1)].n.Add(n) }

// Value is the sum of every shard's count.
func (c *Counter) Value() uint64 {
	var sum uint64
	for i := range c.cells {
		sum += c.cells[i].n.Load()
	}
	return sum
}

// vec is what CounterVec and HistogramVec share: series by label values,
// found under a lock that only a new series, a deletion or a scrape takes
// (the hot path resolves its series once and keeps them).
type vec[S any] struct {
	desc   *prometheus.Desc
	labels []string
	mu     sync.Mutex
	series map[string]S
	make   func(values []string) S
}

func key(values []string) string { return strings.Join(values, "\xff") }

func (v *vec[S]) with(values []string) S {
	if len(values) != len(v.labels) {
		panic("loopstat: " + v.desc.String() + ": wrong number of label values")
	}
	k := key(values)
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.series[k]
	if !ok {
		s = v.make(slices.Clone(values))
		v.series[k] = s
	}
	return s
}

// deletePartialMatch removes every series whose labels include all of
// match, and returns how many.
func (v *vec[S]) deletePartialMatch(match prometheus.Labels, values func(S) []string) int {
	idx := map[int]string{}
	for name, val := range match {
		i := slices.Index(v.labels, name)
		if i < 0 {
			return 0
		}
		idx[i] = val
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for k, s := range v.series {
		vals := values(s)
		ok := true
		for i, want := range idx {
			ok = ok && vals[i] == want
		}
		if ok {
			delete(v.series, k)
			n++
		}
	}
	return n
}

// sorted returns the series in a stable order, for scrapes.
func (v *vec[S]) sorted() []S {
	v.mu.Lock()
	keys := make([]string, 0, len(v.series))
	for k := range v.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]S, len(keys))
	for i, k := range keys {
		out[i] = v.series[k]
	}
	v.mu.Unlock()
	return out
}

// CounterVec is a prometheus.Collector of Counters by label values.
type CounterVec struct{ v vec[*Counter] }

// NewCounterVec makes a CounterVec of opts (Name and Help) with labels.
func NewCounterVec(opts prometheus.CounterOpts, labels ...string) *CounterVec {
	return &CounterVec{vec[*Counter]{
		desc:   prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), opts.Help, labels, opts.ConstLabels),
		labels: labels,
		series: map[string]*Counter{},
		make:   newCounter,
	}}
}

// With returns the series of values, making it (at 0) if it is new.
func (v *CounterVec) With(values ...string) *Counter { return v.v.with(values) }

// DeletePartialMatch removes every series whose labels include match.
func (v *CounterVec) DeletePartialMatch(match prometheus.Labels) int {
	return v.v.deletePartialMatch(match, func(c *Counter) []string { return c.values })
}

// Curry returns the series of v whose first label values are values.
func (v *CounterVec) Curry(values ...string) CurriedCounterVec {
	return CurriedCounterVec{v, values}
}

func (v *CounterVec) Describe(ch chan<- *prometheus.Desc) { ch <- v.v.desc }

func (v *CounterVec) Collect(ch chan<- prometheus.Metric) {
	for _, c := range v.v.sorted() {
		ch <- prometheus.MustNewConstMetric(v.v.desc, prometheus.CounterValue, float64(c.Value()), c.values...)
	}
}

// CurriedCounterVec is a CounterVec with its first label values given.
type CurriedCounterVec struct {
	v      *CounterVec
	values []string
}

// With returns the series of the curried values and then values.
func (c CurriedCounterVec) With(values ...string) *Counter {
	return c.v.With(append(slices.Clone(c.values), values...)...)
}

// Histogram is a histogram split per shard.
type Histogram struct {
	values  []string
	buckets []float64 // upper bounds, ascending
	// shards holds, per shard, stride uint64s on cache lines of their own:
	// the count in each bucket (not cumulative), then the sum's bits.
	shards []atomic.Uint64
	stride int
}

func newHistogram(buckets []float64) func([]string) *Histogram {
	return func(values []string) *Histogram {
		per := len(buckets) + 2 // buckets, +Inf, sum
		stride := (per*8 + lineSize - 1) / lineSize * lineSize / 8
		return &Histogram{values: values, buckets: buckets, shards: make([]atomic.Uint64, Shards*stride), stride: stride}
	}
}

// Observe records x in shard.
func (h *Histogram) Observe(shard int, x float64) {
	base := (shard & (Shards - 1)) * h.stride
	i := sort.SearchFloat64s(h.buckets, x) // the first bound >= x
	h.shards[base+i].Add(1)
	sum := &h.shards[base+len(h.buckets)+1]
	for {
		old := sum.Load()
		if sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+x)) {
			return
		}
	}
}

// snapshot returns the total count, the sum and the cumulative counts per
// bucket.
func (h *Histogram) snapshot() (count uint64, sum float64, cumulative map[float64]uint64) {
	counts := make([]uint64, len(h.buckets)+1)
	for s := range Shards {
		base := s * h.stride
		for i := range counts {
			counts[i] += h.shards[base+i].Load()
		}
		sum += math.Float64frombits(h.shards[base+len(h.buckets)+1].Load())
	}
	cumulative = make(map[float64]uint64, len(h.buckets))
	for i, b := range h.buckets {
		count += counts[i]
		cumulative[b] = count
	}
	count += counts[len(h.buckets)]
	return count, sum, cumulative
}

// HistogramVec is a prometheus.Collector of Histograms by label values.
type HistogramVec struct{ v vec[*Histogram] }

// NewHistogramVec makes a HistogramVec of opts (Name, Help and Buckets,
// ascending) with labels.
func NewHistogramVec(opts prometheus.HistogramOpts, labels ...string) *HistogramVec {
	buckets := slices.Clone(opts.Buckets)
	if !slices.IsSorted(buckets) {
		panic("loopstat: " + opts.Name + ": buckets must be ascending")
	}
	return &HistogramVec{vec[*Histogram]{
		desc:   prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), opts.Help, labels, opts.ConstLabels),
		labels: labels,
		series: map[string]*Histogram{},
		make:   newHistogram(buckets),
	}}
}

// With returns the series of values, making it (empty) if it is new.
func (v *HistogramVec) With(values ...string) *Histogram { return v.v.with(values) }

// DeletePartialMatch removes every series whose labels include match.
func (v *HistogramVec) DeletePartialMatch(match prometheus.Labels) int {
	return v.v.deletePartialMatch(match, func(h *Histogram) []string { return h.values })
}

// Curry returns the series of v whose first label values are values.
func (v *HistogramVec) Curry(values ...string) CurriedHistogramVec {
	return CurriedHistogramVec{v, values}
}

func (v *HistogramVec) Describe(ch chan<- *prometheus.Desc) { ch <- v.v.desc }

func (v *HistogramVec) Collect(ch chan<- prometheus.Metric) {
	for _, h := range v.v.sorted() {
		count, sum, cum := h.snapshot()
		ch <- prometheus.MustNewConstHistogram(v.v.desc, count, sum, cum, h.values...)
	}
}

// CurriedHistogramVec is a HistogramVec with its first label values
// given.
type CurriedHistogramVec struct {
	v      *HistogramVec
	values []string
}

// With returns the series of the curried values and then values.
func (c CurriedHistogramVec) With(values ...string) *Histogram {
	return c.v.With(append(slices.Clone(c.values), values...)...)
}
