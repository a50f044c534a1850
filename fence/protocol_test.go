package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestProtocol32 connects as a client that asks for the newest protocol
// (pgx's and libpq 18's max_protocol_version=latest): Postgres 18 speaks
// 3.2 with it, through pgfence, with a 32-byte cancel key; earlier ones
// answer NegotiateProtocolVersion, which must reach the client, and speak
// 3.0. Either way fencing, prepared statements and a cancel work.
func TestProtocol32(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t, "max_protocol_version=latest", "application_name=proto32")
	wantKey := 4
	if pgtest.Version(t).Major() >= 18 {
		wantKey = 32
	}
	direct := pgtest.Direct(t)
	var pid uint32
	if err := direct.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = 'proto32'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if got := c.PgConn().PID(); got != pid {
		t.Errorf("the client holds process %d, its session is %d", got, pid)
	}
	if got := len(c.PgConn().SecretKey()); got != wantKey {
		t.Errorf("cancel key of %d bytes, want %d (Postgres %s)", got, wantKey, pgtest.Version(t))
	}

	pgtest.Exec(t, c, "SET fence.token = '7'")
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = $1 WHERE id = $2", "new", 1); tag != "UPDATE 1" {
		t.Fatalf("fresh write: %s", tag)
	}
	pgtest.Exec(t, c, "SET fence.token = '6'")
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale write: %s", tag)
	}
	if v, e := row(t, tbl, 1); v != "new" || e != 7 {
		t.Fatalf("row 1 = %q at epoch %d", v, e)
	}
	if got := p.Counter(t, "fencing_reject_total", "table="+tbl); got != 1 {
		t.Errorf("fencing_reject_total = %v, want 1", got)
	}

	// A cancel request carries the key as the client got it.
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "SELECT pg_sleep(30)")
		done <- err
	}()
	pgtest.Sleeping(t, pid)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.PgConn().CancelRequest(cctx); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if err := <-done; !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("cancelled pg_sleep: %v, want 57014", err)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeCacheStatement).Scan(&one); err != nil || one != 1 {
		t.Fatalf("after the cancel: %d, %v", one, err)
	}
}

// A logical replication connection (replication=database) takes only the
// simple protocol: through pgfence its fenced writes are rewritten in the
// text, not bound, and its SETs go to Postgres as sent (the relay cannot
// set them ahead of its next statement there). A stale write changes
// nothing, a fresh one lands with its token. (proxy's
// TestReplicationConnections checks the relay: replication commands and
// WAL streaming.)
func TestReplicationConnectionFenced(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	run := p.Logical(t, ctx)
	run("SET fence.token = '3'")
	if r := run("UPDATE " + tbl + " SET val = 'stale' WHERE id = 1"); r.CommandTag.String() != "UPDATE 0" {
		t.Fatalf("a stale write on a replication connection: %s", r.CommandTag)
	}
	run("SET fence.token = '7'")
	if r := run("UPDATE " + tbl + " SET val = 'fresh' WHERE id = 1"); r.CommandTag.String() != "UPDATE 1" {
		t.Fatalf("a fresh write on a replication connection: %s", r.CommandTag)
	}
	if val, epoch := row(t, tbl, 1); val != "fresh" || epoch != 7 {
		t.Fatalf("row after the writes: %q at %d, want fresh at 7", val, epoch)
	}
}
