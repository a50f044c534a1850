package fence

import (
	"sync"
	"time"
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
type staleLog struct {
	mu   sync.Mutex
	keys map[staleKey]*staleLine
}

type staleKey struct{ table, kind, via, mode string }

// staleLine is what a key's last line left: when it was written, and the
// stale writes of the key not logged since.
type staleLine struct {
	at       time.Time
	unlogged int64
}

// admit reports whether a stale write of k at now gets a line, and if so
// how many of k's stale writes went unlogged since k's previous line.
func (l *staleLog) admit(k staleKey, now time.Time, interval time.Duration) (ok bool, unlogged int64) {
	if interval <= 0 {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	line := l.keys[k]
	if line == nil {
		if l.keys == nil {
			l.keys = make(map[staleKey]*staleLine)
		}
		l.keys[k] = &staleLine{at: now}
		return true, 0
	}
	if now.Sub(line.at) < interval {
		line.unlogged++
		return false, 0
	}
	unlogged, line.at, line.unlogged = line.unlogged, now, 0
	return true, unlogged
}
