package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// runInit runs 'pgfence init' with args and returns what it printed.
func runInit(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"init"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// roleConn connects straight to Postgres as role, to database db.
func (s *serveTest) roleConn(role, db string) *pgx.Conn {
	s.t.Helper()
	url := strings.Replace(s.pg.URL(db), "postgres@", role+"@", 1)
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestLeastPrivilege runs pgfence with exactly the privileges
// docs/backstop.md lists, against a database laid out as a careful team
// has it: the tables owned by a role of their own (lp_owner), written by
// an application role with DML grants only (lp_app), and a role for
// pgfence (lp_pgfence).
//
//   - Without a grant, 'pgfence init' (reading serve's --config file)
//     prints each problem once and the GRANT statements that fix them,
//     each once; the test runs exactly those.
//   - Then init installs the backstop on every table, partitions
//     included, with CREATE on the database and TRIGGER on the tables
//     (no ownership, no SELECT), and serve with those privileges is
//     ready and fences lp_app's stale writes, through pgfence and straight
//     to Postgres.
//   - A superuser runs init once more, with the same flags: the event
//     triggers are in place, the owner can no longer switch the backstop
//     off, and a table the owner creates with the epoch column gets the
//     backstop at once (with TRIGGER on the owner's future tables, by
//     default privileges).
//   - In another database, a schema pgfence created for lp_pgfence
//     stands for the CREATE privilege on the database.
func TestLeastPrivilege(t *testing.T) {
	s := newServeTest(t)
	bg := context.Background()
	s.exec(`CREATE ROLE lp_owner LOGIN; CREATE ROLE lp_app LOGIN; CREATE ROLE lp_pgfence LOGIN;
		CREATE TABLE lp_accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO lp_accounts VALUES (1, 'a', 5);
		CREATE TABLE lp_events (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE lp_events_1 PARTITION OF lp_events FOR VALUES FROM (0) TO (100);
		INSERT INTO lp_events VALUES (1, 'e', 5);
		ALTER TABLE lp_accounts OWNER TO lp_owner; ALTER TABLE lp_events OWNER TO lp_owner; ALTER TABLE lp_events_1 OWNER TO lp_owner;
		GRANT USAGE, CREATE ON SCHEMA public TO lp_owner;
		GRANT SELECT, INSERT, UPDATE, DELETE ON lp_accounts, lp_events TO lp_app`)
	pfURL := strings.Replace(s.pg.URL("postgres"), "postgres@", "lp_pgfence@", 1)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "pgfence.yaml")
	// serve's file, with keys init has no use for.
	if err := os.WriteFile(cfg, []byte("upstream: "+pfURL+"\nlisten: 127.0.0.1:0\nmetrics-listen: 127.0.0.1:0\ndiscover-interval: 1h\nbackstop: install\nguard:\n  - lp_accounts\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	out, err := runInit(t, "--config", cfg)
	if err == nil {
		t.Fatalf("init without privileges worked:\n%s", out)
	}
	t.Logf("init without privileges:\n%s", out)
	grants := []string{
		`GRANT CREATE ON DATABASE "postgres" TO "lp_pgfence";`,
		`GRANT TRIGGER ON TABLE "public"."lp_accounts" TO "lp_pgfence";`,
		`GRANT TRIGGER ON TABLE "public"."lp_events" TO "lp_pgfence";`,
		`GRANT TRIGGER ON TABLE "public"."lp_events_1" TO "lp_pgfence";`,
	}
	for _, g := range grants {
		if n := strings.Count(out, g); n != 1 {
			t.Errorf("init printed %q %d times, want once", g, n)
		}
	}
	if n := strings.Count(out, "permission denied for database"); n != 1 {
		t.Errorf(`init said "permission denied for database" %d times, want once`, n)
	}
	// A table's problem is on its own line, not again among the others.
	if strings.Contains(out, "problem: backstop: ") {
		t.Errorf("init said a table's problem twice:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l] {
			t.Errorf("init printed a line twice: %q", l)
		}
		seen[l] = true
	}
	if last := lines[len(lines)-1]; strings.Contains(last, "permission denied") {
		t.Errorf("init ends with a bare error: %q", last)
	}
	// The statements it printed are what it needs: run them as printed.
	ran := 0
	for _, l := range lines {
		if g, ok := strings.CutPrefix(strings.TrimSpace(l), "GRANT "); ok {
			g, _, _ = strings.Cut(g, "--")
			s.exec("GRANT " + g)
			ran++
		}
	}
	if ran != len(grants) {
		t.Fatalf("init printed %d GRANT statements, want %d:\n%s", ran, len(grants), out)
	}

	// With them, and nothing else.
	out, err = runInit(t, "--config", cfg)
	if err != nil {
		t.Fatalf("init with the printed grants: %v\n%s", err, out)
	}
	for _, want := range []string{"public.lp_accounts: backstop created", "public.lp_events: backstop created", "configuration recorded"} {
		if !strings.Contains(out, want) {
			t.Errorf("init said nothing of %q:\n%s", want, out)
		}
	}
	var priv string
	if err := s.db.QueryRow(bg, `SELECT string_agg(c.relname || ':' || pg_catalog.array_to_string(ARRAY(
			SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER']) p
			WHERE pg_catalog.has_table_privilege('lp_pgfence', c.oid, p)), ','), ' ' ORDER BY c.relname)
		FROM pg_catalog.pg_class c WHERE c.relname IN ('lp_accounts', 'lp_events', 'lp_events_1')`).Scan(&priv); err != nil {
		t.Fatal(err)
	}
	if priv != "lp_accounts:TRIGGER lp_events:TRIGGER lp_events_1:TRIGGER" {
		t.Fatalf("lp_pgfence's privileges on the tables: %s, want TRIGGER alone", priv)
	}
	inst := s.serve(serveOptions{upstream: pfURL, discover: true, backstop: "install"})
	for _, table := range []string{"public.lp_accounts", "public.lp_events", "public.lp_events_1"} {
		if v := scrape(t, inst, `pgfence_backstop_installed{database="postgres",table="`+table+`"}`); v != "1" {
			t.Errorf("pgfence_backstop_installed{table=%q} = %q, want 1", table, v)
		}
	}
	if code, body := readyz(t, inst); code != 200 || !strings.Contains(body, "(owner lp_owner)") {
		t.Fatalf("/readyz with the least privileges: %d %q", code, body)
	}
	app := func(tok string) *pgx.Conn { // lp_app through pgfence
		c, err := pgx.Connect(bg, "postgres://lp_app@"+inst.Addr()+"/postgres?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(bg) })
		tag(t, c, "SET fence.token = '"+tok+"'")
		return c
	}
	direct := s.roleConn("lp_app", "postgres")
	tag(t, direct, "SET fence.token = '4'")
	for _, c := range []struct {
		conn *pgx.Conn
		sql  string
		want string
	}{
		{app("3"), "UPDATE lp_accounts SET val = 'stale' WHERE id = 1", "UPDATE 0"},
		{app("6"), "UPDATE lp_accounts SET val = 'b' WHERE id = 1", "UPDATE 1"},
		{direct, "UPDATE lp_accounts SET val = 'stale direct' WHERE id = 1", "UPDATE 0"},
		{direct, "DELETE FROM lp_events WHERE id = 1", "DELETE 0"},
		{app("7"), "INSERT INTO lp_events (id, val) VALUES (2, 'f')", "INSERT 0 1"},
	} {
		if got := tag(t, c.conn, c.sql); got != c.want {
			t.Errorf("%s: %s, want %s", c.sql, got, c.want)
		}
	}
	if v, e := s.epoch("lp_accounts", 1); v != "b" || e != 6 {
		t.Fatalf("lp_accounts row 1: %q at %d, want b at 6", v, e)
	}

	// Without the event triggers the owner can switch the backstop off.
	owner := s.roleConn("lp_owner", "postgres")
	tag(t, owner, `ALTER TABLE lp_accounts DISABLE TRIGGER "~pgfence_backstop"`)
	tag(t, owner, `ALTER TABLE lp_accounts ENABLE TRIGGER "~pgfence_backstop"`)
	// A superuser runs init once, with the same flags; the owner's future
	// tables get TRIGGER for pgfence's role by default privileges.
	s.exec(`ALTER DEFAULT PRIVILEGES FOR ROLE lp_owner IN SCHEMA public GRANT TRIGGER ON TABLES TO lp_pgfence`)
	out, err = runInit(t, "--config", cfg, "--upstream", s.pg.URL("postgres"))
	if err != nil || !strings.Contains(out, "event triggers pgfence_guard_ddl, pgfence_guard_drop and pgfence_guard_rewrite in place") {
		t.Fatalf("init as a superuser: %v\n%s", err, out)
	}
	_, err = owner.Exec(bg, `ALTER TABLE lp_accounts DISABLE TRIGGER "~pgfence_backstop"`)
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("the owner disabling the backstop under the DDL guard: %v, want SQLSTATE 42501", err)
	}
	tag(t, owner, "CREATE TABLE lp_new (id int PRIMARY KEY, fence_epoch bigint NOT NULL DEFAULT 0)")
	var triggers string
	if err := s.db.QueryRow(bg, `SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_catalog.pg_trigger WHERE tgrelid = 'lp_new'::regclass`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != "~pgfence_backstop,~pgfence_backstop_truncate,~pgfence_epoch" {
		t.Fatalf("a table the owner created got triggers %q, want the backstop's", triggers)
	}
	inst.reload(bg, inst.opts)
	if code, body := readyz(t, inst); code != 200 || strings.Contains(body, "(owner lp_owner)") {
		t.Fatalf("/readyz once the DDL guard is in place: %d %q", code, body)
	}

	// In another database, a schema created for pgfence's role instead of
	// the CREATE privilege on the database.
	s.exec("CREATE DATABASE lp_other")
	other, err := pgx.Connect(bg, s.pg.URL("lp_other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(bg)
	if _, err := other.Exec(bg, `CREATE TABLE lp_accounts (id int PRIMARY KEY, fence_epoch bigint NOT NULL DEFAULT 0);
		ALTER TABLE lp_accounts OWNER TO lp_owner; GRANT TRIGGER ON lp_accounts TO lp_pgfence;
		CREATE SCHEMA pgfence AUTHORIZATION lp_pgfence`); err != nil {
		t.Fatal(err)
	}
	out, err = runInit(t, "--config", cfg, "--upstream", strings.Replace(pfURL, "/postgres", "/lp_other", 1))
	if err != nil || !strings.Contains(out, "public.lp_accounts: backstop created") {
		t.Fatalf("init with a schema made for pgfence's role: %v\n%s", err, out)
	}

	// A key neither serve nor init has is an error still.
	if err := os.WriteFile(cfg, []byte("upstream: "+pfURL+"\nlisen: 127.0.0.1:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runInit(t, "--config", cfg); err == nil || !strings.Contains(err.Error(), `unknown key "lisen"`) {
		t.Fatalf("init with a misspelt key: %v\n%s", err, out)
	}
}

// TestServeOwnSQLIgnoresPlantedOperators: pgfence's own SQL, run as its
// role (here a superuser) in a database clients use, must not run an
// application role's code. An operator in public whose argument types are
// exactly those of an expression pgfence compares is a better match than
// a pg_catalog one that needs a cast (~(name, name) against pg_catalog's
// ~(name, text), =(oid, regclass) against =(oid, oid), =(oid, int4) for
// "oid = 0"), and so are unnest and array_agg of exactly text (pg_catalog's
// are polymorphic). So the application plants, in public, every operator
// pgfence's SQL could name (comparisons, pattern matches, ||) for every
// pair of the catalogs' types that pg_catalog lacks exactly, with those
// two functions; each records the role it ran as when that is not the
// application's (a sequence too, which a failed query does not roll
// back). Then discovery, init, the backstop's install, verify, mend and
// counters, lock domains, a partitioned table and a partition made through
// pgfence, fresh and stale writes, a read after DDL, a fresh and a stale
// write that fire the backstop's trigger as a superuser, and uninstall run, straight
// to Postgres (where pgfence sets its search_path) and behind a
// transaction pooler (where it cannot, and its queries' own types stand
// alone); no plant may run, and the stale writes must still be refused.
func TestServeOwnSQLIgnoresPlantedOperators(t *testing.T) {
	s := newServeTest(t)
	s.exec(`DROP ROLE IF EXISTS plant_app; CREATE ROLE plant_app LOGIN; GRANT CREATE ON SCHEMA public TO plant_app`)
	app := s.roleConn("plant_app", "postgres")
	for _, sql := range []string{
		`CREATE TABLE public.planted (who text, what text)`,
		`GRANT INSERT ON public.planted TO PUBLIC`,
		`CREATE SEQUENCE public.planted_seq`,
		`GRANT USAGE ON SEQUENCE public.planted_seq TO PUBLIC`,
		`CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO public.planted VALUES (current_user, 'unnest'); RETURN QUERY SELECT pg_catalog.unnest($1); END $$`,
		`CREATE FUNCTION public.plant_acc(text[], text) RETURNS text[] LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO public.planted VALUES (current_user, 'array_agg'); RETURN $1 || $2; END $$`,
		`CREATE AGGREGATE public.array_agg(text) (SFUNC = public.plant_acc, STYPE = text[])`,
		plantOperators,
	} {
		if _, err := app.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var planted int
	if err := app.QueryRow(context.Background(), "SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_operator WHERE oprnamespace OPERATOR(pg_catalog.=) 'public'::regnamespace::oid").Scan(&planted); err != nil {
		t.Fatal(err)
	}
	t.Logf("planted %d operators", planted)

	s.exec(`CREATE TABLE plant_t (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO plant_t VALUES (1, 'a', 5);
		CREATE TABLE plant_p (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE plant_p1 PARTITION OF plant_p FOR VALUES FROM (0) TO (100); INSERT INTO plant_p VALUES (1, 'a', 5);
		GRANT ALL ON plant_t, plant_p, plant_p1 TO plant_app`)
	for _, c := range []struct {
		name     string
		upstream func() string
		pooling  string
	}{
		{"direct", func() string { return s.pg.URL("postgres") }, poolingNone},
		{"transaction pooler", func() string {
			return "postgres://postgres@" + s.bouncer("transaction").Addr() + "/postgres?sslmode=disable"
		}, poolingTransaction},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := c.upstream()
			flags := []string{"--upstream", up, "--upstream-pooling", c.pooling, "--discover", "--domain", "plant_t=plant_d"}
			if out, err := runInit(t, flags...); err != nil {
				t.Fatalf("init: %v\n%s", err, out)
			}
			inst := s.serve(serveOptions{upstream: up, upstreamPooling: c.pooling, discover: true, discoverInterval: time.Hour,
				backstop: "install", policyOptions: policyOptions{domains: []string{"plant_t=plant_d"}}})
			fresh, stale := s.client(inst, "7"), s.client(inst, "6")
			tag(t, fresh, "UPDATE plant_t SET val = 'b' WHERE id = 1")
			tag(t, fresh, "UPDATE plant_p SET val = 'b' WHERE id = 1")
			tag(t, fresh, "CREATE TABLE IF NOT EXISTS plant_p2 PARTITION OF plant_p FOR VALUES FROM (100) TO (200)")
			tag(t, fresh, "INSERT INTO plant_p (id, val) VALUES (150, 'c') ON CONFLICT DO NOTHING")
			for _, sql := range []string{"UPDATE plant_t SET val = 'x' WHERE id = 1", "UPDATE plant_p SET val = 'x' WHERE id = 1"} {
				if got := tag(t, stale, sql); got != "UPDATE 0" {
					t.Errorf("stale %s: %s, want UPDATE 0", sql, got)
				}
			}
			tag(t, fresh, "ALTER TABLE plant_t ADD COLUMN IF NOT EXISTS note text") // has the catalog read again
			tag(t, fresh, "SELECT 1")
			inst.reload(context.Background(), inst.options()) // verify and mend once more, and read the counters
			// The backstop's trigger runs as whoever writes, here a
			// superuser straight to Postgres.
			tag(t, s.direct("8"), "UPDATE plant_t SET val = 'd' WHERE id = 1")
			if got := tag(t, s.direct("1"), "UPDATE plant_p SET val = 'e' WHERE id = 1"); got != "UPDATE 0" {
				t.Errorf("stale direct UPDATE plant_p: %s, want UPDATE 0", got)
			}
			if out, err := runUninstall(t, "--upstream", up, "--upstream-pooling", c.pooling, "--yes"); err != nil {
				t.Fatalf("uninstall: %v\n%s", err, out)
			}
			rows, err := s.db.Query(context.Background(), "SELECT who, what FROM public.planted")
			if err != nil {
				t.Fatal(err)
			}
			ran, err := pgx.CollectRows(rows, pgx.RowTo[[2]string])
			if err != nil {
				t.Fatal(err)
			}
			if len(ran) > 0 {
				t.Errorf("an application's objects ran as another role in pgfence's own SQL: %v", ran)
			}
			var calls int64
			if err := s.db.QueryRow(context.Background(), "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.planted_seq").Scan(&calls); err != nil {
				t.Fatal(err)
			}
			if calls > 0 {
				t.Errorf("an application's operators ran %d times as another role (in queries that then failed)", calls)
			}
		})
	}
}

// plantOperators plants, in public, every operator pgfence's SQL could
// name, for every pair of the catalogs' types that pg_catalog has no such
// operator of exactly (see TestServeOwnSQLIgnoresPlantedOperators). Each
// computes what pg_catalog's would, and records a role other than
// plant_app that runs it. Everything in it is qualified: its functions
// run with the caller's search_path, where they are planted.
const plantOperators = `DO $plant$
DECLARE
  l text; r text; op text; n int := 0; res text;
  types text[] := ARRAY['name', 'text', '"char"', 'oid', 'regclass', 'regproc', 'regtype', 'regrole', 'regnamespace',
    'int2', 'int4', 'int8', 'bool', 'bpchar', 'varchar', 'text[]', 'name[]', 'oid[]', 'int2vector', 'oidvector',
    'xid', 'bytea', 'timestamptz', 'numeric', 'pg_node_tree', 'aclitem[]'];
BEGIN
  FOREACH op IN ARRAY ARRAY['=', '<>', '<', '>', '<=', '>=', '~', '!~', '~~', '!~~', '~*', '!~*', '||'] LOOP
    FOREACH l IN ARRAY types LOOP
      FOREACH r IN ARRAY types LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_operator o WHERE o.oprname OPERATOR(pg_catalog.=) op::pg_catalog.name
          AND o.oprleft OPERATOR(pg_catalog.=) l::pg_catalog.regtype::pg_catalog.oid
          AND o.oprright OPERATOR(pg_catalog.=) r::pg_catalog.regtype::pg_catalog.oid
          AND o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid);
        n := n OPERATOR(pg_catalog.+) 1;
        res := CASE WHEN op OPERATOR(pg_catalog.=) '||' THEN 'pg_catalog.text' ELSE 'pg_catalog.bool' END;
        EXECUTE pg_catalog.format($f$CREATE FUNCTION public.plant_op_%s(%s, %s) RETURNS %s LANGUAGE plpgsql AS $b$
          BEGIN
            IF CURRENT_USER::pg_catalog.text OPERATOR(pg_catalog.<>) 'plant_app' THEN
              PERFORM pg_catalog.nextval('public.planted_seq'::pg_catalog.regclass);
              INSERT INTO public.planted VALUES (CURRENT_USER::pg_catalog.text, %L);
            END IF;
            RETURN $1 OPERATOR(pg_catalog.%s) $2;
          END $b$$f$, n, l, r, res, pg_catalog.format('%s(%s, %s)', op, l, r), op);
        EXECUTE pg_catalog.format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.plant_op_%s)', op, l, r, n);
      END LOOP;
    END LOOP;
  END LOOP;
END $plant$`
