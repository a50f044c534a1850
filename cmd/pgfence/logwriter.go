package main

import (
	"io"
	"sync"
	"time"
)

// logWriter is where pgfence's log lines go on their way to stderr. The
// relay logs as it runs (each stale write fenced is a line, as it happens),
// so a write to stderr that blocks would stop every session: a pipe to a
// log shipper that stops reading fills at 64 KiB, and then the next
// reject froze the whole proxy. A logWriter never blocks its callers: it
// keeps lines in memory and a goroutine of its own writes them out, a
// batch at a time, shortly after the first of them arrives (one write
// system call for many lines, where a storm of stale writers made one
// each). While the destination takes nothing, at most maxPendingLog bytes
// wait besides the batch it is stuck on; later lines are dropped, and
// dropped says how many once the destination takes lines again.
type logWriter struct {
	out     io.Writer
	dropped func(lines int) // called from the writer's goroutine

	mu      sync.Mutex
	pending []byte
	lost    int  // lines dropped since the last flush
	closed  bool // Close was called
	wake    chan struct{}
	done    chan struct{}
}

const (
	// maxPendingLog bounds the lines waiting for the destination.
	maxPendingLog = 4 << 20
	// logDelay is how long the writer gathers lines after the first before
	// it writes them: how late a line may reach stderr.
	logDelay = 20 * time.Millisecond
	// logCloseTimeout bounds how long Close waits for the last lines.
	logCloseTimeout = 2 * time.Second
)

// newLogWriter starts a logWriter writing to out; dropped, if not nil, is
// told how many lines were dropped, after the destination took lines again.
func newLogWriter(out io.Writer, dropped func(lines int)) *logWriter {
	w := &logWriter{out: out, dropped: dropped, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// Write takes one log line (slog's handlers write a record at a time). It
// never blocks on the destination and never fails.
func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	first := len(w.pending) == 0 && !w.closed
	if len(w.pending)+len(p) > maxPendingLog {
		w.lost++
	} else {
		w.pending = append(w.pending, p...)
	}
	w.mu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (w *logWriter) run() {
	defer close(w.done)
	var batch []byte
	for {
		<-w.wake
		time.Sleep(logDelay) // what comes with it goes in the same write
		w.mu.Lock()
		batch, w.pending = w.pending, batch[:0]
		lost, closed := w.lost, w.closed
		w.lost = 0
		w.mu.Unlock()
		if len(batch) > 0 {
			w.out.Write(batch) // nothing to do about a failed write of the log
		}
		if lost > 0 && w.dropped != nil {
			w.dropped(lost)
		}
		if closed {
			return
		}
		if cap(batch) > 64<<10 {
			batch = nil // a storm's buffer is not kept for good
		}
	}
}

// Close writes out what is pending, waiting at most logCloseTimeout for
// the destination. Lines written after it are kept but never written.
func (w *logWriter) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case <-w.done:
	case <-time.After(logCloseTimeout):
	}
	return nil
}
