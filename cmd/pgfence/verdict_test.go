package main

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A verdict on the upstream stands for verdictFor, for the upstream it is
// about; callers that come while a check runs take its verdict instead of
// checking again.
func TestVerdictCache(t *testing.T) {
	var v verdictCache
	var checks atomic.Int32
	check := func(ok bool) func() (bool, string) {
		return func() (bool, string) { checks.Add(1); return ok, "checked" }
	}
	t0 := time.Now()
	if ok, _ := v.get(t0, "a:1", check(true)); !ok || checks.Load() != 1 {
		t.Fatalf("first call: ok %v after %d checks", ok, checks.Load())
	}
	if ok, _ := v.get(t0.Add(verdictFor/2), "a:1", check(false)); !ok || checks.Load() != 1 {
		t.Fatalf("within verdictFor: ok %v after %d checks, want the kept verdict", ok, checks.Load())
	}
	if ok, _ := v.get(t0.Add(verdictFor/2), "b:1", check(false)); ok || checks.Load() != 2 {
		t.Fatalf("another upstream: ok %v after %d checks, want a check of its own", ok, checks.Load())
	}
	if ok, _ := v.get(time.Now().Add(2*verdictFor), "b:1", check(true)); !ok || checks.Load() != 3 {
		t.Fatalf("past verdictFor: ok %v after %d checks, want a new check", ok, checks.Load())
	}

	// Many at once, while a slow check runs: one check.
	var w verdictCache
	checks.Store(0)
	release := make(chan struct{})
	slow := func() (bool, string) { checks.Add(1); <-release; return true, "slow" }
	var wg sync.WaitGroup
	started := make(chan struct{}, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			now := time.Now()
			started <- struct{}{}
			w.get(now, "a:1", slow)
		}()
	}
	for range 50 {
		<-started
	}
	close(release)
	wg.Wait()
	if n := checks.Load(); n != 1 {
		t.Fatalf("50 callers at once: %d checks, want 1", n)
	}
}
