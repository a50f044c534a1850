package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/poll"
)

// The demo is the product's first impression: it must show the stale write
// fenced through pgfence and landing without it.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runDemo(ctx, &out, "", 300*time.Millisecond); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	through, direct, ok := strings.Cut(s, "== Run 2")
	if !ok {
		t.Fatalf("no second run:\n%s", s)
	}
	for _, want := range []string{
		"writer B: UPDATE pgfence_demo_ledger SET owner = 'B' WHERE id = 1  ->  UPDATE 1",
		"writer A: UPDATE pgfence_demo_ledger SET owner = 'A' WHERE id = 1  ->  UPDATE 0",
		"final row: id=1 owner=B fence_epoch=2",
		`fencing_reject_total{database="postgres",kind="row",mode="enforce",table="pgfence_demo_ledger",via="rewrite"} 1`,
	} {
		if !strings.Contains(through, want) {
			t.Errorf("run through pgfence lacks %q:\n%s", want, through)
		}
	}
	for _, want := range []string{
		"owner = 'A' WHERE id = 1  ->  UPDATE 1",
		"final row: id=1 owner=A",
		"LOST UPDATE",
	} {
		if !strings.Contains(direct, want) {
			t.Errorf("run straight to Postgres lacks %q:\n%s", want, direct)
		}
	}
}

func TestConfigFileAndFlags(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "pgfence.yaml")
	os.WriteFile(path, []byte("upstream: postgres://u@db:5432/app\nguard:\n  - accounts\n  - billing.invoices:epoch\nlisten: 0.0.0.0:7000\n"), 0o600)
	cmd := serveCmd()
	cmd.Flags().Parse([]string{"--config", path, "--listen", "127.0.0.1:6000"})
	if err := loadConfigFile(cmd, path); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	if get("listen") != "127.0.0.1:6000" {
		t.Errorf("flag must win over file: listen=%s", get("listen"))
	}
	if get("upstream") != "postgres://u@db:5432/app" || get("guard") != "[accounts,billing.invoices:epoch]" {
		t.Errorf("file keys not applied: upstream=%s guard=%s", get("upstream"), get("guard"))
	}
	os.WriteFile(path, []byte("upstrem: x\n"), 0o600)
	if err := loadConfigFile(serveCmd(), path); err == nil || !strings.Contains(err.Error(), `unknown key "upstrem"`) {
		t.Errorf("misspelt key: %v", err)
	}
}

func TestHealthz(t *testing.T) {
	get := func(inst *instance, path string) (int, string) {
		resp, err := http.Get("http://" + inst.MetricsAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	opts := serveOptions{listen: "127.0.0.1:0", metricsListen: "127.0.0.1:0",
		policyOptions: policyOptions{tokenSetting: "fence.token", guards: []string{"accounts"}}}

	// Postgres unreachable: the proxy still starts and says so.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	opts.upstream = "postgres://u@" + dead + "/db"
	inst, err := start(opts, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(inst, "/healthz"); code != 200 || !strings.Contains(body, "unreachable") {
		t.Errorf("healthz, unreachable upstream: %d %q (the proxy is alive and must say Postgres is not)", code, body)
	}
	if code, body := get(inst, "/readyz"); code != 503 || !strings.Contains(body, "unreachable") {
		t.Errorf("readyz, unreachable upstream: %d %q", code, body)
	}
	inst.Close()

	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	opts.upstream = pg.URL("postgres")
	inst, err = start(opts, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	if code, body := get(inst, "/healthz"); code != 200 || !strings.Contains(body, " reachable") {
		t.Errorf("healthz, reachable upstream: %d %q", code, body)
	}
	if code, body := get(inst, "/readyz"); code != 200 || !strings.HasPrefix(body, "ready") {
		t.Errorf("readyz, reachable upstream: %d %q", code, body)
	}
}

func TestRewriteCommand(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"rewrite"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	// A simple-protocol write: the statement its literals are bound to
	// (the guard from the environment, as serve takes it).
	t.Setenv("PGFENCE_GUARD", "accounts")
	out, err := run("UPDATE accounts SET balance = 0, note = 'it''s' WHERE id = 1 -- keep me")
	os.Unsetenv("PGFENCE_GUARD")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-- UPDATE accounts (enforce)", "prepares the statement below once per session",
		"$1 = 0 (int4), $2 = 'it''s' (untyped), $3 = 1 (int4)", `"fence_epoch" = pg_catalog.current_setting(`,
		"balance = $1, note = $2 WHERE (id = $3) AND", "pgfence.stale", "-- keep me", "after each Execute, pgfence runs its probe"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The same rewritten as sent.
	out, err = run("--guard", "accounts", "--as-text", "UPDATE accounts SET balance = 0, note = 'it''s' WHERE id = 1 -- keep me")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-- UPDATE accounts (enforce)", "balance = 0, note = 'it''s' WHERE (id = 1) AND", "-- keep me", "statement 2 is pgfence's probe"} {
		if !strings.Contains(out, want) || strings.Contains(out, "binds") {
			t.Errorf("--as-text output lacks %q:\n%s", want, out)
		}
	}
	out, err = run("--guard", "accounts", "UPDATE accounts SET fence_epoch = 1")
	if !errors.Is(err, errRefused) || !strings.Contains(out, "ERROR:  pgfence: column \"fence_epoch\"") || !strings.Contains(out, "SQLSTATE: 42501") {
		t.Errorf("forged epoch: %v\n%s", err, out)
	}
	out, err = run("--guard", "accounts", "SELECT * FROM accounts")
	if err != nil || !strings.Contains(out, "unchanged") {
		t.Errorf("read: %v\n%s", err, out)
	}
	out, err = run("--guard", "accounts", "--mode", "shadow", "--prepared", "DELETE FROM accounts WHERE id = $1")
	if err != nil || !strings.Contains(out, "(shadow)") || !strings.Contains(out, "after each Execute") {
		t.Errorf("shadow prepared: %v\n%s", err, out)
	}
	if _, err := run("--guard", "accounts", "--mode", "loud", "SELECT 1"); err == nil || !strings.Contains(err.Error(), "want enforce, shadow or observe") {
		t.Errorf("bad mode: %v", err)
	}
}

// SIGHUP reloads the guard configuration without dropping a connection,
// and discovery picks up a table created after start.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	admin, err := pgx.Connect(context.Background(), pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(context.Background(), "CREATE TABLE hup_t (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 100); INSERT INTO hup_t VALUES (1, 'a')"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "pgfence.yaml")
	os.WriteFile(cfgPath, []byte("discover: false\n"), 0o600)
	addr, _ := runServe(t, "--upstream", pg.URL("postgres"), "--config", cfgPath, "--discover-interval", "0")
	c := connect(t, addr)
	defer c.Close(context.Background())
	c.Exec(context.Background(), "SET fence.token = '1'")
	if tag, err := c.Exec(context.Background(), "UPDATE hup_t SET v = 'unguarded' WHERE id = 1"); err != nil || tag.String() != "UPDATE 1" {
		t.Fatalf("before reload (not guarded): %v %v", tag, err)
	}
	os.WriteFile(cfgPath, []byte("discover: true\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	poll.Eventually(t, 10*time.Second, "the reload on SIGHUP", func() bool {
		tag, err := c.Exec(context.Background(), "UPDATE hup_t SET v = 'unguarded' WHERE id = 1")
		if err != nil {
			t.Fatalf("the open connection broke across the reload: %v", err)
		}
		return tag.String() == "UPDATE 0" // discovered and fenced: token 1 < epoch 100
	})
}

// runServe runs 'pgfence serve' in this process on a port of its own
// choosing (--listen 127.0.0.1:0), and returns its address once it
// listens; the returned channel yields its result. It is stopped when the
// test ends.
func runServe(t *testing.T, args ...string) (string, chan error) {
	t.Helper()
	inst, done := startServe(t, args...)
	if inst == nil {
		return "", done
	}
	return inst.Addr(), done
}

// startServe is runServe returning the instance, nil if serve ended
// before it listened (its result is then in the channel).
func startServe(t *testing.T, args ...string) (*instance, chan error) {
	t.Helper()
	started := make(chan *instance, 1)
	serving = func(inst *instance) { started <- inst }
	t.Cleanup(func() { serving = nil })
	ctx, cancel := context.WithCancel(context.Background())
	cmd := rootCmd()
	cmd.SetArgs(append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--log-level", "error"}, args...))
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- cmd.ExecuteContext(ctx); close(finished) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop when its context ended")
		}
	})
	select {
	case inst := <-started:
		return inst, done
	case err := <-done: // it never served: hand its result on
		done <- err
		return nil, done
	case <-time.After(2 * time.Minute):
		t.Fatal("serve neither listened nor ended in 2 minutes")
		return nil, done
	}
}

// connect opens a session through the pgfence at addr, which runServe
// has seen listening.
func connect(t *testing.T, addr string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// SIGTERM drains: no new clients, idle sessions end, an open transaction
// may finish; a second signal closes everything at once.
func TestServeSIGTERM(t *testing.T) {
	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	bg := context.Background()

	addr, done := runServe(t, "--upstream", pg.URL("postgres"), "--drain-timeout", "20s")
	idle := connect(t, addr)
	busy := connect(t, addr)
	if _, err := busy.Exec(bg, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	draining(t, addr)
	if _, err := idle.Exec(bg, "SELECT 1"); err == nil {
		t.Error("an idle session survived SIGTERM")
	}
	if _, err := busy.Exec(bg, "SELECT 1"); err != nil {
		t.Fatalf("the open transaction was cut during the drain: %v", err)
	}
	if _, err := busy.Exec(bg, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after the last transaction ended")
	}

	// A second signal during a drain closes everything at once.
	addr, done = runServe(t, "--upstream", pg.URL("postgres"), "--drain-timeout", "60s")
	busy = connect(t, addr)
	busy.Exec(bg, "BEGIN")
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	draining(t, addr)
	start := time.Now()
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a second signal did not stop serve")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("second signal took %v", d)
	}
}

// draining waits until serve at addr takes no new clients: SIGTERM has
// reached it.
func draining(t *testing.T, addr string) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, "serve refusing new clients after SIGTERM", func() bool {
		c, err := pgx.Connect(context.Background(), "postgres://postgres@"+addr+"/postgres?sslmode=disable")
		if err == nil {
			c.Close(context.Background())
		}
		return err != nil
	})
}

// A log destination that stops taking lines (a pipe nobody reads) must not
// stop the proxy: before the logWriter, the first stale write fenced after
// stderr filled blocked the relay in write(2), and every session with it.
// Here nothing is ever read from the log, every write is stale (one WARN
// line each), and the writes, and a second session, must go on.
func TestStalledLogDoesNotStopRelay(t *testing.T) {
	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, "CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO accounts VALUES (1, 'v', 10)"); err != nil {
		t.Fatal(err)
	}
	unread, stalled := io.Pipe() // read by nobody
	lw := newLogWriter(stalled, nil)
	defer lw.Close()
	log, err := newLogger(lw, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	opts := serveOptions{listen: "127.0.0.1:0", metricsListen: "", upstream: pg.URL("postgres"),
		policyOptions: policyOptions{tokenSetting: "fence.token", guards: []string{"accounts"}}}
	inst, err := start(opts, log)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	url := "postgres://postgres@" + inst.Addr() + "/postgres?sslmode=disable"
	stale, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close(ctx)
	if _, err := stale.Exec(ctx, "SET fence.token = '5'"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { // a relay that stopped would leave it stuck: a watchdog fails the test
		for i := range 500 {
			tag, err := stale.Exec(ctx, "UPDATE accounts SET val = 'stale' WHERE id = 1")
			if err != nil || tag.String() != "UPDATE 0" {
				done <- fmt.Errorf("stale write %d: %v %v", i, tag, err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		unread.Close() // so that the proxy can close
		t.Fatal("500 stale writes did not finish in 30 s: the relay stopped while the log took nothing")
	}
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("a new session while the log takes nothing: %v", err)
	}
	defer other.Close(ctx)
	var one int
	if err := other.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 in another session: %v %v", one, err)
	}
}
