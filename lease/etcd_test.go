package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/pgfence/pgfence/internal/netfault"
	"github.com/pgfence/pgfence/lease"
	"github.com/pgfence/pgfence/lease/leasetest"
)

func etcdClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func acquire(t *testing.T, lk lease.Lock) *lease.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := lk.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(func() { l.Release(context.Background()) })
	return l
}

func TestEtcd(t *testing.T) {
	srv := leasetest.StartEtcdT(t)
	admin := etcdClient(t, srv.Endpoints())
	ctx := context.Background()

	t.Run("AcquireRelease", func(t *testing.T) {
		lk := &lease.Etcd{Client: admin, Prefix: "/locks/acquire", TTL: 2 * time.Second, SafetyMargin: 500 * time.Millisecond}
		l := acquire(t, lk)
		if !l.Valid() || l.Err() != nil || l.Context().Err() != nil {
			t.Fatalf("fresh lease: Valid=%v Err=%v", l.Valid(), l.Err())
		}
		if l.TTL != 2*time.Second || l.Margin != 500*time.Millisecond {
			t.Errorf("TTL %v margin %v, want 2s and 500ms", l.TTL, l.Margin)
		}
		if d := time.Until(l.Deadline()); d <= 0 || d > 1500*time.Millisecond {
			t.Errorf("deadline in %v, want within TTL - margin", d)
		}
		// The token is the lock key's create revision.
		resp, err := admin.Get(ctx, "/locks/acquire/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != l.Token {
			t.Fatalf("lock keys %v, want one with create revision %d", resp.Kvs, l.Token)
		}
		// Held past several TTLs: the renewals keep it.
		time.Sleep(5 * time.Second)
		if !l.Valid() {
			t.Fatalf("lease lost while renewed: %v", l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		checkReleased(t, l)
		resp, err = admin.Get(ctx, "/locks/acquire/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 0 {
			t.Errorf("%d lock keys left after Release", resp.Count)
		}
		l2 := acquire(t, lk)
		if l2.Token <= l.Token {
			t.Errorf("second grant's token %d not above the first's %d", l2.Token, l.Token)
		}
	})

	t.Run("TokensGrowAcrossHolders", func(t *testing.T) {
		checkExclusiveAndMonotonic(t, 4, 5, func(int) lease.Lock {
			return &lease.Etcd{Client: etcdClient(t, srv.Endpoints()), Prefix: "/locks/many", TTL: 2 * time.Second}
		})
	})

	t.Run("RevokedLeaseIsLost", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m := lease.NewMetrics(reg)
		a := acquire(t, m.Instrument("revoke", &lease.Etcd{Client: etcdClient(t, srv.Endpoints()), Prefix: "/locks/revoke", TTL: 5 * time.Second}))
		resp, err := admin.Get(ctx, "/locks/revoke/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("lock keys: %v %v", resp, err)
		}
		start := time.Now()
		if _, err := admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
			t.Fatal(err)
		}
		// Noticed at the next renewal (every (TTL-margin)/3 = 1.33 s) or
		// when the session's keep-alive stream hears of it.
		waitDone(t, a.Context(), 3*time.Second, "revoked lease's context")
		t.Logf("revocation noticed after %v: %v", time.Since(start).Round(time.Millisecond), a.Err())
		if a.Valid() || !errors.Is(a.Err(), lease.ErrLost) {
			t.Errorf("after revoke: Valid=%v Err=%v, want ErrLost", a.Valid(), a.Err())
		}
		// Counted as lost while its holder was at work, once its context's
		// callback has run; its Acquire was timed.
		for end := time.Now().Add(5 * time.Second); sample(t, reg, "lease_expired_while_executing_total") != 1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("lease_expired_while_executing_total = %v, want 1", sample(t, reg, "lease_expired_while_executing_total"))
			}
		}
		if n := sample(t, reg, "pgfence_lease_acquire_seconds"); n != 1 {
			t.Errorf("pgfence_lease_acquire_seconds count %v, want 1", n)
		}
		if err := a.Release(ctx); err != nil {
			t.Errorf("Release after loss: %v", err)
		}
		b := acquire(t, &lease.Etcd{Client: admin, Prefix: "/locks/revoke", TTL: 5 * time.Second})
		if b.Token <= a.Token {
			t.Errorf("next holder's token %d not above %d", b.Token, a.Token)
		}
	})

	t.Run("ClosedClientLosesLease", func(t *testing.T) {
		c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		a := acquire(t, &lease.Etcd{Client: c, Prefix: "/locks/closed", TTL: 5 * time.Second})
		start := time.Now()
		c.Close()
		waitDone(t, a.Context(), 2*time.Second, "lease of a closed client")
		t.Logf("noticed after %v: %v", time.Since(start).Round(time.Millisecond), a.Err())
		if !errors.Is(a.Err(), lease.ErrLost) {
			t.Errorf("Err = %v, want ErrLost", a.Err())
		}
	})

	// A holder cut off from etcd stops counting its lease as valid before
	// etcd expires it and hands the lock to the next holder.
	t.Run("SafetyMarginBeatsServerExpiry", func(t *testing.T) {
		relay, err := netfault.NewRelay(srv.ClientAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { relay.Close() })
		const ttl, margin = 2 * time.Second, 600 * time.Millisecond
		a := acquire(t, &lease.Etcd{Client: etcdClient(t, []string{"http://" + relay.Addr()}), Prefix: "/locks/margin", TTL: ttl, SafetyMargin: margin})
		t.Cleanup(relay.Heal)

		resp, err := admin.Get(ctx, "/locks/margin/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("lock keys: %v %v", resp, err)
		}
		key := string(resp.Kvs[0].Key)
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		deleted := make(chan time.Time, 1)
		watch := admin.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1))
		go func() {
			for wr := range watch {
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						deleted <- time.Now()
						return
					}
				}
			}
		}()

		time.Sleep(300 * time.Millisecond)
		relay.Partition()
		parted := time.Now()
		lastDeadline := a.Deadline()
		lost := waitDone(t, a.Context(), 2*ttl, "partitioned holder's context")
		var del time.Time
		select {
		case del = <-deleted:
		case <-time.After(3 * ttl):
			t.Fatal("etcd never expired the partitioned holder's lease")
		}
		t.Logf("partitioned at 0; holder's deadline %v; holder stopped at %v; etcd deleted the lock key at %v",
			lastDeadline.Sub(parted).Round(time.Millisecond), lost.Sub(parted).Round(time.Millisecond), del.Sub(parted).Round(time.Millisecond))
		if !errors.Is(a.Err(), lease.ErrExpired) {
			t.Errorf("Err = %v, want ErrExpired", a.Err())
		}
		if !lost.Before(del) {
			t.Fatalf("holder noticed the loss at %v, after etcd expired the lease at %v", lost, del)
		}
		if gap := del.Sub(lost); gap < margin/2 {
			t.Errorf("holder stopped only %v before etcd expired the lease; margin is %v", gap, margin)
		}
		b := acquire(t, &lease.Etcd{Client: admin, Prefix: "/locks/margin", TTL: ttl})
		if b.Token <= a.Token {
			t.Errorf("next holder's token %d not above %d", b.Token, a.Token)
		}
	})

	t.Run("BadMargin", func(t *testing.T) {
		_, err := (&lease.Etcd{Client: admin, Prefix: "/locks/bad", TTL: 2 * time.Second, SafetyMargin: 3 * time.Second}).Acquire(ctx)
		if err == nil {
			t.Fatal("a margin above the TTL was accepted")
		}
		t.Log(err)
	})
}

// sample reads a lease series from reg: a counter's value or a histogram's
// sample count, summed over its label values.
func sample(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}
