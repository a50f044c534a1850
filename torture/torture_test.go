package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The writers are this test binary, re-executed with -writer.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-writer" {
		os.Exit(writerMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// lineLogger sends whole lines to t.Log.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line)
			return len(p), nil
		}
		l.t.Log(strings.TrimRight(line, "\n"))
	}
}

// TestTorture is a short `make torture`: about 30 s of faults in all.
// Through pgfence no stale write may land and some must have been
// rejected; straight to Postgres the same faults must produce violations.
func TestTorture(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig()
	cfg.Duration = 18 * time.Second
	cfg.DirectDuration = 10 * time.Second
	cfg.FailoverDuration = 30 * time.Second
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Verbose = true
	cfg.Out = &lineLogger{t: t}
	cfg.Exe = exe

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rs, err := session(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	fenced, direct := rs.fenced, rs.direct
	if fenced.Violations != 0 {
		t.Errorf("through pgfence: %d violations: %v", fenced.Violations, fenced.ViolationExamples)
	}
	if fenced.Mismatches != 0 {
		t.Errorf("through pgfence: logs and database disagree: %v", fenced.MismatchExamples)
	}
	if fenced.StaleRejected == 0 {
		t.Errorf("through pgfence: no stale write was rejected (%d stale); the run proved nothing", fenced.Stale)
	}
	if fenced.StaleLanded != 0 {
		t.Errorf("through pgfence: %d stale writes landed", fenced.StaleLanded)
	}
	if direct.Violations == 0 {
		t.Errorf("straight to Postgres: no violations (%d stale writes); the check did not show it can fail", direct.Stale)
	}
	// A failover with synchronous replication keeps every epoch Postgres
	// acknowledged: the fence holds across it.
	if s := rs.sync; !s.failoverSafe() {
		t.Errorf("failovers with synchronous replication: %d violations, %d stale writes landed, %d acknowledged writes lost (%v), %d landed below a lost token, %d mismatches (%v)",
			s.Violations, s.StaleLanded, s.LostCommitted, s.LostExamples, s.LandedBelowLost, s.Mismatches, s.MismatchExamples)
	}
	if s := rs.sync; s.Faults["switchover"]+s.Faults["kill-leader"] == 0 {
		t.Errorf("the synchronous failover run had no failover: %v", s.Faults)
	}
	if a := rs.async; a.Faults["kill-leader"] > 0 && a.LostCommitted == 0 {
		// Not a failure of pgfence: the partition did not catch a commit.
		t.Logf("the asynchronous run's kill-leader lost no acknowledged write this time")
	}
}
