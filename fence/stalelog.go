package fence

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgfence/pgfence/internal/loopstat"
)

// staleLog decides which stale writes get a log line of their own. In a
// storm (a paused fleet waking up with expired leases) every stale write
// would be a line: thousands a second, which cost the relay more than the
// fencing itself and bury everything else in the log. So the first stale
// write of each table, kind, path and rollout gets its line at once, and
// then at most one per interval does, saying how many it stands for (the
// stale writes of its key fenced since the previous line and not logged).
// fencing_reject_total and fencing_token_gap count every one. An interval
// of 0 logs every stale write.
//
// A key is its fencing_reject_total series, which has those labels (and
// the policy's database). A stale write that gets no line takes no lock
// and writes no line another loop writes: it reads when the key's next
// line is due, and counts itself in its loop's shard.
type staleLog struct {
	lines sync.Map // *loopstat.Counter -> *staleLine
}

// staleLine is a key's state: when its next line is due, and its stale
// writes not logged.
type staleLine struct {
	next     atomic.Int64      // UnixNano; 0 before the key's first line
	unlogged *loopstat.Counter // every stale write of the key not logged
	mu       sync.Mutex        // taken to write a line
	reported uint64            // of unlogged, those lines said, under mu
}

// admit reports whether a stale write of key k at now, counted in shard,
// gets a line, and if so how many of k's stale writes went unlogged since
// k's previous line.
func (l *staleLog) admit(k *loopstat.Counter, shard int, now time.Time, interval time.Duration) (ok bool, unlogged int64) {
	if interval <= 0 {
		return true, 0
	}
	v, found := l.lines.Load(k)
	if !found {
		v, _ = l.lines.LoadOrStore(k, &staleLine{unlogged: loopstat.NewCounter()})
	}
	line := v.(*staleLine)
	t := now.UnixNano()
	if t < line.next.Load() {
		line.unlogged.Inc(shard)
		return false, 0
	}
	line.mu.Lock()
	defer line.mu.Unlock()
	if t < line.next.Load() { // another write took the line
		line.unlogged.Inc(shard)
		return false, 0
	}
	total := line.unlogged.Value()
	unlogged, line.reported = int64(total-line.reported), total
	line.next.Store(t + int64(interval))
	return true, unlogged
}
