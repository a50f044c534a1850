package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// database creates database name on the test's Postgres, dropped when the
// test ends, and returns a connection to it that fires no trigger (as the
// fixtures' connection to postgres).
func (s *serveTest) database(name string) *pgx.Conn {
	s.t.Helper()
	s.exec("CREATE DATABASE " + name)
	s.t.Cleanup(func() { s.exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	c, err := pgx.Connect(context.Background(), s.pg.URL(name))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(context.Background(), "SET session_replication_role = replica"); err != nil {
		s.t.Fatal(err)
	}
	return c
}

// clientOf connects to pgfence's database db with token tok ("" for none).
func (s *serveTest) clientOf(inst *instance, db, tok string) *pgx.Conn {
	s.t.Helper()
	c, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/"+db+"?sslmode=disable")
	if err != nil {
		s.t.Fatalf("connecting to %s through pgfence: %v", db, err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	if tok != "" {
		tag(s.t, c, "SET fence.token = '"+tok+"'")
	}
	return c
}

// guardedIn is the guard of schema.table in the policy of database db.
func guardedIn(inst *instance, db, schema, table string) (sqlrewrite.Guard, bool) {
	inst.dbMu.Lock()
	d := inst.dbs[db]
	inst.dbMu.Unlock()
	if d == nil || d.policy.Load() == nil {
		return sqlrewrite.Guard{}, false
	}
	for _, g := range d.policy.Load().Config().Guards {
		if g.Schema == schema && g.Table == table {
			return g, true
		}
	}
	return sqlrewrite.Guard{}, false
}

func row(t *testing.T, c *pgx.Conn, sql string) (string, int64) {
	t.Helper()
	var v string
	var e int64
	if err := c.QueryRow(context.Background(), sql).Scan(&v, &e); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v, e
}

// A session to a database other than the --upstream one is fenced by
// that database's own catalog, read at its first session: a table of the
// same name is guarded there as its own database says (here: with another
// epoch column, inherited from a parent guarded by --guard, which does not
// exist in the first database), its stale writes are counted under its
// database, the backstop is installed there, and DDL in its sessions has
// its own catalog read again.
func TestServeFencesEveryDatabase(t *testing.T) {
	s := newServeTest(t)
	s.exec(`CREATE TABLE md_acct (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO md_acct VALUES (1, 'a', 5)`)
	t.Cleanup(func() { s.exec("DROP TABLE md_acct") })
	second := s.database("md_second")
	if _, err := second.Exec(context.Background(), `CREATE TABLE md_parent (id int PRIMARY KEY, val text, epoch_b bigint NOT NULL DEFAULT 0);
		CREATE TABLE md_acct () INHERITS (md_parent);
		INSERT INTO md_acct VALUES (1, 'a', 5);
		CREATE TABLE md_only (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO md_only VALUES (1, 'a', 5)`); err != nil {
		t.Fatal(err)
	}
	inst := s.serve(serveOptions{discover: true, backstop: "install", policyOptions: policyOptions{guards: []string{"md_parent:epoch_b"}}})

	first := s.clientOf(inst, "postgres", "7")
	if got := tag(t, first, "INSERT INTO md_acct (id, val) VALUES (2, 'fresh')"); got != "INSERT 0 1" {
		t.Fatalf("fresh insert in postgres: %s", got)
	}
	if v, e := row(t, s.db, "SELECT val, fence_epoch FROM md_acct WHERE id = 2"); v != "fresh" || e != 7 {
		t.Fatalf("postgres's md_acct after a fresh insert: %q at fence_epoch %d, want stamped 7", v, e)
	}

	// Its first session reads md_second's catalog; its series are there
	// from then, at 0.
	fresh := s.clientOf(inst, "md_second", "7")
	if g, ok := guardedIn(inst, "md_second", "public", "md_acct"); !ok || g.Column != "epoch_b" || !g.Backstop {
		t.Errorf("md_second's md_acct: guard %+v (found %v), want guarded by epoch_b with the backstop", g, ok)
	}
	for series, want := range map[string]string{
		`pgfence_discovery_ok{database="md_second"}`:                                                                      "1",
		`pgfence_guarded_tables{database="md_second"}`:                                                                    "3",
		`pgfence_backstop_ok{database="md_second"}`:                                                                       "1",
		`pgfence_backstop_installed{database="md_second",table="public.md_acct"}`:                                         "1",
		`fencing_reject_total{database="md_second",kind="row",mode="enforce",table="public.md_acct",via="rewrite"}`:       "0",
		`pgfence_backstop_exempt_writes_total{database="md_second"}`:                                                      "0",
		`fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.md_acct",via="rewrite"}`:        "0",
		`critical_write_without_token_total{action="refused",database="md_second",mode="enforce",table="public.md_acct"}`: "0",
	} {
		if got := scrape(t, inst, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
	if got := tag(t, fresh, "INSERT INTO md_acct (id, val) VALUES (2, 'fresh')"); got != "INSERT 0 1" {
		t.Fatalf("fresh insert in md_second: %s", got)
	}
	if v, e := row(t, second, "SELECT val, epoch_b FROM md_acct WHERE id = 2"); v != "fresh" || e != 7 {
		t.Fatalf("md_second's md_acct after a fresh insert: %q at epoch_b %d, want stamped 7", v, e)
	}

	// A stale write there changes nothing, and is counted under md_second:
	// to a table only md_second has, and to the one of the same name.
	stale := s.clientOf(inst, "md_second", "3")
	if got := tag(t, stale, "UPDATE md_only SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("stale write to md_second's own table: %s, want UPDATE 0", got)
	}
	if got := scrape(t, inst, `fencing_reject_total{database="md_second",kind="row",mode="enforce",table="public.md_only",via="rewrite"}`); got != "1" {
		t.Fatalf(`fencing_reject_total{database="md_second",table="public.md_only"} = %q, want 1`, got)
	}
	if got := tag(t, stale, "UPDATE md_acct SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("stale write to md_second: %s, want UPDATE 0", got)
	}
	if v, e := row(t, second, "SELECT val, epoch_b FROM md_acct WHERE id = 1"); v != "a" || e != 5 {
		t.Fatalf("md_second's row after a stale write: %q at %d", v, e)
	}
	if got := scrape(t, inst, `fencing_reject_total{database="md_second",kind="row",mode="enforce",table="public.md_acct",via="rewrite"}`); got != "1" {
		t.Fatalf(`fencing_reject_total{database="md_second"} = %q, want 1`, got)
	}
	if got := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.md_acct",via="rewrite"}`); got != "0" {
		t.Fatalf(`fencing_reject_total{database="postgres"} = %q after a stale write to md_second, want 0`, got)
	}

	// The backstop is in md_second: a stale write straight to Postgres is
	// skipped by its trigger.
	direct, err := pgx.Connect(context.Background(), s.pg.URL("md_second"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	tag(t, direct, "SET fence.token = '3'")
	if got := tag(t, direct, "UPDATE md_acct SET val = 'direct' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("stale direct write to md_second: %s, want UPDATE 0 (the backstop)", got)
	}

	// A table made through pgfence in md_second is guarded by the
	// statement after: md_second's catalog is read again, not postgres's.
	tag(t, fresh, "CREATE TABLE md_new (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	tag(t, fresh, "INSERT INTO md_new (id, val) VALUES (1, 'a')")
	if g, ok := guardedIn(inst, "md_second", "public", "md_new"); !ok || !g.Backstop {
		t.Fatalf("md_second's md_new after CREATE TABLE through pgfence: %+v %v, want guarded", g, ok)
	}
	if _, ok := guardedIn(inst, "postgres", "public", "md_new"); ok {
		t.Fatal("md_second's new table is guarded in postgres's policy")
	}
	if got := tag(t, stale, "UPDATE md_new SET val = 'stale'"); got != "UPDATE 0" {
		t.Fatalf("stale write to md_second's new table: %s", got)
	}
	if got := scrape(t, inst, `fencing_reject_total{database="md_second",kind="row",mode="enforce",table="public.md_new",via="rewrite"}`); got != "1" {
		t.Fatalf("rewrite reject on md_second's new table = %q, want 1 (the rewrite, not only the backstop, fenced it)", got)
	}

	// /readyz lists both.
	code, body := readyz(t, inst)
	if code != 200 || !strings.Contains(body, `database "postgres" (--upstream): backstop: in place`) || !strings.Contains(body, `database "md_second": backstop: in place on all 4`) {
		t.Fatalf("/readyz: %d %q", code, body)
	}

	// A logical replication connection belongs to its database; a
	// physical one has none, and is served as before.
	ctx := context.Background()
	logical, err := pgconn.Connect(ctx, "postgres://postgres@"+inst.Addr()+"/md_second?sslmode=disable&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer logical.Close(ctx)
	res, err := logical.Exec(ctx, "SET fence.token = '3'; UPDATE md_acct SET val = 'stale' WHERE id = 1").ReadAll()
	if err != nil || len(res) != 2 || res[1].CommandTag.String() != "UPDATE 0" {
		t.Fatalf("a stale write on a logical replication connection to md_second: %v %v", res, err)
	}
	physical, err := pgconn.Connect(ctx, "postgres://postgres@"+inst.Addr()+"/md_second?sslmode=disable&replication=true")
	if err != nil {
		t.Fatal(err)
	}
	defer physical.Close(ctx)
	if res, err := physical.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil || len(res[0].Rows) != 1 {
		t.Fatalf("IDENTIFY_SYSTEM on a physical replication connection: %v %v", res, err)
	}
}

// A database left out by --exclude-database has its sessions refused,
// saying so; the --upstream one cannot be left out. A database whose
// catalog pgfence's role cannot read has its sessions refused, saying why
// (fail closed), until it can; one that does not exist gets Postgres's own
// error.
func TestServeRefusesDatabasesItCannotFence(t *testing.T) {
	s := newServeTest(t)
	s.database("md_excluded")
	locked := s.database("md_locked")
	if _, err := locked.Exec(context.Background(), `CREATE TABLE md_kept (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO md_kept VALUES (1, 'a', 5)`); err != nil {
		t.Fatal(err)
	}
	s.exec(`CREATE ROLE md_pgfence LOGIN; REVOKE CONNECT ON DATABASE md_locked FROM PUBLIC`)
	t.Cleanup(func() { s.exec("DROP OWNED BY md_pgfence; DROP ROLE md_pgfence") })
	up := strings.Replace(s.pg.URL("postgres"), "postgres@", "md_pgfence@", 1)

	o := serveOptions{listen: "127.0.0.1:0", metricsListen: "", upstream: up, excludeDatabases: []string{"md_excluded", "postgres"}}
	if _, err := start(o, nil); err == nil || !strings.Contains(err.Error(), `--exclude-database "postgres": that is the --upstream database`) {
		t.Fatalf("excluding the --upstream database: %v, want an error saying it cannot be", err)
	}

	inst := s.serve(serveOptions{upstream: up, discover: true, backstop: "off", excludeDatabases: []string{"md_excluded"}})
	// A session's database is read only once Postgres has authenticated
	// it: its first statement waits for the read, and is refused if it
	// fails.
	connect := func(db string) error {
		c, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/"+db+"?sslmode=disable")
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(context.Background(), "SELECT 1")
		return err
	}
	var pe *pgconn.PgError
	if err := connect("md_excluded"); !errors.As(err, &pe) || pe.Code != "08004" || pe.Severity != "FATAL" ||
		!strings.Contains(pe.Message, `database "md_excluded" is excluded from fencing (--exclude-database)`) || !strings.Contains(pe.Message, "connect to Postgres directly") {
		t.Fatalf("a session to an excluded database: %v; want FATAL 08004 saying it is excluded and what to do", err)
	}
	if err := connect("md_locked"); !errors.As(err, &pe) || pe.Code != "08004" || pe.Severity == "FATAL" ||
		!strings.Contains(pe.Message, `no fencing policy for database "md_locked"`) ||
		!strings.Contains(pe.Message, "its read of the database's catalog failed (SQLSTATE 42501): see pgfence's log") ||
		!strings.Contains(pe.Message, "reconnect to retry") || strings.Contains(pe.Message, "permission denied") {
		t.Fatalf("a statement of a session to a database pgfence's role may not connect to: %v; want 08004 saying it cannot read its catalog, with the SQLSTATE, and nothing of pgfence's own login", err)
	}
	if _, ok := guardedIn(inst, "md_locked", "public", "x"); ok || scrape(t, inst, `pgfence_discovery_ok{database="md_locked"}`) != "" {
		t.Fatal("a database never read has a policy or series")
	}
	if err := connect("md_nosuch"); !errors.As(err, &pe) || pe.Code != "3D000" {
		t.Fatalf("a session to a database that does not exist: %v; want Postgres's 3D000", err)
	}
	// A reload that would exclude the --upstream database is not put in
	// force.
	bad := inst.options()
	bad.excludeDatabases = []string{"postgres"}
	inst.reload(context.Background(), bad)
	if !inst.excluded("md_excluded") || inst.excluded("postgres") {
		t.Fatal("a reload excluding the --upstream database was put in force")
	}
	// Once the role may connect and pgfence is told (SIGHUP; without it,
	// once the wait its refused read set is over: see
	// TestServePacesRefusedReads), the next session reads it and is served.
	s.exec("GRANT CONNECT ON DATABASE md_locked TO md_pgfence")
	inst.reload(context.Background(), inst.options())
	if err := connect("md_locked"); err != nil {
		t.Fatalf("a session to md_locked once pgfence's role may read it: %v", err)
	}
	if got := scrape(t, inst, `pgfence_discovery_ok{database="md_locked"}`); got != "1" {
		t.Fatalf(`pgfence_discovery_ok{database="md_locked"} = %q, want 1`, got)
	}

	// A later read that fails keeps md_locked's guards of the last good
	// one (fail closed), and says so.
	s.exec("REVOKE CONNECT ON DATABASE md_locked FROM md_pgfence")
	inst.reload(context.Background(), inst.options())
	if got := scrape(t, inst, `pgfence_discovery_ok{database="md_locked"}`); got != "0" {
		t.Fatalf(`pgfence_discovery_ok{database="md_locked"} = %q after a failed read, want 0`, got)
	}
	if _, body := readyz(t, inst); !strings.Contains(body, `database "md_locked": catalog: last read failed`) {
		t.Fatalf("/readyz body after md_locked's read failed: %q", body)
	}
	if got := tag(t, s.clientOf(inst, "md_locked", "3"), "UPDATE md_kept SET val = 'stale'"); got != "UPDATE 0" {
		t.Fatalf("stale write to md_locked after its catalog read failed: %s, want UPDATE 0", got)
	}
}

// While Postgres refuses pgfence's login to a database other than the
// --upstream one, the sessions a client keeps opening to it cost pgfence
// no login each: after a refused read, the sessions that start within the
// wait it set (about a second, then twice as long each time, up to a
// minute) are refused at once, saying when pgfence reads it again, and
// Postgres sees one refused login per wait, not one per session. A SIGHUP
// reads it again at the next session.
func TestServePacesRefusedReads(t *testing.T) {
	pgLog := &pgtest.LogBuffer{}
	s := newServeTest(t, pgserver.Options{Log: pgLog})
	s.database("pr_locked")
	s.exec(`CREATE ROLE pr_pgfence LOGIN; REVOKE CONNECT ON DATABASE pr_locked FROM PUBLIC`)
	t.Cleanup(func() { s.exec("DROP OWNED BY pr_pgfence; DROP ROLE pr_pgfence") })
	up := strings.Replace(s.pg.URL("postgres"), "postgres@", "pr_pgfence@", 1)
	inst := s.serve(serveOptions{upstream: up, discover: true, backstop: "off"})

	refused := func() int { return strings.Count(pgLog.String(), `permission denied for database "pr_locked"`) }
	session := func() error {
		c, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/pr_locked?sslmode=disable")
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(context.Background(), "SELECT 1")
		return err
	}
	// Each session is refused: either after a read of its own (one login
	// Postgres refuses), or at once while the last refusal's wait lasts.
	var reads, held int
	poll.Eventually(t, 60*time.Second, "a session refused without a read of its own", func() bool {
		var pe *pgconn.PgError
		err := session()
		switch {
		case !errors.As(err, &pe) || pe.Code != "08004" || !strings.Contains(pe.Message, `no fencing policy for database "pr_locked"`) ||
			!strings.Contains(pe.Message, "its read of the database's catalog failed (SQLSTATE 42501): see pgfence's log"):
			t.Fatalf("a session to a database pgfence's role may not connect to: %v; want 08004 saying its read failed, with the SQLSTATE", err)
		case strings.Contains(pe.Message, "reconnect to retry"):
			reads++
		case strings.Contains(pe.Message, "pgfence reads it again at a session that starts in "):
			held++
		default:
			t.Fatalf("a refused session is told neither to reconnect nor when pgfence reads again: %s", pe.Message)
		}
		return held >= 5
	})
	// Postgres logs its refusal when it has sent it: wait for the count
	// the reads make, then check that no more came.
	poll.Eventually(t, 10*time.Second, "Postgres's log of pgfence's refused logins", func() bool { return refused() >= reads })
	if got := refused(); got != reads || reads < 1 {
		t.Fatalf("Postgres refused pgfence's login %d times for %d sessions that read (%d held): want one per read", got, reads, held)
	}

	// Once the role may connect, a SIGHUP has the next session read it.
	s.exec("GRANT CONNECT ON DATABASE pr_locked TO pr_pgfence")
	inst.reload(context.Background(), inst.options())
	if err := session(); err != nil {
		t.Fatalf("a session once pgfence's role may read the database and pgfence was reloaded: %v", err)
	}
	inst.dbMu.Lock()
	n := len(inst.paces)
	inst.dbMu.Unlock()
	if n != 0 {
		t.Errorf("%d paces kept after the read worked", n)
	}
}

// A database that is dropped is forgotten at its next read, series and
// all; one made again under its name is read afresh at its first session.
func TestServeForgetsDroppedDatabase(t *testing.T) {
	s := newServeTest(t)
	old := s.database("md_drop")
	if _, err := old.Exec(context.Background(), `CREATE TABLE md_t (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	old.Close(context.Background())
	inst := s.serve(serveOptions{discover: true, backstop: "off"})
	first := s.clientOf(inst, "md_drop", "")
	tag(t, first, "SELECT 1") // its first statement waits for the database's first read
	first.Close(context.Background())
	if got := scrape(t, inst, `pgfence_guarded_tables{database="md_drop"}`); got != "1" {
		t.Fatalf(`pgfence_guarded_tables{database="md_drop"} = %q, want 1`, got)
	}

	s.exec("DROP DATABASE md_drop WITH (FORCE)")
	inst.reload(context.Background(), inst.options()) // as SIGHUP does
	poll.Eventually(t, 10*time.Second, "md_drop forgotten", func() bool {
		inst.dbMu.Lock()
		defer inst.dbMu.Unlock()
		return inst.dbs["md_drop"] == nil
	})
	if got := scrape(t, inst, `pgfence_guarded_tables{database="md_drop"}`); got != "" {
		t.Fatalf(`pgfence_guarded_tables{database="md_drop"} = %q once it is dropped, want no series`, got)
	}

	made := s.database("md_drop")
	if _, err := made.Exec(context.Background(), `CREATE TABLE md_u (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO md_u VALUES (1, 'a', 5)`); err != nil {
		t.Fatal(err)
	}
	if got := tag(t, s.clientOf(inst, "md_drop", "3"), "UPDATE md_u SET val = 'stale'"); got != "UPDATE 0" {
		t.Fatalf("stale write to the table of a database made again: %s", got)
	}
}

// TestServeBoundsTheWaitForAFirstRead: a database's first read starts
// only once Postgres has authenticated a client of it, and that client's
// first statement waits for it no longer than admissionWait: it is refused
// then, saying so, and a statement after the read is served.
func TestServeBoundsTheWaitForAFirstRead(t *testing.T) {
	s := newServeTest(t)
	s.database("md_slow")
	// Postgres behind a relay that holds every connection to md_slow but
	// the first (the client's: the others are pgfence's catalog reads)
	// until gate is closed.
	gate := make(chan struct{})
	var reads atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var h [4]byte
				if _, err := io.ReadFull(c, h[:]); err != nil {
					return
				}
				packet := make([]byte, binary.BigEndian.Uint32(h[:]))
				copy(packet, h[:])
				if _, err := io.ReadFull(c, packet[4:]); err != nil {
					return
				}
				if bytes.Contains(packet, []byte("database\x00md_slow\x00")) && reads.Add(1) > 1 {
					<-gate
				}
				up, err := net.Dial("tcp", s.pg.Addr())
				if err != nil {
					return
				}
				defer up.Close()
				up.Write(packet)
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
	inst := s.serve(serveOptions{upstream: "postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable",
		discover: true, backstop: "off", startupTimeout: 2 * time.Second})
	if inst.admissionWait != time.Second {
		t.Fatalf("admission wait %v with --startup-timeout 2s, want 1s", inst.admissionWait)
	}
	c, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/md_slow?sslmode=disable")
	if err != nil {
		t.Fatalf("connecting to md_slow: %v", err)
	}
	defer c.Close(context.Background())
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d connections to md_slow before the session's first statement, want 1 (the client's own)", n)
	}
	_, err = c.Exec(context.Background(), "SELECT 1")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08004" || !strings.Contains(pe.Message, `the first read of its catalog did not finish within 1s`) {
		t.Fatalf("a statement whose database's first read takes too long: %v; want 08004 saying so", err)
	}
	close(gate)
	poll.Eventually(t, 30*time.Second, "the session served once the read is done", func() bool {
		_, err := c.Exec(context.Background(), "SELECT 1")
		return err == nil
	})
}
