package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runUninstall runs 'pgfence uninstall' with args and returns what it
// printed.
func runUninstall(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"uninstall"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// TestUninstall: 'pgfence uninstall' lists what it would drop and drops
// nothing unless told --yes (--dry-run only lists); a role that may not
// drop all of it drops none of it; with --yes, as a superuser, nothing of
// pgfence's is left in the database (the event triggers, the backstop's
// triggers on a plain and a partitioned table and its partition, the
// schema, its grants and default privileges), the tables and their rows
// stay, and Postgres no longer fences a write. The database is laid out
// as in production: pgfence's schema is its own role's, and a superuser
// ran init once for the event triggers, whose DDL guard would refuse a
// superuser's DROP TRIGGER while it stands.
func TestUninstall(t *testing.T) {
	s := newServeTest(t)
	bg := context.Background()
	s.exec(`CREATE ROLE un_owner LOGIN; CREATE ROLE un_pgfence LOGIN;
		CREATE TABLE un_accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO un_accounts VALUES (1, 'a', 5);
		CREATE TABLE un_events (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE un_events_1 PARTITION OF un_events FOR VALUES FROM (0) TO (100);
		INSERT INTO un_events VALUES (1, 'e', 5);
		ALTER TABLE un_accounts OWNER TO un_owner; ALTER TABLE un_events OWNER TO un_owner; ALTER TABLE un_events_1 OWNER TO un_owner;
		GRANT CREATE ON DATABASE postgres TO un_pgfence; GRANT TRIGGER ON un_accounts, un_events, un_events_1 TO un_pgfence`)
	super := s.pg.URL("postgres")
	pf := strings.Replace(super, "postgres@", "un_pgfence@", 1)
	if out, err := runInit(t, "--upstream", pf); err != nil {
		t.Fatalf("init as pgfence's role: %v\n%s", err, out)
	}
	if out, err := runInit(t, "--upstream", super); err != nil || !strings.Contains(out, "event triggers pgfence_guard_ddl, pgfence_guard_drop and pgfence_guard_rewrite in place") {
		t.Fatalf("init as a superuser: %v\n%s", err, out)
	}
	// What is there: the query that must say "nothing" in the end.
	left := func() string {
		t.Helper()
		var what string
		if err := s.db.QueryRow(bg, `SELECT concat_ws(' | ',
			(SELECT 'event triggers: ' || string_agg(evtname, ',' ORDER BY evtname) FROM pg_catalog.pg_event_trigger),
			(SELECT 'triggers: ' || string_agg(tgrelid::regclass || ' ' || tgname, ',' ORDER BY tgrelid::regclass::text, tgname) FROM pg_catalog.pg_trigger WHERE tgname LIKE '~pgfence%'),
			(SELECT 'schema pgfence' FROM pg_catalog.pg_namespace WHERE nspname = 'pgfence'),
			(SELECT 'default privileges in a schema' FROM pg_catalog.pg_default_acl WHERE defaclnamespace <> 0 LIMIT 1))`).Scan(&what); err != nil {
			t.Fatal(err)
		}
		return what
	}
	installed := left()
	for _, want := range []string{"pgfence_backstop_ddl", "pgfence_guard_ddl", "pgfence_guard_drop", "pgfence_guard_rewrite", "un_accounts ~pgfence_backstop", "un_events_1 ~pgfence_epoch", "schema pgfence", "default privileges"} {
		if !strings.Contains(installed, want) {
			t.Fatalf("before uninstall, %q lacks %q", installed, want)
		}
	}

	// Without --yes (from the environment it does not count): the list,
	// and nothing dropped.
	t.Setenv("PGFENCE_YES", "true")
	for _, args := range [][]string{{"--upstream", super}, {"--upstream", super, "--dry-run"}} {
		out, err := runUninstall(t, args...)
		if dry := len(args) > 2; dry != (err == nil) {
			t.Fatalf("uninstall %q: %v\n%s", args, err, out)
		}
		for _, want := range []string{`DROP EVENT TRIGGER "pgfence_guard_ddl";`, `DROP TRIGGER "~pgfence_backstop" ON public.un_accounts;`,
			`DROP TRIGGER "~pgfence_epoch" ON public.un_events_1;`, `DROP SCHEMA "pgfence" CASCADE;`, "(owner un_pgfence)", "tables: ", "domains", "functions: "} {
			if !strings.Contains(out, want) {
				t.Errorf("uninstall %q does not list %q:\n%s", args, want, out)
			}
		}
		if strings.Contains(out, "un_events_1 ~pgfence_backstop") || strings.Count(out, `DROP TRIGGER "~pgfence_backstop_p`) != 1 {
			t.Errorf("uninstall %q lists the partition's clone of its parent's trigger, or not the parent's:\n%s", args, out)
		}
		if got := left(); got != installed {
			t.Fatalf("uninstall %q dropped something: %q, was %q", args, got, installed)
		}
	}
	// A role that may not drop all of it drops none of it.
	out, err := runUninstall(t, "--upstream", pf, "--yes")
	if err == nil || !strings.Contains(err.Error(), "nothing was dropped") || !strings.Contains(err.Error(), "superuser") {
		t.Fatalf("uninstall as pgfence's role: %v\n%s", err, out)
	}
	if got := left(); got != installed {
		t.Fatalf("a failed uninstall dropped something: %q, was %q", got, installed)
	}

	out, err = runUninstall(t, "--upstream", super, "--yes")
	if err != nil || !strings.Contains(out, `dropped: database "postgres" holds nothing of pgfence's now`) {
		t.Fatalf("uninstall --yes: %v\n%s", err, out)
	}
	t.Logf("uninstall --yes:\n%s", out)
	if got := left(); got != "" {
		t.Fatalf("after uninstall: %s", got)
	}
	// The rows stay, and a write without a token is Postgres's own again.
	if got := tag(t, s.roleConn("un_owner", "postgres"), "UPDATE un_events SET val = 'no token' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("a write without a token after uninstall: %s", got)
	}
	if v, e := s.epoch("un_accounts", 1); v != "a" || e != 5 {
		t.Fatalf("un_accounts after uninstall: %q at %d", v, e)
	}
	if out, err := runUninstall(t, "--upstream", super, "--yes"); err != nil || !strings.Contains(out, "nothing to drop") {
		t.Fatalf("uninstall again: %v\n%s", err, out)
	}
}
