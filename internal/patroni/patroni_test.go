package patroni_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/patroni"
	"github.com/pgfence/pgfence/lease/leasetest"
)

// TestFailover starts a synchronous two-node cluster, writes through the
// multi-host URL, then moves the leadership twice (a planned switchover,
// then SIGKILL of the leader) and checks each time that the new leader is
// the other node, has every row written so far and takes a new write.
func TestFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	etcd := leasetest.StartEtcdT(t)

	t0 := time.Now()
	c, err := patroni.Start(ctx, etcd.Endpoints(), patroni.Options{Synchronous: true})
	if errors.Is(err, patroni.ErrNotInstalled) {
		t.Fatalf("%v\n(patroni is required for this test; run `bash scripts/install-patroni.sh`)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	t.Logf("cluster %s up in %v", c.Scope, time.Since(t0).Round(time.Millisecond))

	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatalf("Leader: %v\n%s", err, c.Logs())
	}
	if nodes := c.Nodes(); len(nodes) != 2 || (leader != nodes[0] && leader != nodes[1]) {
		t.Fatalf("Nodes() = %v, Leader() = %v", nodes, leader)
	}

	exec := func(sql string, args ...any) {
		t.Helper()
		qctx, qcancel := context.WithTimeout(ctx, 20*time.Second)
		defer qcancel()
		conn, err := pgx.Connect(qctx, c.HostsURL("postgres"))
		if err != nil {
			t.Fatalf("connect %s: %v\n%s", c.HostsURL("postgres"), err, c.Logs())
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(qctx, sql, args...); err != nil {
			t.Fatalf("%s: %v\n%s", sql, err, c.Logs())
		}
	}
	// check asserts that n is the leader and has exactly the rows 1..want.
	check := func(n *patroni.Node, want int) {
		t.Helper()
		if l, err := c.Leader(ctx); err != nil || l != n {
			t.Fatalf("Leader() = %v, %v; want %s\n%s", l, err, n.Name, c.Logs())
		}
		qctx, qcancel := context.WithTimeout(ctx, 20*time.Second)
		defer qcancel()
		conn, err := pgx.Connect(qctx, n.URL("postgres"))
		if err != nil {
			t.Fatalf("connect %s: %v", n.Name, err)
		}
		defer conn.Close(context.Background())
		var count, max int
		var inRecovery bool
		if err := conn.QueryRow(qctx, "SELECT count(*), coalesce(max(id), 0), pg_is_in_recovery() FROM t").Scan(&count, &max, &inRecovery); err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if count != want || max != want || inRecovery {
			t.Fatalf("%s: count=%d max=%d in_recovery=%v; want %d rows, not in recovery", n.Name, count, max, inRecovery, want)
		}
	}

	exec("CREATE TABLE t (id int PRIMARY KEY)")
	exec("INSERT INTO t VALUES (1)")
	check(leader, 1)

	t1 := time.Now()
	next, err := c.Failover(ctx)
	if err != nil {
		t.Fatalf("Failover: %v", err)
	}
	t.Logf("switchover %s -> %s in %v", leader.Name, next.Name, time.Since(t1).Round(time.Millisecond))
	if next == leader {
		t.Fatalf("Failover returned the old leader %s", leader.Name)
	}
	check(next, 1)
	exec("INSERT INTO t VALUES (2)")
	check(next, 2)

	t2 := time.Now()
	last, err := c.KillLeader(ctx)
	if err != nil {
		t.Fatalf("KillLeader: %v", err)
	}
	t.Logf("kill -9 of %s, %s promoted and %s back as standby in %v", next.Name, last.Name, next.Name, time.Since(t2).Round(time.Millisecond))
	if last != leader {
		t.Fatalf("KillLeader returned %v; want %s", last, leader.Name)
	}
	check(last, 2)
	exec("INSERT INTO t VALUES (3)")
	check(last, 3)
}
