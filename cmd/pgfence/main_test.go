package main

import (
	"bytes"
	"context"
	"errors"
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
		`fencing_reject_total{mode="enforce",table="pgfence_demo_ledger"} 1`,
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
	get := func(inst *instance) (int, string) {
		resp, err := http.Get("http://" + inst.MetricsAddr() + "/healthz")
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
	if code, body := get(inst); code != 503 || !strings.Contains(body, "unreachable") {
		t.Errorf("unreachable upstream: %d %q", code, body)
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
	if code, body := get(inst); code != 200 || !strings.HasPrefix(body, "ok") {
		t.Errorf("reachable upstream: %d %q", code, body)
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
	out, err := run("--guard", "accounts", "UPDATE accounts SET balance = 0 WHERE id = 1 -- keep me")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-- UPDATE accounts (enforce)", `"fence_epoch" = (SELECT`, "WHERE (id = 1) AND", "pgfence.stale", "-- keep me", "statement 2 is pgfence's probe"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
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
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "pgfence.yaml")
	os.WriteFile(cfgPath, []byte("discover: false\n"), 0o600)

	ctx, cancel := context.WithCancel(context.Background())
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve", "--upstream", pg.URL("postgres"), "--listen", addr, "--metrics-listen", "", "--config", cfgPath, "--discover-interval", "0", "--log-level", "error"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() { cancel(); <-done }()

	var c *pgx.Conn
	for i := 0; ; i++ {
		if c, err = pgx.Connect(context.Background(), "postgres://postgres@"+addr+"/postgres?sslmode=disable"); err == nil {
			break
		}
		if i > 100 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Close(context.Background())
	c.Exec(context.Background(), "SET fence.token = '1'")
	if tag, err := c.Exec(context.Background(), "UPDATE hup_t SET v = 'unguarded' WHERE id = 1"); err != nil || tag.String() != "UPDATE 1" {
		t.Fatalf("before reload (not guarded): %v %v", tag, err)
	}
	os.WriteFile(cfgPath, []byte("discover: true\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Simple protocol: a statement prepared before the reload keeps the
		// rewrite it was prepared with (see README, limits).
		tag, err := c.Exec(context.Background(), "UPDATE hup_t SET v = 'stale' WHERE id = 1", pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatalf("the open connection broke across the reload: %v", err)
		}
		if tag.String() == "UPDATE 0" {
			break // discovered and fenced: token 1 < epoch 100
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reload the configuration")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
