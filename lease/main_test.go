package lease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/lease"
)

// The tests run real servers: Postgres (pgtest), etcd and ZooKeeper
// (leasetest, from scripts/install-lease-deps.sh). A missing one fails the
// tests with the step that installs it.
func TestMain(m *testing.M) { pgtest.Main(m) }

// waitDone waits for ctx to end, failing the test after d.
func waitDone(t *testing.T, ctx context.Context, d time.Duration, what string) time.Time {
	t.Helper()
	select {
	case <-ctx.Done():
		return time.Now()
	case <-time.After(d):
		t.Fatalf("%s: not done after %v", what, d)
		return time.Time{}
	}
}

// checkExclusiveAndMonotonic has holders goroutines, each with its own
// Lock from newLock, take the lock rounds times each; it checks that no
// two hold it at once and that tokens grow strictly in the order the lock
// was granted.
func checkExclusiveAndMonotonic(t *testing.T, holders, rounds int, newLock func(i int) lease.Lock) {
	t.Helper()
	var (
		inside atomic.Int32
		mu     sync.Mutex
		order  []int64
		wg     sync.WaitGroup
		errs   = make(chan error, holders*rounds)
	)
	for i := 0; i < holders; i++ {
		lk := newLock(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				l, err := lk.Acquire(ctx)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- errors.New("two holders at once")
				}
				mu.Lock()
				order = append(order, l.Token)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				if !l.Valid() {
					errs <- errors.New("lease invalid while held")
				}
				inside.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(order) != holders*rounds {
		t.Fatalf("%d grants, want %d", len(order), holders*rounds)
	}
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("tokens in grant order are not increasing: %v", order)
		}
	}
	t.Logf("%d grants, tokens %d..%d", len(order), order[0], order[len(order)-1])
}

// checkReleased checks a released lease's state.
func checkReleased(t *testing.T, l *lease.Lease) {
	t.Helper()
	if l.Valid() {
		t.Error("Valid after Release")
	}
	if !errors.Is(l.Err(), lease.ErrReleased) {
		t.Errorf("Err after Release = %v, want ErrReleased", l.Err())
	}
	if l.Context().Err() == nil {
		t.Error("Context not done after Release")
	}
}
