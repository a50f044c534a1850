package fence_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// After DDL, the session's next statement waits for the catalog read the
// DDL hook starts (here: until the test says it is done), while other
// sessions go on. Inside a transaction block it does not (no read could
// see the DDL before the block commits); after the COMMIT of a block with
// DDL, the next statement waits for a read.
func TestDDLHoldsNextStatement(t *testing.T) {
	p := pgtest.StartProxy(t, []string{"accounts"})
	var calls atomic.Int32
	gates := make(chan chan struct{}, 4)
	p.Policy.SetDDLHook(func() <-chan struct{} {
		calls.Add(1)
		g := make(chan struct{})
		gates <- g
		return g
	})
	c, other := p.Connect(t), p.Connect(t)
	held := func(what string, run func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- run() }()
		var gate chan struct{}
		select {
		case gate = <-gates:
		case err := <-done:
			t.Fatalf("%s ran without waiting for the catalog read: %v", what, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no catalog read was started", what)
		}
		select {
		case err := <-done:
			t.Fatalf("%s ran before the catalog read was done: %v", what, err)
		case <-time.After(200 * time.Millisecond):
		}
		pgtest.Exec(t, other, "SELECT 1") // another session is not held
		close(gate)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still held after the catalog read", what)
		}
	}
	exec := func(sql string) func() error {
		return func() error { _, err := c.Exec(ctx, sql); return err }
	}

	pgtest.Exec(t, c, "CREATE TEMP TABLE ddl_hold (id int)")
	held("the statement after CREATE TABLE", exec("SELECT count(*) FROM ddl_hold"))
	pgtest.Exec(t, c, "SELECT 2") // not held again
	pgtest.Exec(t, c, "BEGIN")
	pgtest.Exec(t, c, "ALTER TABLE ddl_hold ADD COLUMN v text")
	pgtest.Exec(t, c, "INSERT INTO ddl_hold VALUES (1, 'a')") // not held: in the block
	if n := calls.Load(); n != 1 {
		t.Fatalf("catalog reads asked for inside the block: %d, want only the first one's", n)
	}
	pgtest.Exec(t, c, "COMMIT")
	held("the statement after the COMMIT", exec("SELECT 3"))
	pgtest.Exec(t, c, "SELECT 4")
	if n := calls.Load(); n != 2 {
		t.Fatalf("catalog reads asked for: %d, want 2", n)
	}
	// A statement that spells no DDL keyword as a word holds nothing.
	pgtest.Exec(t, c, "SELECT 'x' AS created_at, 1 AS alterations, 2 AS importer")
	pgtest.Exec(t, c, "SELECT 5")
	if n := calls.Load(); n != 2 {
		t.Fatalf("catalog reads asked for after plain statements: %d, want 2", n)
	}
}

// DDL in the middle of a pipelined batch (pgx.Batch, in pgx's default
// mode and in an unnamed-statement one) holds the batch's next statement
// without a deadlock (Postgres answers nothing of a batch before its Sync
// or a Flush, which the proxy sends), and has the catalog read again for
// the first statement after the batch: the read in the batch cannot see
// the batch's uncommitted DDL, the one after it does.
func TestDDLInBatchReadAgainAfterSync(t *testing.T) {
	p := pgtest.StartProxy(t, []string{"accounts"})
	pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS ddl_batch")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS ddl_batch") })
	// Each read notes whether it sees the table: what a catalog read
	// started then would find.
	db, err := pgx.Connect(ctx, pgtest.DirectURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(ctx) })
	reads := make(chan bool, 8)
	p.Policy.SetDDLHook(func() <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			var sees bool
			if err := db.QueryRow(ctx, "SELECT to_regclass('ddl_batch') IS NOT NULL").Scan(&sees); err != nil {
				t.Errorf("catalog read: %v", err)
			}
			reads <- sees
		}()
		return done
	})
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run(mode, func(t *testing.T) {
			c := p.Connect(t, "default_query_exec_mode="+mode)
			t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS ddl_batch") })
			tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			b := &pgx.Batch{}
			b.Queue("CREATE TABLE ddl_batch (id int)")
			b.Queue("SELECT 1")
			if err := c.SendBatch(tctx, b).Close(); err != nil {
				t.Fatalf("batch: %v", err)
			}
			if _, err := c.Exec(tctx, "SELECT 2"); err != nil {
				t.Fatal(err)
			}
			var got []bool
			for len(reads) > 0 {
				got = append(got, <-reads)
			}
			if len(got) != 2 || got[0] || !got[1] {
				t.Fatalf("catalog reads saw the table: %v, want [false true]: one in the batch, before its commit, and one after", got)
			}
		})
	}
}

// A text that commits its DDL and opens a block again (BEGIN; ALTER ...;
// COMMIT; BEGIN, or COMMIT AND CHAIN) has the catalog read before the
// session's next statement, though that statement runs in a block: the
// DDL is committed (red team 8: skipped, a renamed guarded table took stale
// writes until the next --discover-interval).
func TestDDLCommittedInTextReadsAtOnce(t *testing.T) {
	p := pgtest.StartProxy(t, []string{"accounts"})
	var calls atomic.Int32
	p.Policy.SetDDLHook(func() <-chan struct{} {
		calls.Add(1)
		return closedChan()
	})
	c := p.Connect(t)
	for i, text := range []string{
		"BEGIN; CREATE TEMP TABLE ddl_commit_a (id int); COMMIT; BEGIN",
		"CREATE TEMP TABLE ddl_commit_b (id int); COMMIT AND CHAIN",
	} {
		if i == 1 {
			pgtest.Exec(t, c, "ROLLBACK")
			pgtest.Exec(t, c, "BEGIN")
		}
		before := calls.Load()
		pgtest.Exec(t, c, text)
		pgtest.Exec(t, c, "SELECT 1")
		if calls.Load() == before {
			t.Fatalf("%q: no catalog read before the next statement", text)
		}
	}
}

func closedChan() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}
