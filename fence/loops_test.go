package fence_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/loopstat"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// Each event loop has its own rewrite caches: the same text is rewritten
// once per loop (a miss on each), and hit after that on both.
func TestCachesPerLoop(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl}, func(pc *proxy.Config, _ *fence.Config) { pc.EventLoops = 2 })
	cs := p.ConnectOnLoops(t, "cache0", "cache1")
	for range 3 {
		for _, c := range cs {
			pgtest.Exec(t, c, "SET fence.token = '1'")
			pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'x' WHERE id = 1", pgx.QueryExecModeSimpleProtocol)
		}
	}
	// On each loop a miss, then two hits. (Goroutines relay each session
	// alone, and spread sessions over the shards by their ids, which are
	// consecutive here: two shards too.)
	want := [2]float64{4, 2}
	if loopstat.Shards < 2 {
		want = [2]float64{5, 1} // one core: one shard
	}
	hits, misses := p.Counter(t, "pgfence_rewrite_cache_hits_total"), p.Counter(t, "pgfence_rewrite_cache_misses_total")
	if [2]float64{hits, misses} != want {
		t.Fatalf("cache hits %v misses %v, want %v and %v", hits, misses, want[0], want[1])
	}
}

// Under load on two loops, with every path a statement can take through
// the policy (cached rewrites, bound simple-protocol writes, passed reads,
// stale writes, answered settings), pgfence's code neither waits for a
// lock another loop holds nor blocks: the mutex and block profiles of the
// steady state have no sample with a frame of pgfence's (run it with
// -race too: the loops share nothing unsynchronized). A log line is the
// exception: the stale log writes one a second per table at most, under
// the logger's lock.
func TestLoopsShareNoLock(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of load")
	}
	tbl := table(t, [3]any{1, "a", 0}, [3]any{2, "b", 0}, [3]any{3, "c", 0}, [3]any{4, "d", 0}, [3]any{5, "stale", 1 << 40})
	p := pgtest.StartProxy(t, []string{tbl}, func(pc *proxy.Config, fc *fence.Config) { pc.EventLoops = 2 })
	names := []string{"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7"}
	cs := p.ConnectOnLoops(t, names...)
	work := func(i int, c *pgx.Conn, n int) error {
		id := 1 + i%4
		for k := range n {
			var err error
			switch k % 6 {
			case 0: // a fenced write, prepared (pgx's default)
				_, err = c.Exec(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id = $2", fmt.Sprint(k), id)
			case 1: // a fenced write in the simple protocol: bound to its literals
				_, err = c.Exec(ctx, fmt.Sprintf("UPDATE %s SET val = 'v%d' WHERE id = %d", tbl, k%3, id), pgx.QueryExecModeSimpleProtocol)
			case 2: // the same text again and again: the rewrite cache
				_, err = c.Exec(ctx, "UPDATE "+tbl+" SET val = 'same' WHERE id = "+fmt.Sprint(id), pgx.QueryExecModeSimpleProtocol)
			case 3: // a read of the guarded table, passed
				_, err = c.Exec(ctx, "SELECT val FROM "+tbl+" WHERE id = $1", id)
			case 4: // a stale write: a reject, and the stale log
				_, err = c.Exec(ctx, "UPDATE "+tbl+" SET val = 'no' WHERE id = 5", pgx.QueryExecModeSimpleProtocol)
			case 5: // a setting pgfence answers
				_, err = c.Exec(ctx, "SET fence.token = '7'", pgx.QueryExecModeSimpleProtocol)
			}
			if err != nil {
				return fmt.Errorf("session %d, step %d: %w", i, k, err)
			}
		}
		return nil
	}
	run := func(n int) {
		var wg sync.WaitGroup
		errs := make(chan error, len(cs))
		for i, c := range cs {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- work(i, c, n) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range cs {
		pgtest.Exec(t, c, "SET fence.token = '7'")
	}
	run(60) // warm: every cache and series made

	defer runtime.SetMutexProfileFraction(runtime.SetMutexProfileFraction(1))
	runtime.SetBlockProfileRate(1)
	defer runtime.SetBlockProfileRate(0)
	mutexBefore, blockBefore := profile(runtime.MutexProfile), profile(runtime.BlockProfile)
	run(600)
	mutexAfter, blockAfter := profile(runtime.MutexProfile), profile(runtime.BlockProfile)
	if r := rejects(t, p, "public."+tbl) + rejects(t, p, tbl); r < 600 {
		t.Fatalf("%v rejects counted: the stale writes did not run", r)
	}
	if p.Server.EventLoops() == 0 {
		return // goroutines relay each session on its own, and sessions share shards
	}
	for what, d := range map[string][]string{
		"contended lock": ours(mutexBefore, mutexAfter),
		"blocking":       ours(blockBefore, blockAfter),
	} {
		if len(d) > 0 {
			t.Errorf("%s in pgfence's code under load:\n%s", what, strings.Join(d, "\n"))
		}
	}
}

// profile takes a snapshot of a runtime profile of blocking events
// (runtime.MutexProfile or BlockProfile), by stack.
func profile(get func([]runtime.BlockProfileRecord) (int, bool)) map[[32]uintptr]runtime.BlockProfileRecord {
	var recs []runtime.BlockProfileRecord
	for n := 256; ; n *= 2 {
		recs = make([]runtime.BlockProfileRecord, n)
		if k, ok := get(recs); ok {
			recs = recs[:k]
			break
		}
	}
	out := make(map[[32]uintptr]runtime.BlockProfileRecord, len(recs))
	for _, r := range recs {
		out[r.Stack0] = r
	}
	return out
}

// ours lists the stacks with events between two snapshots that pass
// through pgfence's own code (not the tests' or the test harness's).
func ours(before, after map[[32]uintptr]runtime.BlockProfileRecord) []string {
	var out []string
	for k, r := range after {
		n := r.Count - before[k].Count
		if n <= 0 {
			continue
		}
		frames := runtime.CallersFrames(r.Stack())
		var stack []string
		mine, logs := false, false
		for {
			f, more := frames.Next()
			stack = append(stack, fmt.Sprintf("    %s (%s:%d)", f.Function, f.File, f.Line))
			if strings.Contains(f.Function, "github.com/pgfence/pgfence/") && !strings.Contains(f.Function, "pgtest") && !strings.HasSuffix(f.File, "_test.go") {
				mine = true
			}
			logs = logs || strings.HasPrefix(f.Function, "log/slog.")
			if !more {
				break
			}
		}
		if mine && !logs {
			out = append(out, fmt.Sprintf("  %d events:\n%s", n, strings.Join(stack, "\n")))
		}
	}
	return out
}
