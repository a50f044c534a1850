package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgbouncer"
)

// DDL inside a transaction block does not hold the block's next statement
// for a catalog read, which could not see the uncommitted DDL: behind a
// transaction pooler whose one server connection the block holds, that
// read waited for the connection, and the statement for the read's
// timeout, three times over. The read comes once the block commits: a
// table the block made is fenced by the next statement after it.
func TestDDLInBlockReadsAfterCommit(t *testing.T) {
	s := newServeTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := s.bouncerWith(pgbouncer.Options{PoolMode: "transaction", PoolSize: 1})
	inst := s.serve(serveOptions{upstream: "postgres://postgres@" + b.Addr() + "/postgres?sslmode=disable",
		upstreamPooling: poolingTransaction, backstop: "off", discover: true, discoverInterval: time.Hour})
	c, err := pgx.Connect(ctx, "postgres://postgres@"+inst.Addr()+"/postgres?sslmode=disable&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	quick, cancelQuick := context.WithTimeout(ctx, 10*time.Second)
	defer cancelQuick()
	for _, sql := range []string{
		"BEGIN",
		"CREATE TABLE block_t (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 0)",
		"INSERT INTO block_t (id, v, fence_epoch) VALUES (1, 'a', 100)",
		"SELECT 1",
		"COMMIT",
	} {
		if _, err := c.Exec(quick, sql); err != nil {
			t.Fatalf("%s, in a block behind a pooler of one server connection: %v", sql, err)
		}
	}
	if _, err := c.Exec(ctx, "SET fence.token = '50'"); err != nil {
		t.Fatal(err)
	}
	tg, err := c.Exec(ctx, "UPDATE block_t SET v = 'stale' WHERE id = 1")
	if err != nil || tg.String() != "UPDATE 0" {
		t.Fatalf("a stale write to the table the block made, after its commit: %v %v, want UPDATE 0", tg, err)
	}
}
