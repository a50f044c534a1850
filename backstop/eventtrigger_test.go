package backstop_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// With discovery on, Install keeps an event trigger that puts the backstop
// on a table the moment DDL gives it the epoch column, on any connection:
// no window until the next discovery. A DDL the event trigger cannot
// serve still succeeds, with a warning.
func TestEventTrigger(t *testing.T) {
	db := pgtest.Direct(t)
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		pgtest.Exec(t, c, "DROP EVENT TRIGGER IF EXISTS "+backstop.EventTrigger)
		pgtest.Exec(t, c, "DELETE FROM pgfence.ddl_backstop")
	})
	discovered := sqlrewrite.Guard{Column: "fence_epoch"}
	r, err := backstop.Reconcile(ctx, db, nil, backstop.Options{Discovered: &discovered, Replace: true}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	if !r.WatchingDDL || r.NotWatchingDDL != "" {
		t.Fatalf("event trigger after Install as a superuser: %v %q", r.WatchingDDL, r.NotWatchingDDL)
	}

	created := tableName(t, "_created")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+created) })
	pgtest.Exec(t, db, "CREATE TABLE "+created+" (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	fresh, stale := session(t, "7"), session(t, "3")
	pgtest.Exec(t, fresh, "INSERT INTO "+created+" (id, val) VALUES (1, 'fresh')")
	if tag := pgtest.Exec(t, stale, "UPDATE "+created+" SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale write to a table created outside pgfence: %s", tag)
	}
	if _, err := stale.Exec(ctx, "TRUNCATE "+created); code(err) != "0A000" {
		t.Fatalf("TRUNCATE of a table created outside pgfence: %v", err)
	}

	// A table that gets the column later.
	altered := tableName(t, "_altered")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+altered) })
	pgtest.Exec(t, db, "CREATE TABLE "+altered+" (id int PRIMARY KEY, val text); INSERT INTO "+altered+" VALUES (1, 'a')")
	if tag := pgtest.Exec(t, stale, "UPDATE "+altered+" SET val = 'b'"); tag != "UPDATE 1" {
		t.Fatalf("a table without the epoch column is not guarded: %s", tag)
	}
	pgtest.Exec(t, db, "ALTER TABLE "+altered+" ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0")
	pgtest.Exec(t, fresh, "UPDATE "+altered+" SET val = 'fresh'")
	if tag := pgtest.Exec(t, stale, "UPDATE "+altered+" SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale write to a table that got the epoch column outside pgfence: %s", tag)
	}

	// The next Reconcile takes the tables over as they are.
	g := func(n string) sqlrewrite.Guard {
		return sqlrewrite.Guard{Schema: "public", Table: n, Column: "fence_epoch"}
	}
	r = installGuards(t, backstop.Options{Discovered: &discovered}, g(created), g(altered))
	for _, tb := range r.Tables {
		if strings.Contains(tb.Changed, "created") || strings.Contains(tb.Changed, "updated") {
			t.Fatalf("Reconcile replaced the event trigger's work on %s: %s", tb.Guard.Name(), tb.Changed)
		}
	}

	// The event trigger failing must not fail the DDL.
	pgtest.Exec(t, db, "UPDATE pgfence.ddl_backstop SET row_function = 'no_such_function'")
	var warnings []string
	cfg := db.Config().Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { warnings = append(warnings, n.Message) }
	warned := tableName(t, "_warned")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+warned) })
	c, err := pgconn.ConnectConfig(ctx, &cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE TABLE "+warned+" (id int, fence_epoch bigint NOT NULL DEFAULT 0)").ReadAll(); err != nil {
		t.Fatalf("a DDL the event trigger cannot serve failed: %v", err)
	}
	if len(warnings) == 0 || !strings.Contains(warnings[0], "could not put the backstop on table") {
		t.Fatalf("warnings: %q", warnings)
	}
}

// A pgfence role that is not a superuser cannot create the event trigger:
// Install says so, and why it matters, and the rest is installed.
func TestEventTriggerNeedsSuperuser(t *testing.T) {
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	pf := newRole(t, baseName(t)+"_pf", "")
	pgtest.Exec(t, db, "GRANT postgres TO "+pf) // owns pgfence's objects, not a superuser
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		pgtest.Exec(t, c, "DROP EVENT TRIGGER IF EXISTS "+backstop.EventTrigger)
		pgtest.Exec(t, c, "DELETE FROM pgfence.ddl_backstop")
	})
	discovered := sqlrewrite.Guard{Column: "fence_epoch"}
	r, err := backstop.Reconcile(ctx, pgtest.Connect(t, roleURL(pf)), nil, backstop.Options{Discovered: &discovered, Replace: true}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	if r.WatchingDDL || !strings.Contains(r.NotWatchingDDL, "not a superuser") || !strings.Contains(r.NotWatchingDDL, "next read of the catalog") {
		t.Fatalf("Install as a role that is not a superuser: %v %q", r.WatchingDDL, r.NotWatchingDDL)
	}
}

// A role that may not read pgfence's configuration still runs its DDL.
func TestEventTriggerNeverFailsDDL(t *testing.T) {
	db := pgtest.Direct(t)
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		pgtest.Exec(t, c, "GRANT USAGE ON SCHEMA pgfence TO PUBLIC")
		pgtest.Exec(t, c, "DROP EVENT TRIGGER IF EXISTS "+backstop.EventTrigger)
		pgtest.Exec(t, c, "DELETE FROM pgfence.ddl_backstop")
	})
	discovered := sqlrewrite.Guard{Column: "fence_epoch"}
	if _, err := backstop.Reconcile(ctx, db, nil, backstop.Options{Discovered: &discovered, Replace: true}, backstop.Install); err != nil {
		t.Fatal(err)
	}
	app := newRole(t, baseName(t)+"_app", "")
	pgtest.Exec(t, db, "GRANT CREATE ON SCHEMA public TO "+app)
	pgtest.Exec(t, db, "REVOKE USAGE ON SCHEMA pgfence FROM PUBLIC")
	c := pgtest.Connect(t, roleURL(app))
	name := tableName(t, "")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+name) })
	if _, err := c.Exec(ctx, "CREATE TABLE "+name+" (id int, fence_epoch bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatalf("DDL by a role that cannot reach pgfence's schema: %v", err)
	}
}
