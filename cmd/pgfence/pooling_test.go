package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	return s.bouncerWith(pgbouncer.Options{PoolMode: poolMode, PoolSize: 2})
}

// bouncerWith runs PgBouncer with o in front of the test's Postgres,
// stopped after the instances and clients the test starts later.
func (s *serveTest) bouncerWith(o pgbouncer.Options) *pgbouncer.PgBouncer {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o.Upstream = s.pg.Addr()
	b, err := pgbouncer.Start(ctx, o)
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

// TestServePooledRole: behind a transaction pooler clients share server
// connections, and a token one client left on one for the session, in a
// function, stays there for the next client. A write pgfence does not see
// as one (a SELECT of a view whose function writes: no write keyword, no
// call in the text) gets no token from pgfence, so the backstop reads what
// the connection holds. With --backstop-pooled-role it counts a token only
// in the transaction pgfence set it in: the stale client's hidden write is
// refused, not landed under the other client's token.
func TestServePooledRole(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE ROLE pooled_app LOGIN")
	t.Cleanup(func() { s.exec("DROP OWNED BY pooled_app"); s.exec("DROP ROLE pooled_app") })
	s.exec("CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	s.exec("INSERT INTO accounts VALUES (1, 'a', 60)")
	s.exec("GRANT SELECT, UPDATE ON accounts TO pooled_app")
	s.exec(`CREATE FUNCTION leave(tok text) RETURNS text LANGUAGE sql AS $$ SELECT set_config('fence.token', tok, false) $$`)
	s.exec(`CREATE FUNCTION bump() RETURNS int LANGUAGE sql AS $$ UPDATE accounts SET val = 'hidden' WHERE id = 1 RETURNING 1 $$`)
	s.exec("CREATE VIEW hidden AS SELECT bump() AS a")
	s.exec("GRANT SELECT ON hidden TO pooled_app")

	// One server connection, so that every transaction runs on it.
	b, err := pgbouncer.Start(context.Background(), pgbouncer.Options{Upstream: s.pg.Addr(), PoolMode: "transaction", PoolSize: 1, Users: []string{"pooled_app"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	through := "postgres://postgres@" + b.Addr() + "/postgres?sslmode=disable"
	connect := func(inst *instance, tok string) *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(context.Background(), "postgres://pooled_app@"+inst.Addr()+"/postgres?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		if _, err := c.Exec(context.Background(), "SET fence.token = '"+tok+"'"); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// leaveAndWriteHidden has the lease's holder (token 100) leave its
	// token on the server connection, then the stale client (50, below the
	// row's 60) write through the view.
	leaveAndWriteHidden := func(inst *instance) error {
		t.Helper()
		holder, stale := connect(inst, "100"), connect(inst, "50")
		if _, err := holder.Exec(context.Background(), "SELECT leave('100')"); err != nil {
			t.Fatal(err)
		}
		_, err := stale.Exec(context.Background(), "SELECT a FROM hidden")
		return err
	}

	for _, pooled := range []bool{false, true} {
		s.exec("UPDATE accounts SET val = 'a', fence_epoch = 60 WHERE id = 1")
		o := serveOptions{upstream: through, upstreamPooling: poolingTransaction, discover: true, backstop: "install"}
		if pooled {
			o.pooledRoles = []string{"pooled_app"}
		}
		// Each configuration recorded as 'pgfence init' records it.
		cmd := rootCmd()
		cmd.SetOut(io.Discard)
		args := []string{"init", "--upstream", through, "--upstream-pooling", "transaction", "--guard", "public.accounts"}
		if pooled {
			args = append(args, "--backstop-pooled-role", "pooled_app")
		}
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		var log lockedBuffer
		inst := s.serveLogged(o, &log)
		// Behind a transaction pooler without the flag, pgfence says so at
		// start, and what to set.
		if warned := strings.Contains(log.String(), "without --backstop-pooled-role"); warned == pooled {
			t.Errorf("--backstop-pooled-role given: %v; warned at start: %v; want a warning exactly without it:\n%s", pooled, warned, log.String())
		}
		err := leaveAndWriteHidden(inst)
		v, e := s.epoch("accounts", 1)
		if !pooled {
			// What the flag is for: without it the stale write lands
			// under the other client's token.
			if err != nil || v != "hidden" || e != 100 {
				t.Fatalf("without --backstop-pooled-role: %v, row %q at %d; want the leftover token's write (hidden at 100), which the flag prevents", err, v, e)
			}
			continue
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55000" || !strings.Contains(pe.Message, "transaction pooler") {
			t.Fatalf("the stale client's hidden write with --backstop-pooled-role: %v; want 55000 naming the transaction pooler", err)
		}
		if v != "a" || e != 60 {
			t.Fatalf("row 1 is %q at %d after the refused write, want a at 60", v, e)
		}
		// Writes pgfence sees get the session's own token, set in their
		// transaction: fenced as ever, in a function called in the text too.
		c := connect(inst, "70")
		if got := tag(t, c, "UPDATE accounts SET val = 'seen' WHERE id = 1"); got != "UPDATE 1" {
			t.Fatalf("a fresh write with --backstop-pooled-role: %s", got)
		}
		if _, err := c.Exec(context.Background(), "SELECT bump()"); err != nil {
			t.Fatalf("a fresh write in a function called in the text: %v", err)
		}
		if v, e := s.epoch("accounts", 1); v != "hidden" || e != 70 {
			t.Fatalf("after fresh writes at 70: %q at %d", v, e)
		}
		stale := connect(inst, "50")
		if got := tag(t, stale, "UPDATE accounts SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
			t.Fatalf("a stale write pgfence sees: %s", got)
		}
	}
}

// Behind a transaction pooler that keeps a server connection's session
// state between transactions (PgBouncer's default), pgfence warns at start
// that one client's leftovers run in another's writes, and names the
// settings that reset it; behind one that resets after every transaction
// it does not warn, and the leftover the warning is about (a temporary
// view named like the guarded table, whose trigger raises the token, red
// team 6a) does not reach the next client's write.
func TestServeWarnsPoolerKeepsSessionState(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	for _, keeps := range []bool{true, false} {
		t.Run(fmt.Sprintf("keeps=%v", keeps), func(t *testing.T) {
			s.exec("DELETE FROM accounts; INSERT INTO accounts VALUES (1, 'a', 50)")
			// One server connection, which every client gets in turn.
			o := pgbouncer.Options{PoolMode: "transaction", PoolSize: 1}
			if !keeps {
				o.Extra = []string{"server_reset_query = DISCARD ALL", "server_reset_query_always = 1"}
			}
			b := s.bouncerWith(o)
			var log lockedBuffer
			inst := s.serveLogged(serveOptions{upstream: "postgres://postgres@" + b.Addr() + "/postgres?sslmode=disable",
				upstreamPooling: poolingTransaction, backstop: "install", policyOptions: policyOptions{guards: []string{"accounts"}}}, &log)
			// Another client of the pooler (straight to it: pgfence sees
			// nothing of it).
			attacker, err := pgx.Connect(context.Background(), "postgres://postgres@"+b.Addr()+"/postgres?sslmode=disable&default_query_exec_mode=exec")
			if err != nil {
				t.Fatal(err)
			}
			for _, sql := range []string{
				"BEGIN", // the leftovers in one transaction, so that a reset after it is what removes them
				`CREATE FUNCTION pg_temp.raise() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
					PERFORM set_config('fence.token', '777', true);
					UPDATE public.accounts SET val = NEW.val WHERE id = OLD.id;
					RETURN NEW; END $$`,
				`CREATE TEMP VIEW accounts AS SELECT id, val, 0::bigint AS fence_epoch FROM public.accounts`,
				`CREATE TRIGGER raise INSTEAD OF UPDATE ON pg_temp.accounts FOR EACH ROW EXECUTE FUNCTION pg_temp.raise()`,
				"COMMIT",
			} {
				tag(t, attacker, sql)
			}
			attacker.Close(context.Background())
			if warned := strings.Contains(log.String(), "server_reset_query_always = 1"); warned != keeps {
				t.Errorf("the pooler keeps session state: %v; warned: %v; want a warning exactly when it keeps it:\n%s", keeps, warned, log.String())
			}
			if keeps {
				return // what the warning is about: no fence holds there
			}
			victim := s.client(inst, "10")
			tag(t, victim, "UPDATE accounts SET val = 'stale' WHERE id = 1")
			if v, e := s.epoch("accounts", 1); v != "a" || e != 50 {
				t.Fatalf("a stale write, after another client's leftover, behind a pooler that resets: row %q at %d, want a at 50", v, e)
			}
		})
	}
}
