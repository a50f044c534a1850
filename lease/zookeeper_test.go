package lease_test

import (
	"context"
	"errors"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/pgfence/pgfence/internal/netfault"
	"github.com/pgfence/pgfence/lease"
	"github.com/pgfence/pgfence/lease/leasetest"
)

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

func zkConn(t *testing.T, addr string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// zkLockNodes lists the lock znodes under p (full paths).
func zkLockNodes(t *testing.T, c *zk.Conn, p string) []string {
	t.Helper()
	children, _, err := c.Children(p)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatal(err)
	}
	var out []string
	for _, ch := range children {
		out = append(out, p+"/"+ch)
	}
	return out
}

func TestZooKeeper(t *testing.T) {
	// tickTime 100 ms; sessions between 400 ms and 4 s.
	srv := leasetest.StartZooKeeperT(t, leasetest.ZooKeeperOptions{
		TickTime:          100 * time.Millisecond,
		MinSessionTimeout: 400 * time.Millisecond,
		MaxSessionTimeout: 4 * time.Second,
	})
	admin := zkConn(t, srv.Addr)
	servers := []string{srv.Addr}

	t.Run("AcquireRelease", func(t *testing.T) {
		lk := &lease.ZooKeeper{Servers: servers, Path: "/locks/acquire", SessionTimeout: 2 * time.Second, SafetyMargin: 400 * time.Millisecond}
		l := acquire(t, lk)
		if !l.Valid() || l.Err() != nil {
			t.Fatalf("fresh lease: Valid=%v Err=%v", l.Valid(), l.Err())
		}
		if l.TTL != 2*time.Second || l.Margin != 400*time.Millisecond {
			t.Errorf("TTL %v margin %v, want 2s and 400ms", l.TTL, l.Margin)
		}
		// The token is the lock znode's czxid.
		nodes := zkLockNodes(t, admin, "/locks/acquire")
		if len(nodes) != 1 {
			t.Fatalf("lock nodes %v, want one", nodes)
		}
		_, st, err := admin.Exists(nodes[0])
		if err != nil {
			t.Fatal(err)
		}
		if st.Czxid != l.Token || st.EphemeralOwner == 0 {
			t.Fatalf("lock node czxid %d ephemeral owner %d; token %d", st.Czxid, st.EphemeralOwner, l.Token)
		}
		time.Sleep(3 * time.Second) // past the session timeout: kept alive
		if !l.Valid() {
			t.Fatalf("lease lost while kept alive: %v", l.Err())
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		checkReleased(t, l)
		if nodes := zkLockNodes(t, admin, "/locks/acquire"); len(nodes) != 0 {
			t.Errorf("lock nodes left after Release: %v", nodes)
		}
		l2 := acquire(t, lk)
		if l2.Token <= l.Token {
			t.Errorf("second grant's token %d not above the first's %d", l2.Token, l.Token)
		}
	})

	// The server caps the session timeout; the lease counts with what was
	// negotiated, not with what was asked for.
	t.Run("NegotiatedTimeout", func(t *testing.T) {
		l := acquire(t, &lease.ZooKeeper{Servers: servers, Path: "/locks/negotiated", SessionTimeout: 30 * time.Second})
		if l.TTL != 4*time.Second {
			t.Fatalf("TTL %v, want the server's maximum 4s", l.TTL)
		}
		if d := time.Until(l.Deadline()); d > 4*time.Second {
			t.Fatalf("deadline in %v, beyond the negotiated timeout", d)
		}
	})

	t.Run("TokensGrowAcrossHolders", func(t *testing.T) {
		checkExclusiveAndMonotonic(t, 4, 5, func(int) lease.Lock {
			return &lease.ZooKeeper{Servers: servers, Path: "/locks/many", SessionTimeout: 2 * time.Second}
		})
	})

	// The sequence suffix starts over when the lock's parent is re-created;
	// the czxid token keeps growing.
	t.Run("TokenIsZxidNotSequence", func(t *testing.T) {
		lk := &lease.ZooKeeper{Servers: servers, Path: "/locks/recreated", SessionTimeout: 2 * time.Second}
		var seqs []string
		var tokens []int64
		for i := 0; i < 2; i++ {
			for j := 0; j < 3; j++ {
				l := acquire(t, lk)
				nodes := zkLockNodes(t, admin, "/locks/recreated")
				if len(nodes) != 1 {
					t.Fatalf("lock nodes %v", nodes)
				}
				name := path.Base(nodes[0])
				seqs = append(seqs, name[strings.LastIndex(name, "lock-")+5:])
				tokens = append(tokens, l.Token)
				l.Release(context.Background())
			}
			if err := admin.Delete("/locks/recreated", -1); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("sequence suffixes %v, tokens %v", seqs, tokens)
		if seqs[3] >= seqs[2] {
			t.Fatalf("expected the sequence to start over after re-creating the parent: %v", seqs)
		}
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("tokens not increasing: %v", tokens)
			}
		}
	})

	t.Run("DeletedNodeIsLost", func(t *testing.T) {
		a := acquire(t, &lease.ZooKeeper{Servers: servers, Path: "/locks/deleted", SessionTimeout: 2 * time.Second})
		nodes := zkLockNodes(t, admin, "/locks/deleted")
		if len(nodes) != 1 {
			t.Fatalf("lock nodes %v", nodes)
		}
		if err := admin.Delete(nodes[0], -1); err != nil {
			t.Fatal(err)
		}
		waitDone(t, a.Context(), 2*time.Second, "lease whose znode was deleted")
		if !errors.Is(a.Err(), lease.ErrLost) {
			t.Errorf("Err = %v, want ErrLost", a.Err())
		}
		if err := a.Release(context.Background()); err != nil {
			t.Errorf("Release after loss: %v", err)
		}
	})

	// A holder cut off from ZooKeeper stops counting its lease as valid
	// before the server expires its session (deleting the lock znode) and
	// the next holder gets the lock.
	t.Run("SafetyMarginBeatsSessionExpiry", func(t *testing.T) {
		relay, err := netfault.NewRelay(srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { relay.Close() })
		const timeout, margin = 2 * time.Second, 800 * time.Millisecond
		a := acquire(t, &lease.ZooKeeper{Servers: []string{relay.Addr()}, Path: "/locks/margin", SessionTimeout: timeout, SafetyMargin: margin})
		t.Cleanup(relay.Heal)
		nodes := zkLockNodes(t, admin, "/locks/margin")
		if len(nodes) != 1 {
			t.Fatalf("lock nodes %v", nodes)
		}
		exists, _, ev, err := admin.ExistsW(nodes[0])
		if err != nil || !exists {
			t.Fatalf("watch %s: %v %v", nodes[0], exists, err)
		}
		deleted := make(chan time.Time, 1)
		go func() {
			if e := <-ev; e.Type == zk.EventNodeDeleted {
				deleted <- time.Now()
			}
		}()

		time.Sleep(300 * time.Millisecond)
		relay.Partition()
		parted := time.Now()
		lost := waitDone(t, a.Context(), 2*timeout, "partitioned holder's context")
		var del time.Time
		select {
		case del = <-deleted:
		case <-time.After(3 * timeout):
			t.Fatal("ZooKeeper never expired the partitioned holder's session")
		}
		t.Logf("partitioned at 0; holder stopped at %v (%v); ZooKeeper deleted the lock znode at %v",
			lost.Sub(parted).Round(time.Millisecond), a.Err(), del.Sub(parted).Round(time.Millisecond))
		if !errors.Is(a.Err(), lease.ErrLost) {
			t.Errorf("Err = %v, want ErrLost", a.Err())
		}
		if !lost.Before(del) {
			t.Fatalf("holder noticed the loss at %v, after ZooKeeper expired the session at %v", lost, del)
		}
		if gap := del.Sub(lost); gap < margin/2 {
			t.Errorf("holder stopped only %v before the session expired; margin is %v", gap, margin)
		}
		b := acquire(t, &lease.ZooKeeper{Servers: servers, Path: "/locks/margin", SessionTimeout: timeout})
		if b.Token <= a.Token {
			t.Errorf("next holder's token %d not above %d", b.Token, a.Token)
		}
	})
}
