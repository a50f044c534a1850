package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/lease"
	"github.com/pgfence/pgfence/lease/leasetest"
	"github.com/pgfence/pgfence/proxy"
)

// lockKind is one lock service under test, with a way to make a holder
// lose its lease (the service ends it; the holder's process goes on).
type lockKind struct {
	name  string
	start func(t *testing.T) (newLock func(prefix string) lease.Lock, expire func(t *testing.T, prefix string))
}

var lockKinds = []lockKind{
	{"etcd", func(t *testing.T) (func(string) lease.Lock, func(*testing.T, string)) {
		srv := leasetest.StartEtcdT(t)
		admin := etcdClient(t, srv.Endpoints())
		newLock := func(prefix string) lease.Lock {
			return &lease.Etcd{Client: etcdClient(t, srv.Endpoints()), Prefix: prefix, TTL: 5 * time.Second}
		}
		// Revoke the holder's etcd lease (what etcd does when its TTL
		// runs out without a keep-alive).
		expire := func(t *testing.T, prefix string) {
			ctx := context.Background()
			resp, err := admin.Get(ctx, prefix+"/", clientv3.WithFirstCreate()...)
			if err != nil || len(resp.Kvs) == 0 {
				t.Fatalf("lock holder's key: %v %v", resp, err)
			}
			if _, err := admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
				t.Fatal(err)
			}
		}
		return newLock, expire
	}},
	{"zookeeper", func(t *testing.T) (func(string) lease.Lock, func(*testing.T, string)) {
		srv := leasetest.StartZooKeeperT(t, leasetest.ZooKeeperOptions{MaxSessionTimeout: 10 * time.Second})
		admin := zkConn(t, srv.Addr)
		newLock := func(prefix string) lease.Lock {
			return &lease.ZooKeeper{Servers: []string{srv.Addr}, Path: prefix, SessionTimeout: 5 * time.Second}
		}
		// Delete the holder's lock znode (what ZooKeeper does when its
		// session expires).
		expire := func(t *testing.T, prefix string) {
			nodes := zkLockNodes(t, admin, prefix)
			if len(nodes) != 1 {
				t.Fatalf("lock nodes %v", nodes)
			}
			if err := admin.Delete(nodes[0], -1); err != nil {
				t.Fatal(err)
			}
		}
		return newLock, expire
	}},
}

// Holder A takes the lock and is "paused" between checking its lease and
// writing; meanwhile its lease ends and B takes the lock with a larger
// token and writes. A wakes and writes with its token through pgfence:
// 0 rows. WithLease would not even have begun.
func TestFencedThroughPgfence(t *testing.T) {
	for _, kind := range lockKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			newLock, expire := kind.start(t)
			table := "lease_e2e_" + kind.name
			direct := pgtest.Direct(t)
			pgtest.Exec(t, direct, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %[1]s (id int PRIMARY KEY, owner text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO %[1]s (id, owner) VALUES (1, 'nobody')", table))
			p := pgtest.StartProxy(t, []string{table})
			connA, connB := p.Connect(t), p.Connect(t)
			update := fmt.Sprintf("UPDATE %s SET owner = $1 WHERE id = 1", table)
			prefix := "/locks/" + table

			a := acquire(t, newLock(prefix))
			if !a.Valid() {
				t.Fatal("A's fresh lease is not valid")
			}
			// A checked its lease and is about to write... and pauses.
			expire(t, prefix)
			b := acquire(t, newLock(prefix))
			if b.Token <= a.Token {
				t.Fatalf("B's token %d is not above A's %d", b.Token, a.Token)
			}
			var rowsB int64
			if err := lease.WithLease(ctx, connB, b, func(ctx context.Context, tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, update, "B")
				rowsB = tag.RowsAffected()
				return err
			}); err != nil {
				t.Fatalf("B's write: %v", err)
			}
			if rowsB != 1 {
				t.Fatalf("B's write: %d rows, want 1", rowsB)
			}

			// A wakes up and writes with the token it holds.
			var rowsA int64 = -1
			if err := lease.WithToken(ctx, connA, a.Token, func(ctx context.Context, tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, update, "A")
				rowsA = tag.RowsAffected()
				return err
			}); err != nil {
				t.Fatalf("A's write: %v", err)
			}
			if rowsA != 0 {
				t.Fatalf("stale holder A's write through pgfence: %d rows, want 0", rowsA)
			}
			var owner string
			var epoch int64
			if err := direct.QueryRow(ctx, "SELECT owner, fence_epoch FROM "+table+" WHERE id = 1").Scan(&owner, &epoch); err != nil {
				t.Fatal(err)
			}
			if owner != "B" || epoch != b.Token {
				t.Fatalf("row: owner %q epoch %d, want B and %d", owner, epoch, b.Token)
			}
			if n := p.Counter(t, "fencing_reject_total", "table="+table); n != 1 {
				t.Errorf("fencing_reject_total = %v, want 1", n)
			}
			// Both set the token with a SET LOCAL pgfence answered itself
			// (the event loop does; the goroutine relay forwards it).
			answered := p.Counter(t, "pgfence_token_sets_answered_total")
			if want := map[bool]float64{true: 0, false: 2}[os.Getenv("PGFENCE_TEST_RELAY") == "goroutines"]; answered != want {
				t.Errorf("pgfence_token_sets_answered_total = %v, want %v", answered, want)
			}

			// Once A knows its lease is gone, WithLease refuses to begin.
			waitDone(t, a.Context(), 5*time.Second, "A's lease")
			err := lease.WithLease(ctx, connA, a, func(ctx context.Context, tx pgx.Tx) error {
				t.Error("WithLease ran fn on a lost lease")
				return nil
			})
			if !errors.Is(err, lease.ErrLost) {
				t.Fatalf("WithLease on a lost lease: %v, want ErrLost", err)
			}
			t.Logf("A token %d: UPDATE 0 through pgfence; B token %d: UPDATE 1; A's WithLease: %v", a.Token, b.Token, err)
		})
	}
}

// WithLease does not commit when the lease is lost while fn runs, and the
// statements it runs after the loss are cancelled.
func TestWithLeaseRollsBackOnLoss(t *testing.T) {
	ctx := context.Background()
	newLock, expire := lockKinds[0].start(t)
	direct := pgtest.Direct(t)
	pgtest.Exec(t, direct, "DROP TABLE IF EXISTS lease_rollback; CREATE TABLE lease_rollback (id int PRIMARY KEY, n int, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO lease_rollback (id, n) VALUES (1, 0)")
	p := pgtest.StartProxy(t, []string{"lease_rollback"})
	conn := p.Connect(t)
	a := acquire(t, newLock("/locks/rollback"))
	err := lease.WithLease(ctx, conn, a, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE lease_rollback SET n = n + 1 WHERE id = 1"); err != nil {
			return err
		}
		expire(t, "/locks/rollback")
		<-a.Context().Done()
		return nil
	})
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("WithLease = %v, want ErrLost", err)
	}
	var n int
	if err := direct.QueryRow(ctx, "SELECT n FROM lease_rollback WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("n = %d: the write of a lost lease was committed", n)
	}

	// A statement in flight when the lease is lost is cancelled.
	b := acquire(t, newLock("/locks/rollback"))
	start := time.Now()
	err = lease.WithLease(ctx, p.Connect(t), b, func(ctx context.Context, tx pgx.Tx) error {
		go func() { time.Sleep(200 * time.Millisecond); expire(t, "/locks/rollback") }()
		_, err := tx.Exec(ctx, "SELECT pg_sleep(30)")
		return err
	})
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("WithLease with a statement in flight = %v, want ErrLost", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("statement not cancelled: took %v", d)
	}
	t.Logf("in-flight statement ended %v after start: %v", time.Since(start).Round(time.Millisecond), err)
}

// The token is set for the transaction only (SET LOCAL semantics), and
// the setting name is configurable.
func TestWithTokenSettingIsLocal(t *testing.T) {
	ctx := context.Background()
	direct := pgtest.Direct(t)
	pgtest.Exec(t, direct, "DROP TABLE IF EXISTS lease_local; CREATE TABLE lease_local (id int PRIMARY KEY, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO lease_local (id) VALUES (1)")
	p := pgtest.StartProxy(t, []string{"lease_local"}, func(_ *proxy.Config, f *fence.Config) { f.TokenSetting = "app.lease_token" })
	conn := p.Connect(t)
	f := lease.Fencer{Setting: "app.lease_token"}
	var inside string
	err := f.WithToken(ctx, conn, 42, func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT current_setting('app.lease_token')").Scan(&inside); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE lease_local SET id = id WHERE id = 1")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != "42" {
		t.Errorf("token inside the transaction = %q, want 42", inside)
	}
	var after *string
	if err := conn.QueryRow(ctx, "SELECT nullif(current_setting('app.lease_token', true), '')").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != nil {
		t.Errorf("token still set after the transaction: %q", *after)
	}
	// Without a token, pgfence refuses the write (the setting did not leak).
	if _, err := conn.Exec(ctx, "UPDATE lease_local SET id = id WHERE id = 1"); err == nil {
		t.Error("a write without a token went through after WithToken")
	}
	var epoch int64
	if err := direct.QueryRow(ctx, "SELECT fence_epoch FROM lease_local").Scan(&epoch); err != nil || epoch != 42 {
		t.Errorf("epoch %d (%v), want 42", epoch, err)
	}
}
