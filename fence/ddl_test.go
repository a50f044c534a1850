package fence_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// After DDL, the session's next statement waits for the catalog read the
// DDL hook starts (here: until the test says it is done), while other
// sessions go on; after the COMMIT of a block with DDL, so does the next
// statement after it.
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
	held("the statement after ALTER TABLE in a block", exec("INSERT INTO ddl_hold VALUES (1, 'a')"))
	pgtest.Exec(t, c, "COMMIT")
	held("the statement after the COMMIT", exec("SELECT 3"))
	pgtest.Exec(t, c, "SELECT 4")
	if n := calls.Load(); n != 3 {
		t.Fatalf("catalog reads asked for: %d, want 3", n)
	}
	// A statement that spells no DDL keyword as a word holds nothing.
	pgtest.Exec(t, c, "SELECT 'x' AS created_at, 1 AS alterations, 2 AS importer")
	pgtest.Exec(t, c, "SELECT 5")
	if n := calls.Load(); n != 3 {
		t.Fatalf("catalog reads asked for after plain statements: %d, want 3", n)
	}
}
