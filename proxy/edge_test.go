package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
)

// A client that writes a very large pipelined batch before it reads any
// reply (pgconn reads what arrives meanwhile into memory, as Postgres's
// own clients do) gets every reply: pgfence never stops reading one side
// while the other waits on it. Three at once, so that the loop is busy
// with others while each side's socket fills and drains.
func TestHugePipeline(t *testing.T) {
	p := pgtest.StartRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const sessions, n = 3, 100000
	errs := make(chan error, sessions)
	for range sessions {
		c := p.Connect(t)
		go func() { errs <- hugePipeline(ctx, c.PgConn(), n) }()
	}
	for range sessions {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func hugePipeline(ctx context.Context, c *pgconn.PgConn, n int) error {
	pl := c.StartPipeline(ctx)
	for i := range n {
		pl.SendQueryParams("select $1::text", [][]byte{[]byte(fmt.Sprint(i))}, nil, nil, nil)
	}
	if err := pl.Sync(); err != nil {
		return err
	}
	for i := range n {
		res, err := pl.GetResults()
		if err != nil {
			return fmt.Errorf("result %d: %w", i, err)
		}
		rr, ok := res.(*pgconn.ResultReader)
		if !ok {
			return fmt.Errorf("result %d: %T", i, res)
		}
		if r := rr.Read(); r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != fmt.Sprint(i) {
			return fmt.Errorf("result %d: %v %v", i, r.Rows, r.Err)
		}
	}
	if res, err := pl.GetResults(); err != nil {
		return err
	} else if _, ok := res.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("after the results: %T, want the Sync", res)
	}
	return pl.Close()
}

// A NoticeResponse in the middle of COPY FROM STDIN reaches the client,
// and the COPY completes: 1,000 rows of 10 KB, a NOTICE for each, three
// sessions at once.
func TestNoticeInsideCopyIn(t *testing.T) {
	p := pgtest.StartRelay(t)
	pgtest.Exec(t, pgtest.Direct(t), `DROP TABLE IF EXISTS copy_notice; CREATE TABLE copy_notice (id int, s text);
		CREATE OR REPLACE FUNCTION copy_noisy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'row %', NEW.id; RETURN NEW; END $$;
		CREATE TRIGGER noisy BEFORE INSERT ON copy_notice FOR EACH ROW EXECUTE FUNCTION copy_noisy()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_notice; DROP FUNCTION IF EXISTS copy_noisy()")
	})
	var b strings.Builder
	big := strings.Repeat("x", 10000)
	for i := range 1000 {
		fmt.Fprintf(&b, "%d\t%s\n", i, big)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const sessions = 3
	errs := make(chan error, sessions)
	for range sessions {
		cfg, err := pgconn.ParseConfig(p.URL())
		if err != nil {
			t.Fatal(err)
		}
		var notices atomic.Int64
		cfg.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) { notices.Add(1) }
		c, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			c.Close(cctx)
		})
		go func() {
			tag, err := c.CopyFrom(ctx, strings.NewReader(b.String()), "COPY copy_notice FROM STDIN")
			if err == nil && (tag.RowsAffected() != 1000 || notices.Load() != 1000) {
				err = fmt.Errorf("%s, %d notices", tag, notices.Load())
			}
			errs <- err
		}()
	}
	for range sessions {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("COPY FROM with a NOTICE per row: %v", err)
			}
		case <-time.After(70 * time.Second):
			t.Fatal("COPY FROM with a NOTICE per row hung")
		}
	}
}

// Replication connections take only the simple protocol: through the
// relay a logical one (replication=database) runs replication commands and
// SQL, with its SETs sent as they are; a physical one streams WAL
// (CopyBoth) both ways. (fence's TestReplicationConnectionFenced checks
// fenced writes on a logical one.)
func TestReplicationConnections(t *testing.T) {
	p := pgtest.StartRelay(t)
	db := pgtest.Direct(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	run := p.Logical(t, ctx)
	if r := run("IDENTIFY_SYSTEM"); len(r.Rows) != 1 {
		t.Fatalf("IDENTIFY_SYSTEM: %d rows", len(r.Rows))
	}
	run("SET fence.token = '7'")
	if r := run("SELECT current_setting('fence.token')"); len(r.Rows) != 1 || string(r.Rows[0][0]) != "7" {
		t.Fatalf("a SET on a replication connection: the setting reads %q", r.Rows)
	}

	physical, err := pgconn.Connect(ctx, p.URL("replication=true"))
	if err != nil {
		t.Fatal(err)
	}
	defer physical.Close(ctx)
	res, err := physical.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	lsn := string(res[0].Rows[0][2])
	fe := physical.Frontend()
	fe.Send(&pgproto3.Query{String: "START_REPLICATION " + lsn})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for !got["CopyBothResponse"] || !got["CopyData"] {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("streaming WAL: %v (got %v)", err, got)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			got["CopyBothResponse"] = true
		case *pgproto3.CopyData:
			got["CopyData"] = true
		case *pgproto3.ErrorResponse:
			t.Fatalf("START_REPLICATION: %s %s", m.Code, m.Message)
		}
		if got["CopyBothResponse"] && !got["CopyData"] {
			pgtest.Exec(t, db, "SELECT pg_switch_wal()") // something to stream
		}
	}
	fe.Send(&pgproto3.CopyDone{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("ending the stream: %v", err)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
}

// A client that reads a large result slowly holds back its own backend,
// not pgfence: the result arrives whole, and another session is served
// meanwhile (TestSlowReader checks pgfence's memory).
func TestSlowReaderOthersServed(t *testing.T) {
	p := pgtest.StartRelay(t)
	slow, other := p.Connect(t), p.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rr := slow.PgConn().ExecParams(ctx, "SELECT g, repeat('x', 1000) FROM generate_series(1, 20000) g", nil, nil, nil, nil)
	rows := 0
	for rr.NextRow() {
		rows++
		if rows%2000 == 0 {
			time.Sleep(50 * time.Millisecond)
			start := time.Now()
			if tag := pgtest.Exec(t, other, "SELECT 1"); tag != "SELECT 1" {
				t.Fatal(tag)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("another session waited %v behind a slow reader", d)
			}
		}
	}
	if _, err := rr.Close(); err != nil || rows != 20000 {
		t.Fatalf("slow read: %d rows, %v", rows, err)
	}
}

// A cancel in the middle of a pipeline stops the statement running; the
// rest of the batch is skipped as Postgres skips it, and the session goes
// on.
func TestCancelInsidePipeline(t *testing.T) {
	p := pgtest.StartRelay(t)
	c := p.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pl := c.PgConn().StartPipeline(ctx)
	for range 1000 {
		pl.SendQueryParams("select 1", nil, nil, nil, nil)
	}
	pl.SendQueryParams("select pg_sleep(20)", nil, nil, nil, nil)
	for range 1000 {
		pl.SendQueryParams("select 2", nil, nil, nil, nil)
	}
	if err := pl.Sync(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// The cancel goes once pg_sleep runs: sent before Postgres read the
	// batch, it would find the backend idle and be lost. (Postgres holds
	// the 1000 results before it in the sockets' buffers meanwhile.)
	runningQuery(t, "select pg_sleep(20)")
	if err := c.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	var canceled bool
	for {
		res, err := pl.GetResults()
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "57014" {
				canceled = true
				continue
			}
			t.Fatal(err)
		}
		if rr, ok := res.(*pgconn.ResultReader); ok {
			if _, err := rr.Close(); err != nil {
				var pe *pgconn.PgError
				if errors.As(err, &pe) && pe.Code == "57014" {
					canceled = true
					continue
				}
				t.Fatal(err)
			}
			continue
		}
		if _, ok := res.(*pgconn.PipelineSync); ok {
			break
		}
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if !canceled || time.Since(start) > 15*time.Second {
		t.Fatalf("cancel in a pipeline: canceled %v after %v", canceled, time.Since(start))
	}
	if tag := pgtest.Exec(t, c, "SELECT 1"); tag != "SELECT 1" {
		t.Fatal(tag)
	}
}

// A client that goes away in the middle of COPY FROM STDIN, or in the
// middle of writing a large pipeline it never reads, ends its own session
// only: its backend is released and pgfence serves the next.
func TestTerminateMidStream(t *testing.T) {
	p := pgtest.StartRelay(t)
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS copy_gone; CREATE TABLE copy_gone (id int, s text)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_gone") })
	backends := func() int {
		var n int
		if err := db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'midstream'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, how := range []string{"copy, Terminate", "copy, close", "pipeline, Terminate", "pipeline, close"} {
		conn, fe := pgtest.RawSession(t, p.Addr)
		fe.Send(&pgproto3.Query{String: "SET application_name = 'midstream'"})
		fe.Flush()
		pgtest.Replies(t, fe, 1)
		if strings.HasPrefix(how, "copy") {
			fe.Send(&pgproto3.Query{String: "COPY copy_gone FROM STDIN"})
			for i := range 1000 {
				fe.Send(&pgproto3.CopyData{Data: []byte(fmt.Sprintf("%d\t%s\n", i, strings.Repeat("y", 1000)))})
			}
		} else {
			for range 20000 {
				fe.Send(&pgproto3.Parse{Query: "select 1"})
				fe.Send(&pgproto3.Bind{})
				fe.Send(&pgproto3.Execute{})
			}
			fe.Send(&pgproto3.Sync{})
		}
		if strings.HasSuffix(how, "Terminate") {
			fe.Send(&pgproto3.Terminate{})
		}
		fe.Flush()
		conn.Close()
		deadline := time.Now().Add(10 * time.Second)
		for backends() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the backend is still there 10 s after the client left", how)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if tag := pgtest.Exec(t, p.Connect(t), "SELECT 1"); tag != "SELECT 1" {
			t.Fatalf("%s: the next session: %s", how, tag)
		}
	}
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM copy_gone").Scan(&n); err != nil || n != 0 {
		t.Fatalf("an abandoned COPY left %d rows (%v)", n, err)
	}
}

// Asynchronous server messages inside a long pipeline: ParameterStatus
// from a SET of a reported setting in its middle, and NotificationResponse
// from another session between its Syncs, all reach the client in order
// with every reply.
func TestAsyncMessagesInsidePipeline(t *testing.T) {
	p := pgtest.StartRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	var notes atomic.Int64
	cfg.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { notes.Add(1) }
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN pipeline_events").ReadAll(); err != nil {
		t.Fatal(err)
	}
	other := p.Connect(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			pgtest.Exec(t, other, "NOTIFY pipeline_events")
		}
	}()
	const batches, per = 50, 1000
	pl := c.StartPipeline(ctx)
	for b := range batches {
		for i := range per {
			if i == per/2 {
				pl.SendQueryParams(fmt.Sprintf("SET application_name = 'batch%d'", b), nil, nil, nil, nil)
			}
			pl.SendQueryParams("select $1::int", [][]byte{[]byte(fmt.Sprint(i))}, nil, nil, nil)
		}
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	for b := range batches {
		for i := range per + 1 {
			res, err := pl.GetResults()
			if err != nil {
				t.Fatalf("batch %d, result %d: %v", b, i, err)
			}
			if r := res.(*pgconn.ResultReader).Read(); r.Err != nil {
				t.Fatalf("batch %d, result %d: %v", b, i, r.Err)
			}
		}
		if res, err := pl.GetResults(); err != nil {
			t.Fatal(err)
		} else if _, ok := res.(*pgconn.PipelineSync); !ok {
			t.Fatalf("batch %d: %T, want its Sync", b, res)
		}
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-done
	if got := c.ParameterStatus("application_name"); got != fmt.Sprintf("batch%d", batches-1) {
		t.Fatalf("application_name reported as %q", got)
	}
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if notes.Load() == 0 {
		t.Fatal("no notification arrived")
	}
}

// A cancel in the middle of COPY FROM STDIN stops it (57014) and the
// session goes on.
func TestCancelInsideCopyIn(t *testing.T) {
	p := pgtest.StartRelay(t)
	pgtest.Exec(t, pgtest.Direct(t), `DROP TABLE IF EXISTS copy_slow; CREATE TABLE copy_slow (id int);
		CREATE OR REPLACE FUNCTION copy_slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
		CREATE TRIGGER slow BEFORE INSERT ON copy_slow FOR EACH ROW EXECUTE FUNCTION copy_slow_row()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_slow; DROP FUNCTION IF EXISTS copy_slow_row()")
	})
	c := p.Connect(t)
	var b strings.Builder
	for i := range 5000 { // 50 s of rows at 10 ms each
		fmt.Fprintf(&b, "%d\n", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	copied := make(chan error, 1)
	go func() {
		_, err := c.PgConn().CopyFrom(ctx, strings.NewReader(b.String()), "COPY copy_slow FROM STDIN")
		copied <- err
	}()
	// The cancel goes once the COPY runs (sent before, it would be lost).
	runningQuery(t, "COPY copy_slow FROM STDIN")
	if err := c.PgConn().CancelRequest(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := <-copied
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" || time.Since(start) > 20*time.Second {
		t.Fatalf("a cancel inside COPY FROM: %v after %v, want 57014 at once", err, time.Since(start))
	}
	if tag := pgtest.Exec(t, c, "SELECT 1"); tag != "SELECT 1" {
		t.Fatal(tag)
	}
}

// ParameterStatus and NotificationResponse caused inside COPY FROM STDIN
// (a trigger that changes a reported setting and notifies for every row)
// come when Postgres sends them, at the end of the COPY's command and
// transaction: the COPY completes, and all of them reach the client.
func TestAsyncMessagesAfterCopyIn(t *testing.T) {
	p := pgtest.StartRelay(t)
	pgtest.Exec(t, pgtest.Direct(t), `DROP TABLE IF EXISTS copy_async; CREATE TABLE copy_async (id int);
		CREATE OR REPLACE FUNCTION copy_async_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			PERFORM set_config('application_name', 'row' || NEW.id, false);
			PERFORM pg_notify('copy_events', NEW.id::text);
			RETURN NEW; END $$;
		CREATE TRIGGER async BEFORE INSERT ON copy_async FOR EACH ROW EXECUTE FUNCTION copy_async_row()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_async; DROP FUNCTION IF EXISTS copy_async_row()")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	var notes atomic.Int64
	cfg.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { notes.Add(1) }
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN copy_events").ReadAll(); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "%d\n", i)
	}
	tag, err := c.CopyFrom(ctx, strings.NewReader(b.String()), "COPY copy_async FROM STDIN")
	if err != nil || tag.RowsAffected() != 1000 {
		t.Fatalf("COPY FROM: %v %v", tag, err)
	}
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if got := c.ParameterStatus("application_name"); got != "row999" {
		t.Fatalf("application_name reported as %q, want row999", got)
	}
	if n := notes.Load(); n != 1000 {
		t.Fatalf("%d notifications, want 1000", n)
	}
}

// A SET of the token whose Execute, or Describe, is of another portal
// than its Bind's is not one statement's unit, which the proxy may answer
// itself: it is forwarded, and the client gets Postgres's error for the
// missing portal, as without pgfence.
func TestSetUnitOfAnotherPortalForwarded(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	_, fe := pgtest.RawSession(t, p.Addr)
	for _, describe := range []bool{false, true} {
		fe.Send(&pgproto3.Parse{Query: "SET fence.token = '5'"})
		fe.Send(&pgproto3.Bind{})
		portal := "x"
		if describe {
			fe.Send(&pgproto3.Describe{ObjectType: 'P', Name: "x"})
			portal = ""
		}
		fe.Send(&pgproto3.Execute{Portal: portal})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		tags, errs := pgtest.Replies(t, fe, 1)
		if len(tags) != 0 || len(errs) != 1 || errs[0].Code != "34000" {
			t.Errorf("describe %v: got tags %q, errors %v; want only Postgres's 34000 (portal \"x\" does not exist)", describe, tags, errs)
		}
	}
}

// runningQuery waits until Postgres runs query, as pg_stat_activity shows
// it, in some session.
func runningQuery(t *testing.T, query string) {
	t.Helper()
	db := pgtest.Direct(t)
	poll.Eventually(t, 30*time.Second, fmt.Sprintf("Postgres running %q", query), func() bool {
		var n int
		err := db.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = $1", query).Scan(&n)
		return err == nil && n > 0
	})
}
