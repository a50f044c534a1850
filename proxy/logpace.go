package proxy

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logPaceBurst is how many lines of a kind a logPace lets through a second.
const logPaceBurst = 10

// logPace paces the log lines a client can make as fast as it connects
// (red team 7b: refused connections wrote 189 MB of log in 3 s): at most
// logPaceBurst a second, and the next line logged after some were dropped
// says how many (unlogged=N).
type logPace struct {
	mu       sync.Mutex
	second   time.Time // start of the current second's window
	n        int       // lines let through in it
	unlogged int       // lines dropped since the last one logged
}

// note counts a line at now, and reports whether it is logged and, if so,
// how many were dropped before it.
func (p *logPace) note(now time.Time) (ok bool, unlogged int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.second) >= time.Second {
		p.second, p.n = now, 0
	}
	if p.n >= logPaceBurst {
		p.unlogged++
		return false, 0
	}
	p.n++
	unlogged, p.unlogged = p.unlogged, 0
	return true, unlogged
}

// log logs msg with args at level through l, unless the pace drops it.
func (p *logPace) log(l *slog.Logger, level slog.Level, msg string, args ...any) {
	ok, unlogged := p.note(time.Now())
	if !ok {
		return
	}
	if unlogged > 0 {
		args = append(args, "unlogged", unlogged)
	}
	l.Log(context.Background(), level, msg, args...)
}

// truncateName cuts a name a client sent to Postgres's limit for names
// (63 bytes), as Postgres itself reads it, for the log.
func truncateName(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}
