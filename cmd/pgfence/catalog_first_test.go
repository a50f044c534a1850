package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/poll"
)

// Until pgfence has read the catalog it cannot tell which tables to fence
// (those only discovery finds, partitions): it refuses clients and is not
// ready, and reads again every second, serving as soon as a read works.
func TestServeRefusesUntilCatalogRead(t *testing.T) {
	bg := context.Background()
	pg, err := pgserver.Start(bg, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	db, err := pgx.Connect(bg, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(bg)
	if _, err := db.Exec(bg, "CREATE TABLE first_t (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 50); INSERT INTO first_t VALUES (1, 'a')"); err != nil {
		t.Fatal(err)
	}

	// Postgres "down" until up is set: a relay that hangs up at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var up atomic.Bool
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !up.Load() {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", pg.Addr())
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()

	inst, err := start(serveOptions{listen: "127.0.0.1:0", metricsListen: "127.0.0.1:0", discoverInterval: time.Minute,
		upstream:      "postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable",
		policyOptions: policyOptions{tokenSetting: "fence.token"}, discover: true, discoverColumn: "fence_epoch", backstop: "off"},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	url := "postgres://postgres@" + inst.Addr() + "/postgres?sslmode=disable"
	if code, body := readyz(t, inst); code != 503 || !strings.Contains(body, "never read") {
		t.Fatalf("readyz before any catalog read: %d %q, want 503 saying the catalog was never read", code, body)
	}
	_, err = pgx.Connect(bg, url)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08004" || !strings.Contains(pe.Message, "catalog") {
		t.Fatalf("a client before any catalog read: %v; want FATAL 08004 saying the catalog is not read yet", err)
	}

	up.Store(true)
	poll.Eventually(t, 10*time.Second, "readiness once Postgres answers", func() bool { code, _ := readyz(t, inst); return code == 200 })
	c, err := pgx.Connect(bg, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg)
	// The table only discovery finds is fenced from the first statement.
	if _, err := c.Exec(bg, "SET fence.token = '10'"); err != nil {
		t.Fatal(err)
	}
	if tag, err := c.Exec(bg, "UPDATE first_t SET v = 'stale' WHERE id = 1"); err != nil || tag.String() != "UPDATE 0" {
		t.Fatalf("a stale write to a discovered table: %v %v, want UPDATE 0", tag, err)
	}
}
