package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/patroni"
	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/lease/leasetest"
)

// With two hosts and target_session_attrs=read-write, sessions go to the
// one that takes writes; when the other takes over, pgfence follows it,
// ends the sessions on the old one, and /readyz names the new one.
// (Here a server that refuses writes is made so with
// default_transaction_read_only, which is what libpq's read-write check
// reads too; the torture check fails over a real streaming standby.)
func TestServeFollowsPrimary(t *testing.T) {
	bg := context.Background()
	a, b := twoServers(t)
	readOnly(t, a, true)

	s := &serveTest{t: t, pg: a}
	up := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write", a.Addr(), b.Addr())
	inst := s.serve(serveOptions{upstream: up, backstop: "off"})
	if got := inst.proxy.Upstream().Addr; got != b.Addr() {
		t.Fatalf("sessions go to %s, want the writable %s", got, b.Addr())
	}
	if code, body := readyz(t, inst); code != http.StatusOK || !strings.Contains(body, b.Addr()+" is a writable primary") {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	c := s.client(inst, "")
	if got := tag(t, c, "CREATE TABLE follow (id int)"); got != "CREATE TABLE" {
		t.Fatal(got)
	}

	readOnly(t, b, true)
	readOnly(t, a, false)
	deadline := time.Now().Add(10 * time.Second)
	for inst.proxy.Upstream().Addr != a.Addr() {
		if time.Now().After(deadline) {
			t.Fatalf("pgfence did not follow the primary to %s", a.Addr())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.Exec(bg, "SELECT 1"); err == nil {
		t.Fatal("a session on the old primary goes on after pgfence moved to the new one")
	}
	if got := tag(t, s.client(inst, ""), "CREATE TABLE follow (id int)"); got != "CREATE TABLE" {
		t.Fatalf("a new session after the move: %s", got)
	}
	if code, body := readyz(t, inst); code != http.StatusOK || !strings.Contains(body, a.Addr()) {
		t.Fatalf("/readyz after the move: %d %q", code, body)
	}

	// Neither takes writes: not ready, and says why, once the last
	// verdict (a second at most) has passed.
	readOnly(t, a, true)
	deadline = time.Now().Add(10 * time.Second)
	for {
		code, body := readyz(t, inst)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "read-only") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz with no writable host: %d %q", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pointed at one node of a Patroni cluster, with
// target_session_attrs=read-write, pgfence serves while it leads; once a
// switchover makes it a streaming standby, pgfence ends every new session
// there with 25006 (the standby says in_hot_standby = on), and /readyz says
// why it is not ready. Pointed at a standby from the start, it never reads
// the catalog (its connection must be read-write) and refuses clients
// with 08004 saying so.
func TestServeRefusesStandby(t *testing.T) {
	needReplicationTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd := leasetest.StartEtcdT(t)
	c, err := patroni.Start(ctx, etcd.Endpoints(), patroni.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var standby *patroni.Node
	for _, n := range c.Nodes() {
		if n != leader {
			standby = n
		}
	}
	s := &serveTest{t: t}
	var pe *pgconn.PgError
	onStandby := s.serve(serveOptions{upstream: standby.URL("postgres") + "&target_session_attrs=read-write", backstop: "off"})
	_, err = pgx.Connect(ctx, "postgres://postgres@"+onStandby.Addr()+"/postgres?sslmode=disable")
	if !errors.As(err, &pe) || pe.Code != "08004" || !strings.Contains(pe.Message, "not ready: see its log") || !strings.Contains(pe.Message, "catalog") {
		t.Fatalf("a session through a pgfence that only ever saw a standby: %v, want FATAL 08004 saying it is not ready, as it has not read the catalog", err)
	}
	if code, body := readyz(t, onStandby); code != http.StatusServiceUnavailable || !strings.Contains(body, "read only") {
		t.Fatalf("/readyz of a pgfence that only ever saw a standby: %d %q, want 503 saying why", code, body)
	}

	inst := s.serve(serveOptions{upstream: leader.URL("postgres") + "&target_session_attrs=read-write", backstop: "off"})
	s.client(inst, "") // served while it leads
	if _, err := c.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = pgx.Connect(ctx, "postgres://postgres@"+inst.Addr()+"/postgres?sslmode=disable")
	if !errors.As(err, &pe) || pe.Code != "25006" || !strings.Contains(pe.Message, "standby") {
		t.Fatalf("a session on a standby: %v, want FATAL 25006 saying the server is a standby", err)
	}
	if code, body := readyz(t, inst); code != http.StatusServiceUnavailable || !strings.Contains(body, "read-only") {
		t.Fatalf("/readyz on a standby: %d %q", code, body)
	}
}

// twoServers starts two Postgres servers for a failover, stopped when t
// ends.
func twoServers(t *testing.T) (a, b *pgserver.Server) {
	t.Helper()
	var servers [2]*pgserver.Server
	for k := range servers {
		pg, err := pgserver.Start(context.Background(), pgserver.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pg.Stop() })
		servers[k] = pg
	}
	return servers[0], servers[1]
}

// readOnly makes pg refuse writes, or take them again, as libpq's
// read-write check (target_session_attrs) sees it:
// default_transaction_read_only, reloaded.
func readOnly(t *testing.T, pg *pgserver.Server, on bool) {
	t.Helper()
	bg := context.Background()
	c, err := pgx.Connect(bg, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg)
	for _, sql := range []string{fmt.Sprintf("ALTER SYSTEM SET default_transaction_read_only = %v", on), "SELECT pg_reload_conf()"} {
		if _, err := c.Exec(bg, sql); err != nil {
			t.Fatal(err)
		}
	}
}

// needReplicationTools skips t where the Postgres under test lacks what
// Patroni makes and inspects a standby with: the version matrix's builds
// (scripts/fetch-postgres.sh) ship initdb, pg_ctl and postgres alone, so
// the standby tests run on the main run's Postgres (every supported
// version reports in_hot_standby alike, from 14 on).
func needReplicationTools(t *testing.T) {
	t.Helper()
	bin, err := pgserver.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"pg_controldata", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(bin, tool)); err != nil {
			t.Skipf("needs %s beside the server in %s (Patroni makes its standby with it); the version matrix's builds have none", tool, bin)
		}
	}
}
