package main

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lockedBuffer is a destination that takes everything.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// gate is a destination that takes nothing until it is opened.
type gate struct {
	open chan struct{}
	got  lockedBuffer
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	return g.got.Write(p)
}

// Every line written from many goroutines reaches the destination whole,
// in far fewer writes than lines, and Close writes out the last of them.
func TestLogWriterDeliversEveryLine(t *testing.T) {
	var out lockedBuffer
	w := newLogWriter(&out, func(int) { t.Error("a line was dropped") })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				fmt.Fprintf(w, "level=WARN msg=\"stale write fenced\" goroutine=%d line=%d\n", g, i)
			}
		}()
	}
	wg.Wait()
	w.Close()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 8*500 {
		t.Fatalf("%d lines reached the destination, want %d", len(lines), 8*500)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		if !strings.HasPrefix(l, `level=WARN msg="stale write fenced" goroutine=`) || seen[l] {
			t.Fatalf("line broken or repeated: %q", l)
		}
		seen[l] = true
	}
	if out.writes >= len(lines) {
		t.Errorf("%d writes for %d lines: not batched", out.writes, len(lines))
	}
}

// A destination that takes nothing does not block a writer: lines wait,
// up to maxPendingLog bytes, the rest are dropped and counted, and once the
// destination takes lines again it gets those kept and the count.
func TestLogWriterNeverBlocks(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	var dropped atomic.Int64
	w := newLogWriter(g, func(n int) { dropped.Add(int64(n)) })
	line := strings.Repeat("x", 255) + "\n"
	const n = 2 * maxPendingLog / 256 // twice what may wait
	start := time.Now()
	for range n {
		w.Write([]byte(line))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("%d writes to a stalled destination took %v", n, d)
	}
	close(g.open)
	w.Close()
	kept := strings.Count(g.got.String(), "\n")
	if kept == 0 || kept+int(dropped.Load()) != n {
		t.Fatalf("%d lines written, %d dropped, of %d", kept, dropped.Load(), n)
	}
	if kept*len(line) > 2*maxPendingLog { // those waiting, and the batch being written
		t.Errorf("%d bytes were kept, more than twice maxPendingLog", kept*len(line))
	}
}

// Close gives up on a destination that never takes its lines.
func TestLogWriterCloseGivesUp(t *testing.T) {
	w := newLogWriter(&gate{open: make(chan struct{})}, nil)
	w.Write([]byte("a line nobody reads\n"))
	start := time.Now()
	w.Close()
	if d := time.Since(start); d > logCloseTimeout+time.Second {
		t.Fatalf("Close took %v", d)
	}
}
