package loopstat

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
)

// gather scrapes c through a pedantic registry (which checks what it
// emits against what it describes) and returns each series' value as
// "labels value", in order.
func gather(t *testing.T, c prometheus.Collector) []string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			l := strings.Join(labels, ",")
			switch {
			case m.Counter != nil:
				out = append(out, fmt.Sprintf("%s %g", l, m.Counter.GetValue()))
			case m.Histogram != nil:
				h := m.Histogram
				var bs []string
				for _, b := range h.GetBucket() {
					bs = append(bs, fmt.Sprintf("le%g:%d", b.GetUpperBound(), b.GetCumulativeCount()))
				}
				out = append(out, fmt.Sprintf("%s count=%d sum=%g %s", l, h.GetSampleCount(), h.GetSampleSum(), strings.Join(bs, " ")))
			}
		}
	}
	return out
}

func TestShard(t *testing.T) {
	for _, tc := range []struct {
		loop int
		id   uint64
		want int
	}{
		{0, 7, 0},
		{1, 7, 1 & (Shards - 1)},
		{Shards, 3, 0}, // loops beyond Shards share
		{-1, 5, int(5 & uint64(Shards-1))},
	} {
		if got := Shard(tc.loop, tc.id); got != tc.want {
			t.Errorf("Shard(%d, %d) = %d, want %d", tc.loop, tc.id, got, tc.want)
		}
	}
	if Shards&(Shards-1) != 0 || Shards < 1 {
		t.Fatalf("Shards = %d: want a power of two", Shards)
	}
}

// Each shard's cell is on cache lines of its own.
func TestCellsApart(t *testing.T) {
	c := newCounter(nil)
	if Shards < 2 {
		t.Skip("one shard")
	}
	d := uintptr(unsafe.Pointer(&c.cells[1])) - uintptr(unsafe.Pointer(&c.cells[0]))
	if d < lineSize {
		t.Fatalf("cells %d bytes apart, want %d", d, lineSize)
	}
	h := newHistogram([]float64{1, 2})(nil)
	if h.stride*8 < lineSize || h.stride*8%lineSize != 0 {
		t.Fatalf("histogram shards %d bytes apart, want a multiple of %d", h.stride*8, lineSize)
	}
}

// Adds from many goroutines on every shard at once all count (go test
// -race checks they race with nothing).
func TestCounterVec(t *testing.T) {
	v := NewCounterVec(prometheus.CounterOpts{Name: "t_total", Help: "t"}, "db", "table")
	a := v.Curry("d1").With("a")
	if v.With("d1", "a") != a {
		t.Fatal("With and Curry().With give two series for the same labels")
	}
	var wg sync.WaitGroup
	for g := range 4 * Shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				a.Inc(g)
			}
			v.With("d2", "b").Add(g, 2)
		}()
	}
	wg.Wait()
	if got, want := a.Value(), uint64(4*Shards*1000); got != want {
		t.Fatalf("a: %d, want %d", got, want)
	}
	want := fmt.Sprintf("[db=d1,table=a %d db=d2,table=b %d]", 4*Shards*1000, 8*Shards)
	if got := fmt.Sprint(gather(t, v)); got != want {
		t.Fatalf("scraped %s, want %s", got, want)
	}
	if n := v.DeletePartialMatch(prometheus.Labels{"db": "d1"}); n != 1 {
		t.Fatalf("deleted %d series of d1, want 1", n)
	}
	if n := v.DeletePartialMatch(prometheus.Labels{"nope": "x"}); n != 0 {
		t.Fatalf("deleted %d series by an unknown label", n)
	}
	if n := len(gather(t, v)); n != 1 {
		t.Fatalf("%d series after the deletion, want 1", n)
	}
	if got := v.With("d1", "a").Value(); got != 0 {
		t.Fatalf("a series made again after its deletion starts at %d", got)
	}
}

func TestHistogramVec(t *testing.T) {
	v := NewHistogramVec(prometheus.HistogramOpts{Name: "h", Help: "h", Buckets: []float64{1, 10}}, "kind")
	h := v.Curry().With("x")
	for i, x := range []float64{0.5, 1, 2, 10, 11, 100} {
		h.Observe(i, x)
	}
	if got, want := fmt.Sprint(gather(t, v)), "[kind=x count=6 sum=124.5 le1:2 le10:4]"; got != want {
		t.Fatalf("scraped %s, want %s", got, want)
	}
	var wg sync.WaitGroup
	for g := range 4 * Shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				h.Observe(g, 1)
			}
		}()
	}
	wg.Wait()
	if count, sum, _ := h.snapshot(); count != 6+uint64(400*Shards) || sum != 124.5+float64(400*Shards) {
		t.Fatalf("after concurrent observations: count %d, sum %g", count, sum)
	}
}

// One counter added to from every core, as a prometheus.Counter (one
// cache line for all) and split per shard: run with -cpu 1,2,... to see
// the shared line's cost grow with the cores.
func BenchmarkCounterShared(b *testing.B) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "b", Help: "b"})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Inc()
		}
	})
}

func BenchmarkCounterSplit(b *testing.B) {
	c := NewCounter()
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		shard := int(next.Add(1)) // a goroutine per core, as a loop per core
		for pb.Next() {
			c.Inc(shard)
		}
	})
}
