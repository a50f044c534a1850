package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// serveTest is one Postgres for the serve-level tests of the backstop and
// discovery, which each use tables of their own.
type serveTest struct {
	t  *testing.T
	pg *pgserver.Server
	db *pgx.Conn
}

// newServeTest starts a Postgres for the test, with opts if given.
func newServeTest(t *testing.T, opts ...pgserver.Options) *serveTest {
	var o pgserver.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	pg, err := pgserver.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	db, err := pgx.Connect(context.Background(), pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	// The fixtures' own writes and DDL (rows at chosen epochs, tables the
	// event trigger must not see) are made as logical-replication apply
	// makes them: no trigger fires.
	if _, err := db.Exec(context.Background(), "SET session_replication_role = replica"); err != nil {
		t.Fatal(err)
	}
	return &serveTest{t: t, pg: pg, db: db}
}

func (s *serveTest) exec(sql string, args ...any) string {
	s.t.Helper()
	tag, err := s.db.Exec(context.Background(), sql, args...)
	if err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	return tag.String()
}

// serve starts pgfence with o (listen, metrics and upstream filled in).
func (s *serveTest) serve(o serveOptions) *instance {
	s.t.Helper()
	return s.serveLogged(o, io.Discard)
}

// serveLogged is serve with pgfence's log written to log.
func (s *serveTest) serveLogged(o serveOptions, log io.Writer) *instance {
	s.t.Helper()
	o.listen, o.metricsListen = "127.0.0.1:0", "127.0.0.1:0"
	if o.upstream == "" {
		o.upstream = s.pg.URL("postgres")
	}
	if o.tokenSetting == "" {
		o.tokenSetting = "fence.token"
	}
	if o.discoverColumn == "" {
		o.discoverColumn = "fence_epoch"
	}
	inst, err := start(o, slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { inst.Close() })
	return inst
}

// client connects to pgfence with token tok ("" for none).
func (s *serveTest) client(inst *instance, tok string) *pgx.Conn {
	s.t.Helper()
	c, err := pgx.Connect(context.Background(), "postgres://postgres@"+inst.Addr()+"/postgres?sslmode=disable")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	if tok != "" {
		if _, err := c.Exec(context.Background(), "SET fence.token = '"+tok+"'"); err != nil {
			s.t.Fatal(err)
		}
	}
	return c
}

// direct connects straight to Postgres with token tok.
func (s *serveTest) direct(tok string) *pgx.Conn {
	s.t.Helper()
	c, err := pgx.Connect(context.Background(), s.pg.URL("postgres"))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(context.Background(), "SET fence.token = '"+tok+"'"); err != nil {
		s.t.Fatal(err)
	}
	return c
}

func tag(t *testing.T, c *pgx.Conn, sql string) string {
	t.Helper()
	tg, err := c.Exec(context.Background(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tg.String()
}

func (s *serveTest) epoch(table string, id int) (string, int64) {
	s.t.Helper()
	var v string
	var e int64
	if err := s.db.QueryRow(context.Background(), "SELECT val, fence_epoch FROM "+table+" WHERE id = $1", id).Scan(&v, &e); err != nil {
		s.t.Fatal(err)
	}
	return v, e
}

// scrape returns the value of a series on /metrics, or "" if absent.
func scrape(t *testing.T, inst *instance, series string) string {
	t.Helper()
	v, err := scrapeCounter("http://"+inst.MetricsAddr()+"/metrics", series)
	if err != nil {
		return ""
	}
	return v
}

func readyz(t *testing.T, inst *instance) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + inst.MetricsAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func guarded(inst *instance, schema, table string) (sqlrewrite.Guard, bool) {
	for _, g := range inst.main.policy.Load().Config().Guards {
		if g.Schema == schema && g.Table == table {
			return g, true
		}
	}
	return sqlrewrite.Guard{}, false
}

func TestServeBackstop(t *testing.T) {
	s := newServeTest(t)
	bg := context.Background()

	// serve installs the backstop on a discovered table: a function
	// called through pgfence, and a direct connection, cannot land a stale
	// write; the reject through pgfence counts as via="backstop", and the
	// database's counter sees both.
	t.Run("installed at start", func(t *testing.T) {
		s.exec(`CREATE TABLE bs_accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
			INSERT INTO bs_accounts VALUES (1, 'v', 5), (2, 'w', 5);
			CREATE FUNCTION bs_set(i int, v text) RETURNS void LANGUAGE sql AS $$ UPDATE bs_accounts SET val = v WHERE id = i $$`)
		inst := s.serve(serveOptions{discover: true, backstop: "install"})
		if g, ok := guarded(inst, "public", "bs_accounts"); !ok || !g.Backstop {
			t.Fatalf("guard %+v (found %v): want discovered with Backstop", g, ok)
		}
		if v := scrape(t, inst, `pgfence_backstop_installed{database="postgres",table="public.bs_accounts"}`); v != "1" {
			t.Fatalf("pgfence_backstop_installed = %q, want 1", v)
		}
		if code, body := readyz(t, inst); code != 200 || !strings.Contains(body, "backstop: in place on all") {
			t.Fatalf("/readyz %d %q", code, body)
		}
		stale := s.client(inst, "3")
		tag(t, stale, "SELECT bs_set(1, 'stale')")
		if v, e := s.epoch("bs_accounts", 1); v != "v" || e != 5 {
			t.Fatalf("a stale write through a function landed: %q at %d", v, e)
		}
		if v := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.bs_accounts",via="backstop"}`); v != "1" {
			t.Fatalf(`fencing_reject_total{via="backstop"} = %q, want 1`, v)
		}
		// A session that asked for no notices (as ALTER ROLE ... SET
		// client_min_messages = warning would) is counted all the same:
		// the backstop raises its notice at its own client_min_messages.
		// pgfence keeps it from the client, as from any other.
		quietCfg, err := pgx.ParseConfig("postgres://postgres@" + inst.Addr() + "/postgres?sslmode=disable&client_min_messages=warning")
		if err != nil {
			t.Fatal(err)
		}
		var notices []string
		quietCfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Code+" "+n.Message) }
		quiet, err := pgx.ConnectConfig(bg, quietCfg)
		if err != nil {
			t.Fatal(err)
		}
		defer quiet.Close(bg)
		tag(t, quiet, "SET fence.token = '3'")
		tag(t, quiet, "SELECT bs_set(2, 'stale')")
		if v, e := s.epoch("bs_accounts", 2); v != "w" || e != 5 {
			t.Fatalf("a stale write through a function landed: %q at %d", v, e)
		}
		if v := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.bs_accounts",via="backstop"}`); v != "2" {
			t.Fatalf(`fencing_reject_total{via="backstop"} after a reject in a session with client_min_messages = warning: %q, want 2`, v)
		}
		if len(notices) != 0 {
			t.Fatalf("the quiet client got notices: %q", notices)
		}
		// The helpers are PUBLIC's, for the triggers' sake: a client that
		// calls one itself is refused, and counts nothing.
		forger := s.client(inst, "3")
		for _, call := range []string{
			"SELECT pgfence.note_reject('bs_accounts'::regclass, 'row', 'enforce', 9, 3)",
			"DO $$ BEGIN PERFORM pgfence.note_exempt('bs_accounts'::regclass, current_user); END $$",
		} {
			_, err := forger.Exec(bg, call)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42501" || !strings.Contains(pe.Message, "only its triggers call it") {
				t.Fatalf("%s: %v, want 42501 saying only the backstop's triggers call it", call, err)
			}
		}
		if v := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.bs_accounts",via="backstop"}`); v != "2" {
			t.Fatalf(`fencing_reject_total{via="backstop"} after a client called note_reject itself: %q, want 2`, v)
		}
		if got := tag(t, s.direct("3"), "UPDATE bs_accounts SET val = 'stale' WHERE id = 2"); got != "UPDATE 0" {
			t.Fatalf("stale direct write: %s", got)
		}
		fresh := s.client(inst, "7")
		tag(t, fresh, "SELECT bs_set(1, 'fresh')")
		if v, e := s.epoch("bs_accounts", 1); v != "fresh" || e != 7 {
			t.Fatalf("a fresh write through a function: %q at %d", v, e)
		}
		// A table created on a direct connection is fenced by Postgres at
		// once: the event trigger gives it the backstop (the tests run as
		// a superuser, who may create one).
		d := s.direct("7")
		tag(t, d, "CREATE TABLE bs_direct (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
		t.Cleanup(func() { s.exec("DROP TABLE bs_direct") })
		tag(t, d, "INSERT INTO bs_direct (id, val) VALUES (1, 'fresh')")
		if got := tag(t, s.direct("3"), "UPDATE bs_direct SET val = 'stale'"); got != "UPDATE 0" {
			t.Fatalf("stale write to a table created outside pgfence, before any discovery: %s", got)
		}
		// The database's counters are read at each discovery.
		inst.reload(bg, inst.opts)
		if v := scrape(t, inst, `pgfence_backstop_rejects_total{database="postgres",table="public.bs_accounts"}`); v != "3" {
			t.Fatalf("pgfence_backstop_rejects_total = %q, want 3 (two through pgfence, one direct)", v)
		}
	})

	// A role that may not create triggers on the table: said at start, in
	// the metric and in /readyz's body; the proxy keeps fencing what it
	// sees, and MERGE stays refused there.
	t.Run("no privilege", func(t *testing.T) {
		s.exec(`CREATE TABLE bs_foreign (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
			INSERT INTO bs_foreign VALUES (1, 'v', 5);
			CREATE ROLE bs_catalog LOGIN; GRANT CREATE ON DATABASE postgres TO bs_catalog`)
		t.Cleanup(func() {
			s.exec(`DROP TABLE bs_foreign; DROP OWNED BY bs_catalog; DROP ROLE bs_catalog`)
		})
		up := strings.Replace(s.pg.URL("postgres"), "postgres@", "bs_catalog@", 1)
		inst := s.serve(serveOptions{upstream: up, policyOptions: policyOptions{guards: []string{"public.bs_foreign"}}, backstop: "install"})
		if v := scrape(t, inst, `pgfence_backstop_installed{database="postgres",table="public.bs_foreign"}`); v != "0" {
			t.Fatalf("pgfence_backstop_installed = %q, want 0", v)
		}
		if v := scrape(t, inst, `pgfence_backstop_ok{database="postgres"}`); v != "0" {
			t.Fatalf("pgfence_backstop_ok = %q, want 0", v)
		}
		// Not ready while a guarded table lacks its backstop, unless the
		// operator says to serve anyway.
		code, body := readyz(t, inst)
		if code != 503 || !strings.Contains(body, "backstop: missing on") || !strings.Contains(body, "needs the TRIGGER privilege") || !strings.Contains(body, "--ready-without-backstop") {
			t.Fatalf("/readyz %d %q", code, body)
		}
		anyway := s.serve(serveOptions{upstream: up, policyOptions: policyOptions{guards: []string{"public.bs_foreign"}}, backstop: "install", readyWithoutBackstop: true})
		if code, body := readyz(t, anyway); code != 200 || !strings.Contains(body, "backstop: missing on") {
			t.Fatalf("/readyz with --ready-without-backstop: %d %q", code, body)
		}
		stale := s.client(inst, "3")
		if got := tag(t, stale, "UPDATE bs_foreign SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
			t.Fatalf("stale write without a backstop: %s", got)
		}
		if _, err := stale.Exec(bg, "MERGE INTO bs_foreign f USING (SELECT 1 AS id) s ON f.id = s.id WHEN MATCHED THEN UPDATE SET val = 'm'"); err == nil {
			t.Fatal("MERGE ran on a table without the backstop")
		}
	})

	// A catalog read that fails keeps the guards of the last good one
	// (fail closed), and says so.
	t.Run("catalog read fails", func(t *testing.T) {
		s.exec(`CREATE TABLE bs_kept (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
			INSERT INTO bs_kept VALUES (1, 'v', 5);
			CREATE ROLE bs_reader LOGIN`)
		t.Cleanup(func() { s.exec(`DROP TABLE bs_kept; DROP ROLE bs_reader`) })
		up := strings.Replace(s.pg.URL("postgres"), "postgres@", "bs_reader@", 1)
		inst := s.serve(serveOptions{upstream: up, discover: true, backstop: "off"})
		if _, ok := guarded(inst, "public", "bs_kept"); !ok {
			t.Fatal("bs_kept not discovered")
		}
		s.exec("ALTER ROLE bs_reader NOLOGIN")
		inst.reload(bg, inst.opts)
		if v := scrape(t, inst, `pgfence_discovery_ok{database="postgres"}`); v != "0" {
			t.Fatalf("pgfence_discovery_ok = %q after a failed read", v)
		}
		if _, ok := guarded(inst, "public", "bs_kept"); !ok {
			t.Fatal("a failed catalog read dropped the discovered guard")
		}
		if _, body := readyz(t, inst); !strings.Contains(body, "last read failed") {
			t.Fatalf("/readyz body %q", body)
		}
		if got := tag(t, s.client(inst, "3"), "UPDATE bs_kept SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
			t.Fatalf("stale write after a failed catalog read: %s", got)
		}
		s.exec("ALTER ROLE bs_reader LOGIN")
		inst.reload(bg, inst.opts)
		if v := scrape(t, inst, `pgfence_discovery_ok{database="postgres"}`); v != "1" {
			t.Fatalf("pgfence_discovery_ok = %q after a good read", v)
		}
	})

	// DDL through pgfence has the catalog read again before the session's
	// next statement, not at the next interval (here: never).
	// 'pgfence init' installs once, for teams that forbid runtime DDL;
	// serve --backstop verify then only checks, and reports drift (a
	// disabled trigger) without repairing it, where install repairs it.
	t.Run("init and verify", func(t *testing.T) {
		s.exec(`CREATE TABLE bs_init (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
			INSERT INTO bs_init VALUES (1, 'v', 5)`)
		t.Cleanup(func() { s.exec("DROP TABLE bs_init") })
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"init", "--upstream", s.pg.URL("postgres"), "--discover=false", "--guard", "public.bs_init", "--domain", "public.bs_init=bs_init_domain"})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("init: %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "public.bs_init: backstop created") || !strings.Contains(out.String(), "lock domains ready: bs_init_domain") {
			t.Fatalf("init said:\n%s", out.String())
		}
		// The membership is the database's: an instance without --domain
		// applies it.
		inst := s.serve(serveOptions{policyOptions: policyOptions{guards: []string{"public.bs_init"}}, backstop: "verify", initDomains: false})
		g, ok := guarded(inst, "public", "bs_init")
		if !ok || !g.Backstop || g.Domain != "bs_init_domain" {
			t.Fatalf("guard after init: %+v %v", g, ok)
		}
		s.exec(`ALTER TABLE bs_init DISABLE TRIGGER "~pgfence_backstop"`)
		inst.reload(bg, inst.opts)
		if v := scrape(t, inst, `pgfence_backstop_installed{database="postgres",table="public.bs_init"}`); v != "0" {
			t.Fatalf("a disabled backstop under verify: pgfence_backstop_installed = %q, want 0", v)
		}
		if _, body := readyz(t, inst); !strings.Contains(body, "is disabled") {
			t.Fatalf("/readyz body %q", body)
		}
		if g, _ := guarded(inst, "public", "bs_init"); g.Backstop {
			t.Fatal("a disabled backstop still lets MERGE through")
		}
		repair := s.serve(serveOptions{policyOptions: policyOptions{guards: []string{"public.bs_init"}}, backstop: "install"})
		if v := scrape(t, repair, `pgfence_backstop_installed{database="postgres",table="public.bs_init"}`); v != "1" {
			t.Fatalf("install did not enable the disabled backstop: %q", v)
		}
		if got := tag(t, s.direct("3"), "UPDATE bs_init SET val = 'stale'"); got != "UPDATE 0" {
			t.Fatalf("stale direct write after the repair: %s", got)
		}
	})

	// With --discover=false, a guarded table renamed outside pgfence keeps
	// its backstop, and the rewrite finds it again by it.
	t.Run("renamed without discovery", func(t *testing.T) {
		s.exec(`CREATE TABLE bs_named (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
			INSERT INTO bs_named VALUES (1, 'v', 5)`)
		t.Cleanup(func() { s.exec("DROP TABLE IF EXISTS bs_named, bs_renamed_direct") })
		inst := s.serve(serveOptions{policyOptions: policyOptions{guards: []string{"public.bs_named"}}, backstop: "install"})
		tag(t, s.direct("3"), "ALTER TABLE bs_named RENAME TO bs_renamed_direct")
		inst.reload(bg, inst.opts)
		if g, ok := guarded(inst, "public", "bs_renamed_direct"); !ok || !g.Backstop {
			t.Fatalf("the renamed table after a discovery: %+v %v", g, ok)
		}
		if got := tag(t, s.client(inst, "3"), "UPDATE bs_renamed_direct SET val = 'stale'"); got != "UPDATE 0" {
			t.Fatalf("stale write to the renamed table: %s", got)
		}
		if v := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.bs_renamed_direct",via="rewrite"}`); v != "1" {
			t.Fatalf("rewrite reject on the renamed table = %q, want 1", v)
		}
	})

	t.Run("rediscovery after DDL", func(t *testing.T) { ddlRediscovery(t, s) })
}

func ddlRediscovery(t *testing.T, s *serveTest) {
	{
		inst := s.serve(serveOptions{discover: true, backstop: "install"})
		c := s.client(inst, "7")
		tag(t, c, "CREATE TABLE bs_new (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
		t.Cleanup(func() { s.exec("DROP TABLE IF EXISTS bs_new, bs_renamed, bs_tx") })
		tag(t, c, "INSERT INTO bs_new (id, val) VALUES (1, 'a')")
		if g, ok := guarded(inst, "public", "bs_new"); !ok || !g.Backstop {
			t.Fatalf("the statement after CREATE TABLE ran before bs_new was guarded: %+v %v", g, ok)
		}
		if v, e := s.epoch("bs_new", 1); v != "a" || e != 7 {
			t.Fatalf("fresh INSERT into a new table: %q at %d, want stamped 7", v, e)
		}
		// A rename: the backstop goes with the table at once, and the
		// rewriter knows the new name before the session's next statement.
		stale := s.client(inst, "3")
		tag(t, stale, "ALTER TABLE bs_new RENAME TO bs_renamed")
		if got := tag(t, stale, "UPDATE bs_renamed SET val = 'stale'"); got != "UPDATE 0" {
			t.Fatalf("stale write right after a rename: %s", got)
		}
		if v := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.bs_renamed",via="rewrite"}`); v != "1" {
			t.Fatalf(`rewrite reject on the renamed table = %q, want 1 (the rewriter, not only the backstop, fenced it)`, v)
		}
		if got := tag(t, s.direct("3"), "UPDATE bs_renamed SET val = 'stale'"); got != "UPDATE 0" {
			t.Fatalf("stale write to a renamed table, direct: %s", got)
		}
		// Pipelined: the write sent right behind the RENAME, without
		// waiting for its reply, is still judged with the new name.
		_, fe := pgtest.RawSession(t, inst.Addr())
		fe.Send(&pgproto3.Query{String: "SET fence.token = '3'"})
		fe.Send(&pgproto3.Query{String: "ALTER TABLE bs_renamed RENAME TO bs_piped"})
		fe.Send(&pgproto3.Query{String: "UPDATE bs_piped SET val = 'stale'"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		tags, errs := pgtest.Replies(t, fe, 3)
		if len(errs) > 0 {
			t.Fatalf("pipelined rename and write: %s %s", errs[0].Code, errs[0].Message)
		}
		if len(tags) != 3 || tags[2] != "UPDATE 0" {
			t.Fatalf("pipelined rename and stale write: %q", tags)
		}
		if v := scrape(t, inst, `fencing_reject_total{database="postgres",kind="row",mode="enforce",table="public.bs_piped",via="rewrite"}`); v != "1" {
			t.Fatalf("rewrite reject on the table renamed in the pipeline = %q, want 1", v)
		}
		t.Cleanup(func() { s.exec("DROP TABLE IF EXISTS bs_piped") })
		// DDL in a transaction block is seen once the block commits.
		tx := s.client(inst, "7")
		tag(t, tx, "BEGIN")
		tag(t, tx, "CREATE TABLE bs_tx (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
		tag(t, tx, "INSERT INTO bs_tx (id, val) VALUES (1, 'a')")
		tag(t, tx, "COMMIT")
		tag(t, tx, "SELECT 1")
		if g, ok := guarded(inst, "public", "bs_tx"); !ok || !g.Backstop {
			t.Fatalf("the statement after the COMMIT of CREATE TABLE ran before bs_tx was guarded: %+v %v", g, ok)
		}
	}
}

// TestServeCopyFromExtended: with the backstop, COPY FROM STDIN into a
// guarded table runs unrewritten, sent with the simple protocol or with
// the extended one (as tokio-postgres's copy_in sends it). In the extended
// protocol the server is in copy-in mode right after the Execute, so
// pgfence sends no probe there (it did, and the server ended the session
// with 08P01). The backstop stamps fresh rows and refuses a stale writer
// in a lock domain; the session goes on.
func TestServeCopyFromExtended(t *testing.T) {
	s := newServeTest(t)
	s.exec(`CREATE TABLE cpx_ledger (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)`)
	inst := s.serve(serveOptions{discover: true, discoverInterval: time.Hour, backstop: "install", initDomains: true,
		policyOptions: policyOptions{guards: []string{"cpx_ledger"}, domains: []string{"cpx_ledger=cpx"}}})
	s.exec("UPDATE pgfence.domains SET token = 10 WHERE domain = 'cpx'")
	copyIn := func(tok, rows string) string {
		t.Helper()
		_, fe := pgtest.RawSession(t, inst.Addr())
		fe.Send(&pgproto3.Query{String: "SET fence.token = '" + tok + "'"})
		fe.Send(&pgproto3.Parse{Query: "COPY cpx_ledger (id, val) FROM STDIN"})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.CopyData{Data: []byte(rows)})
		fe.Send(&pgproto3.CopyDone{})
		fe.Send(&pgproto3.Sync{})
		fe.Send(&pgproto3.Query{String: "SELECT 1"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		tags, errs := pgtest.Replies(t, fe, 3)
		var out []string
		for _, e := range errs {
			out = append(out, e.Code)
		}
		return strings.Join(append(out, tags...), " ")
	}
	if got := copyIn("12", "1\tone\n2\ttwo\n"); got != "SET COPY 2 SELECT 1" {
		t.Fatalf("a fresh extended-protocol COPY: %q, want SET COPY 2 SELECT 1", got)
	}
	if _, e := s.epoch("cpx_ledger", 2); e != 12 {
		t.Errorf("a row the COPY wrote has epoch %d, want the token 12", e)
	}
	if got := copyIn("7", "3\tstale\n"); got != "PF001 SET SELECT 1" {
		t.Errorf("a stale extended-protocol COPY into the lock domain: %q, want PF001, and the session going on", got)
	}
	c := s.client(inst, "12")
	if tag, err := c.PgConn().CopyFrom(context.Background(), strings.NewReader("4\tfour\n"), "COPY cpx_ledger (id, val) FROM STDIN"); err != nil || tag.RowsAffected() != 1 {
		t.Errorf("a simple-protocol COPY: %v %v", tag, err)
	}
	var n int
	if err := s.db.QueryRow(context.Background(), "SELECT count(*) FROM cpx_ledger").Scan(&n); err != nil || n != 3 {
		t.Errorf("%d rows (%v), want 3", n, err)
	}
}
