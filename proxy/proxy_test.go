package proxy_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/proxy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

func TestCopyBothWays(t *testing.T) {
	p := pgtest.StartRelay(t)
	c := p.Connect(t)
	pgtest.Exec(t, c, "DROP TABLE IF EXISTS copy_t; CREATE TABLE copy_t (id int, s text)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_t") })

	n, err := c.CopyFrom(ctx, pgx.Identifier{"copy_t"}, []string{"id", "s"}, pgx.CopyFromRows([][]any{{1, "one"}, {2, "two"}, {3, "three"}}))
	if err != nil || n != 3 {
		t.Fatalf("COPY FROM (binary, pgx): %d %v", n, err)
	}
	tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader("4\tfour\n5\tfive\n"), "COPY copy_t FROM STDIN")
	if err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("COPY FROM STDIN (text): %v %v", tag, err)
	}
	var out bytes.Buffer
	tag, err = c.PgConn().CopyTo(ctx, &out, "COPY (SELECT * FROM copy_t ORDER BY id) TO STDOUT")
	if err != nil || tag.RowsAffected() != 5 {
		t.Fatalf("COPY TO: %v %v", tag, err)
	}
	if want := "1\tone\n2\ttwo\n3\tthree\n4\tfour\n5\tfive\n"; out.String() != want {
		t.Fatalf("COPY TO gave %q", out.String())
	}
	// A failed COPY leaves a working session.
	_, err = c.PgConn().CopyFrom(ctx, strings.NewReader("not-a-number\tx\n"), "COPY copy_t FROM STDIN")
	if err == nil {
		t.Fatal("bad COPY data accepted")
	}
	if tag := pgtest.Exec(t, c, "SELECT 1"); tag != "SELECT 1" {
		t.Fatal(tag)
	}
}

func TestListenNotifyAndNotices(t *testing.T) {
	p := pgtest.StartRelay(t)
	listener := p.Connect(t)
	pgtest.Exec(t, listener, "LISTEN pgfence_chan")
	sender := p.Connect(t)
	pgtest.Exec(t, sender, "SELECT pg_notify('pgfence_chan', 'hello')")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil || n.Channel != "pgfence_chan" || n.Payload != "hello" {
		t.Fatalf("notification: %+v %v", n, err)
	}

	var notices []string
	cfg, _ := pgx.ParseConfig(p.URL())
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Severity+": "+n.Message) }
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	pgtest.Exec(t, c, "DO $$ BEGIN RAISE NOTICE 'note %', 1; RAISE WARNING 'careful'; END $$")
	if strings.Join(notices, "|") != "NOTICE: note 1|WARNING: careful" {
		t.Fatalf("notices: %q", notices)
	}
}

func TestTransactionsAndErrors(t *testing.T) {
	p := pgtest.StartRelay(t)
	c := p.Connect(t)
	pgtest.Exec(t, c, "DROP TABLE IF EXISTS tx_t; CREATE TABLE tx_t (id int PRIMARY KEY)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS tx_t") })

	tx, _ := c.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO tx_t VALUES (1)")
	tx.Commit(ctx)
	tx, _ = c.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO tx_t VALUES (2)")
	tx.Rollback(ctx)
	var n int
	c.QueryRow(ctx, "SELECT count(*) FROM tx_t").Scan(&n)
	if n != 1 {
		t.Fatalf("commit/rollback: %d rows, want 1", n)
	}
	// Errors in the extended protocol, inside a pipeline, and after.
	_, err := c.Exec(ctx, "INSERT INTO tx_t VALUES ($1)", 1)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("duplicate key: %v", err)
	}
	b := &pgx.Batch{}
	b.Queue("SELECT 1")
	b.Queue("SELECT 1/0")
	b.Queue("SELECT 3")
	if err := c.SendBatch(ctx, b).Close(); err == nil {
		t.Fatal("division by zero in a batch went unnoticed")
	}
	for i := 0; i < 50; i++ { // a prepared statement reused many times
		var v int
		if err := c.QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&v); err != nil || v != i+1 {
			t.Fatalf("reuse %d: %d %v", i, v, err)
		}
	}
}

func TestCancelWithPgx(t *testing.T) {
	p := pgtest.StartRelay(t)
	c := p.Connect(t)
	result := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "SELECT pg_sleep(20)")
		result <- err
	}()
	pgtest.Running(t, c.PgConn().PID())
	start := time.Now()
	// Postgres may signal the backend a second time for the same request;
	// CancelRequest returns after that, so the next statement is safe.
	if err := c.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	err := <-result
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("want SQLSTATE 57014, got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	pgtest.Exec(t, c, "SELECT 1") // the session goes on

	// A context deadline makes pgx send the cancel itself.
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := p.Connect(t).Exec(qctx, "SELECT pg_sleep(20)"); err == nil {
		t.Fatal("pg_sleep(20) finished despite the deadline")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("context cancel took %v", d)
	}
}

func TestCancelWithPsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not installed: run scripts/ensure-postgres.sh")
	}
	p := pgtest.StartRelay(t)
	cmd := exec.Command(psql, p.URL("application_name=cancel-psql"), "-X", "-v", "ON_ERROR_STOP=1", "-c", "SELECT pg_sleep(20)")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgtest.RunningApp(t, "cancel-psql")
	start := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("psql did not end after SIGINT")
	}
	if !strings.Contains(out.String(), "canceling statement due to user request") {
		t.Fatalf("psql output: %s", out.String())
	}
	t.Logf("cancel took %v", time.Since(start))
}

// expectFatal reads until the proxy's FATAL error and the end of the stream.
func expectFatal(t *testing.T, fe *pgproto3.Frontend, code, contains string) {
	t.Helper()
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("connection ended without the FATAL %s: %v", code, err)
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			if e.Code != code || !strings.Contains(e.Message, contains) {
				t.Fatalf("got %s %q, want %s containing %q", e.Code, e.Message, code, contains)
			}
			if _, err := fe.Receive(); err == nil {
				t.Fatal("connection still open after FATAL")
			}
			return
		}
	}
}

// A malformed or oversized message ends that client's session with a clear
// error; the proxy and every other session go on.
func TestMalformedMessages(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.MaxMessageSize = 4096 })
	bystander := p.Connect(t)
	pgtest.Exec(t, bystander, "BEGIN")
	pgtest.Exec(t, bystander, "SELECT 1")

	cases := []struct {
		name, contains string
		bytes          []byte
	}{
		{"length 3", "length 3", []byte{'Q', 0, 0, 0, 3}},
		{"length 0", "length 0", []byte{'Q', 0, 0, 0, 0}},
		{"length 2^31-1", "over the 4096-byte limit", []byte{'Q', 0x7f, 0xff, 0xff, 0xff}},
		{"oversized query", "over the 4096-byte limit", append([]byte{'Q', 0, 0, 0x20, 0x04}, bytes.Repeat([]byte{'x'}, 8192)...)},
		{"query without terminator", "missing string terminator", []byte{'Q', 0, 0, 0, 8, 'a', 'b', 'c', 'd'}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, fe := pgtest.RawSession(t, p.Addr)
			conn.Write(tc.bytes)
			expectFatal(t, fe, "08P01", tc.contains)
		})
	}
	t.Run("garbage before startup", func(t *testing.T) {
		conn, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		fe := pgproto3.NewFrontend(conn, conn)
		expectFatal(t, fe, "08P01", "startup packet length")
	})
	t.Run("startup packet over its limit", func(t *testing.T) {
		conn, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		pkt := binary.BigEndian.AppendUint32(nil, 20000)
		pkt = binary.BigEndian.AppendUint32(pkt, 3<<16)
		conn.Write(append(pkt, make([]byte, 20000-8)...))
		expectFatal(t, pgproto3.NewFrontend(conn, conn), "08P01", "startup packet length 20000 is outside 8..10000")
	})
	t.Run("unsupported protocol", func(t *testing.T) {
		conn, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		pkt := binary.BigEndian.AppendUint32(nil, 8)
		pkt = binary.BigEndian.AppendUint32(pkt, 2<<16)
		conn.Write(pkt)
		expectFatal(t, pgproto3.NewFrontend(conn, conn), "08P01", "unsupported frontend protocol 2.0")
	})

	// The bystander's transaction is untouched and the proxy still serves.
	if tag := pgtest.Exec(t, bystander, "COMMIT"); tag != "COMMIT" {
		t.Fatal(tag)
	}
	pgtest.Exec(t, p.Connect(t), "SELECT 1")
}

// SSLRequest and GSSENCRequest are answered "no" until TLS is configured:
// sslmode=prefer falls back to plain text, sslmode=require is refused.
func TestEncryptionRequests(t *testing.T) {
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.TLS = nil })
	pgtest.Exec(t, pgtest.Connect(t, p.URL("sslmode=prefer")), "SELECT 1")
	// GSSENCRequest by hand (pgx does not send one): "N", then startup.
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30})
	var answer [1]byte
	if _, err := conn.Read(answer[:]); err != nil || answer[0] != 'N' {
		t.Fatalf("GSSENCRequest answered %q %v, want N", answer[0], err)
	}
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "postgres"}})
	fe.Flush()
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("startup after GSSENCRequest: %v", err)
		}
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	_, err = pgx.Connect(ctx, p.URL("sslmode=require"))
	if err == nil || !strings.Contains(err.Error(), "server refused TLS") {
		t.Fatalf("sslmode=require: %v", err)
	}
}

// Terminate and disconnects release the backend.
func TestDisconnectReleasesBackend(t *testing.T) {
	p := pgtest.StartRelay(t)
	admin := pgtest.Direct(t)
	count := func(app string) int {
		var n int
		admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
		return n
	}
	c, err := pgx.Connect(ctx, p.URL("application_name=bye-terminate"))
	if err != nil {
		t.Fatal(err)
	}
	conn, fe := pgtest.RawSession(t, p.Addr)
	fe.Send(&pgproto3.Query{String: "SET application_name = 'bye-drop'; BEGIN; SELECT 1"})
	fe.Flush()
	for {
		m, _ := fe.Receive()
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if count("bye-terminate") != 1 || count("bye-drop") != 1 {
		t.Fatal("sessions not visible in pg_stat_activity")
	}
	c.Close(ctx)
	conn.Close()
	// A backend's exit is asynchronous: wait for the state, with a bound
	// only a hang reaches.
	poll.Eventually(t, time.Minute, "the backends' release after Terminate and a disconnect", func() bool {
		return count("bye-terminate")+count("bye-drop") == 0
	})
}

// The proxy relays SCRAM authentication untouched, and never needs the
// password itself.
func TestScramThroughProxy(t *testing.T) {
	pgtest.Need(t)
	srv, err := pgserver.Start(ctx, pgserver.Options{Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	p := pgtest.StartRelay(t, func(pc *proxy.Config) { pc.Upstream = srv.Addr() })
	good := "postgres://postgres:s3cret@" + p.Addr + "/postgres?sslmode=disable"
	pgtest.Exec(t, pgtest.Connect(t, good), "SELECT 1")
	_, err = pgx.Connect(ctx, strings.Replace(good, "s3cret", "wrong", 1))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "28P01" {
		t.Fatalf("wrong password: %v, want 28P01", err)
	}
	if strings.Contains(p.Logs.String(), "s3cret") {
		t.Fatal("the password reached the log")
	}
}
