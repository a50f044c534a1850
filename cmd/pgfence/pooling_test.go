package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgbouncer"
	"github.com/pgfence/pgfence/internal/pgserver"
)

// bouncer runs PgBouncer in poolMode with two server connections in front
// of the test's Postgres.
func (s *serveTest) bouncer(poolMode string) *pgbouncer.PgBouncer {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: s.pg.Addr(), PoolMode: poolMode, PoolSize: 2})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(b.Stop)
	return b
}

// Behind a transaction pooler nobody told it of, pgfence refuses clients,
// saying which flag to set, and /readyz says it is not ready: a session's
// token would otherwise stay on server connections other clients get.
// Behind a session pooler, told so, it serves.
func TestServeDetectsPooler(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	b := s.bouncer("transaction")
	inst := s.serve(serveOptions{upstream: "postgres://postgres@" + b.Addr() + "/postgres?sslmode=disable",
		upstreamPooling: poolingNone, discover: true, backstop: "off"})

	_, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/postgres?sslmode=disable")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08004" || !strings.Contains(pe.Message, "--upstream-pooling=transaction") || strings.Count(pe.Message, "pgfence:") != 1 {
		t.Fatalf("a client behind an undeclared pooler: %v; want FATAL 08004 naming --upstream-pooling=transaction", err)
	}
	if code, body := readyz(t, inst); code != http.StatusServiceUnavailable || !strings.Contains(body, "pooler") {
		t.Fatalf("/readyz behind an undeclared pooler: %d %q, want 503 naming the pooler", code, body)
	}

	// Session mode, declared: served.
	sb := s.bouncer("session")
	inst = s.serve(serveOptions{upstream: "postgres://postgres@" + sb.Addr() + "/postgres?sslmode=disable",
		upstreamPooling: poolingSession, discover: true, backstop: "off"})
	c := s.client(inst, "5")
	if got := tag(t, c, "UPDATE accounts SET val = 'x'"); got != "UPDATE 0" {
		t.Fatalf("behind a declared session pooler: %s", got)
	}
}

// With --upstream-pooling=transaction, discovery and the backstop work
// through the pooler, psql's SET then write is fenced, and a stale
// writer's write changes nothing.
func TestServeTransactionPooling(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	s.exec("INSERT INTO accounts VALUES (1, 'a', 0)")
	b := s.bouncer("transaction")
	through := "postgres://postgres@" + b.Addr() + "/postgres?sslmode=disable"
	// pgfence init works through the pooler too.
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"init", "--upstream", through, "--upstream-pooling", "transaction", "--guard", "public.accounts"})
	if err := cmd.Execute(); err != nil || !strings.Contains(out.String(), "public.accounts: backstop created") {
		t.Fatalf("init through the pooler: %v\n%s", err, out.String())
	}
	inst := s.serve(serveOptions{upstream: through, upstreamPooling: poolingTransaction, discover: true, backstop: "install"})
	if got := scrape(t, inst, `pgfence_discovery_ok{database="postgres"}`); got != "1" {
		t.Fatalf("pgfence_discovery_ok = %q through the pooler, want 1", got)
	}
	if _, ok := guarded(inst, "public", "accounts"); !ok {
		t.Fatal("accounts is not guarded: discovery through the pooler found nothing")
	}
	if got := scrape(t, inst, `pgfence_backstop_installed{database="postgres",table="public.accounts"}`); got != "1" {
		t.Fatalf("backstop installed through the pooler = %q, want 1", got)
	}

	// The server's psql, else the one on PATH: the version matrix's
	// builds ship none, and any psql speaks to any supported server.
	bin, err := pgserver.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	psqlBin := filepath.Join(bin, "psql")
	if _, err := os.Stat(psqlBin); err != nil {
		if psqlBin, err = exec.LookPath("psql"); err != nil {
			t.Fatalf("no psql in %s nor on PATH: %v", bin, err)
		}
	}
	psql := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(psqlBin, append([]string{"-X", "-v", "ON_ERROR_STOP=1",
			"postgres://postgres@" + inst.Addr() + "/postgres?sslmode=disable"}, args...)...)
		cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := psql("-c", "SET fence.token = '7'", "-c", "UPDATE accounts SET val = 'psql' WHERE id = 1"); !strings.Contains(out, "UPDATE 1") {
		t.Fatalf("psql's SET then UPDATE: %q, want UPDATE 1", out)
	}
	if v, e := s.epoch("accounts", 1); v != "psql" || e != 7 {
		t.Fatalf("after psql's write: %q at epoch %d, want psql at 7", v, e)
	}
	if out := psql("-c", "SET fence.token = '3'", "-c", "UPDATE accounts SET val = 'stale' WHERE id = 1"); !strings.Contains(out, "UPDATE 0") {
		t.Fatalf("psql's stale write: %q, want UPDATE 0", out)
	}
	if out := psql("-c", "BEGIN", "-c", "SET LOCAL fence.token = '9'", "-c", "UPDATE accounts SET val = 'block' WHERE id = 1", "-c", "COMMIT"); !strings.Contains(out, "UPDATE 1") {
		t.Fatalf("psql's SET LOCAL block: %q, want UPDATE 1", out)
	}
	if v, e := s.epoch("accounts", 1); v != "block" || e != 9 {
		t.Fatalf("after the block: %q at epoch %d, want block at 9", v, e)
	}
	// A write pgfence cannot see (a function's) meets the backstop with
	// the session's token, set in its transaction.
	s.exec(`CREATE FUNCTION touch(v text) RETURNS void LANGUAGE sql AS $$ UPDATE accounts SET val = v WHERE id = 1 $$`)
	c := s.client(inst, "8")
	if _, err := c.Exec(context.Background(), "SELECT touch('fn')", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if v, e := s.epoch("accounts", 1); v != "block" || e != 9 {
		t.Fatalf("a stale write in a function: %q at epoch %d, want it skipped by the backstop", v, e)
	}
	if got := scrape(t, inst, fmt.Sprintf("fencing_reject_total{database=%q,kind=%q,mode=%q,table=%q,via=%q}", "postgres", "row", "enforce", "public.accounts", "backstop")); got != "1" {
		t.Fatalf("the backstop's reject counted as %q, want 1", got)
	}
}
