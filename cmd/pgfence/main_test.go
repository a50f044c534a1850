package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		`fencing_reject_total{table="pgfence_demo_ledger"} 1`,
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
	opts := serveOptions{listen: "127.0.0.1:0", metricsListen: "127.0.0.1:0", tokenSetting: "fence.token", guards: []string{"accounts"}}

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
