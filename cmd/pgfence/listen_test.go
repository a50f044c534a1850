package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// With --unix-socket-dir, clients reach pgfence on a Unix socket named as
// Postgres names its own, and their writes are fenced there as over TCP;
// the socket is gone once pgfence stops.
func TestServeUnixSocket(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE sock_accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	s.exec("INSERT INTO sock_accounts VALUES (1, 'a', 5)")
	dir := t.TempDir()
	inst := s.serve(serveOptions{unixSocketDir: dir, discover: true, backstop: "off"})
	_, port, _ := net.SplitHostPort(inst.Addr())
	c, err := pgx.Connect(context.Background(), fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres", dir, port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	tag(t, c, "SET fence.token = '3'")
	if got := tag(t, c, "UPDATE sock_accounts SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("a stale write over the Unix socket: %s", got)
	}
	tag(t, c, "SET fence.token = '6'")
	if got := tag(t, c, "UPDATE sock_accounts SET val = 'fresh' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("a fresh write over the Unix socket: %s", got)
	}
	path := filepath.Join(dir, ".s.PGSQL."+port)
	// A second pgfence cannot take a socket a live one serves.
	if _, err := listenUnix(dir, inst.ln.Addr()); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Fatalf("a second listener on a live socket: %v", err)
	}
	c.Close(context.Background())
	inst.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the socket is still there after Close: %v", err)
	}
}

// --listen takes a Unix socket's path too: clients reach it there alone.
func TestServeListenSocketPath(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE sockpath_accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	s.exec("INSERT INTO sockpath_accounts VALUES (1, 'a', 5)")
	dir := t.TempDir()
	o := serveOptions{discover: true, backstop: "off", upstream: s.pg.URL("postgres"), discoverColumn: "fence_epoch", policyOptions: policyOptions{tokenSetting: "fence.token"}}
	o.listen, o.metricsListen = filepath.Join(dir, ".s.PGSQL.6544"), "127.0.0.1:0"
	inst, err := start(o, slogDiscard())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	c, err := pgx.Connect(context.Background(), fmt.Sprintf("host=%s port=6544 user=postgres dbname=postgres", dir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	tag(t, c, "SET fence.token = '3'")
	if got := tag(t, c, "UPDATE sockpath_accounts SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("a stale write over --listen's socket: %s", got)
	}
	// With --unix-socket-dir as well there is no TCP port to name a socket by.
	o.listen, o.unixSocketDir = filepath.Join(dir, ".s.PGSQL.6545"), dir
	if _, err := start(o, slogDiscard()); err == nil || !strings.Contains(err.Error(), "--unix-socket-dir") {
		t.Fatalf("--listen a socket and --unix-socket-dir: %v, want an error naming --unix-socket-dir", err)
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
