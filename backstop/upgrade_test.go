package backstop_test

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/backstop/testdata/v258923c"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// functionExists reports whether pgfence.<name>() exists (in the database
// of c, the package's Postgres's postgres without).
func functionExists(t *testing.T, name string, c ...*pgx.Conn) bool {
	t.Helper()
	db := pgtest.Direct(t)
	if len(c) > 0 {
		db = c[0]
	}
	var ok bool
	if err := db.QueryRow(ctx, "SELECT pg_catalog.to_regprocedure('pgfence.' || pg_catalog.quote_ident($1) || '()') IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// dropWatch drops the DDL watch's event trigger when the test ends: the
// other tests' tables are theirs to fence.
func dropWatch(t *testing.T) {
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		pgtest.Exec(t, c, "DROP EVENT TRIGGER IF EXISTS "+backstop.EventTrigger)
		pgtest.Exec(t, c, "DELETE FROM pgfence.ddl_backstop")
	})
}

// TestDropsUnusedFunctions: each configuration change leaves the last
// configuration's trigger function behind; Install drops one once no
// trigger runs it, and keeps those a trigger, the recorded configuration
// of a table, or the DDL watch still names.
func TestDropsUnusedFunctions(t *testing.T) {
	a, b := guarded(t, tableName(t, "_a"), [3]any{1, "v", 5}), guarded(t, tableName(t, "_b"), [3]any{1, "v", 5})
	dropWatch(t)
	// An exempt role of the test's own makes its functions its own.
	o := backstop.Options{ExemptRoles: []string{newRole(t, tableName(t, "_mig"), "")}}
	enforce := func(tb string) sqlrewrite.Guard { return guardOf("public", tb) }
	shadow := func(tb string) sqlrewrite.Guard { g := guardOf("public", tb); g.Rollout = sqlrewrite.Shadow; return g }
	fEnforce, _ := backstop.RowFunction(enforce(a), o)
	fShadow, _ := backstop.RowFunction(shadow(a), o)
	installGuards(t, o, enforce(a), enforce(b))
	// a to shadow: b still runs the enforcing function.
	r := installGuards(t, o, shadow(a), enforce(b))
	if !functionExists(t, fEnforce.Name) || slices.Contains(r.DroppedFunctions, fEnforce.Name) {
		t.Fatalf("%s, which b's trigger runs, was dropped (%q)", fEnforce.Name, r.DroppedFunctions)
	}
	// b to shadow too: no trigger runs it any more.
	r = installGuards(t, o, shadow(a), shadow(b))
	if functionExists(t, fEnforce.Name) || !slices.Contains(r.DroppedFunctions, fEnforce.Name) {
		t.Fatalf("%s, which no trigger runs any more, is still there (dropped %q)", fEnforce.Name, r.DroppedFunctions)
	}
	if !functionExists(t, fShadow.Name) {
		t.Fatalf("%s, which both tables run, was dropped", fShadow.Name)
	}
	// The DDL watch's function stays though no trigger runs it yet, also
	// for an instance without discovery.
	discovered := sqlrewrite.Guard{Column: "fence_epoch", Rollout: sqlrewrite.Enforce}
	od := o
	od.Discovered = &discovered
	fDiscovered, _ := backstop.RowFunction(discovered, od)
	installGuards(t, od, shadow(a), shadow(b))
	r = installGuards(t, o, shadow(a), shadow(b))
	if !functionExists(t, fDiscovered.Name) || slices.Contains(r.DroppedFunctions, fDiscovered.Name) {
		t.Fatalf("%s, the DDL watch's, was dropped (%q)", fDiscovered.Name, r.DroppedFunctions)
	}
}

// TestUpgrade: a database whose backstop the previous version (258923c,
// before 0.1.0) installed, with its event trigger, is brought up to date
// by the current Reconcile, as a newer pgfence's first read does: the
// setup mark says the helpers are another version's, so they are set up
// again; every table's triggers run the current functions, and those of
// the previous version's the current one does not want are dropped; a
// partitioned table's row trigger, named as a plain table's then, gets
// its own name; the epoch column is tied; the reject counters go on; the
// configuration is recorded with no difference from the same flags; and
// the fence holds throughout, on every path.
func TestUpgrade(t *testing.T) {
	admin := pgtest.Direct(t)
	exec(t, admin, "DROP DATABASE IF EXISTS pgfence_upgrade")
	exec(t, admin, "CREATE DATABASE pgfence_upgrade")
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "DROP DATABASE IF EXISTS pgfence_upgrade WITH (FORCE)") })
	url := pgtest.Server().URL("pgfence_upgrade")
	db := pgtest.Connect(t, url)
	exec(t, db, `CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts VALUES (1, 'a', 5);
		CREATE TABLE events (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (0) TO (100);
		INSERT INTO events VALUES (1, 'e', 5)`)
	guards := []sqlrewrite.Guard{guardOf("public", "accounts"), guardOf("public", "events"), guardOf("public", "events_1")}
	discovered := sqlrewrite.Guard{Column: "fence_epoch"}

	// The previous version installs.
	old, err := v258923c.Reconcile(ctx, db, guards, v258923c.Options{Discovered: &discovered}, v258923c.Install)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range old.Tables {
		if !tb.OK {
			t.Fatalf("the previous version's install: %s: %s", tb.Guard.Name(), tb.Problem)
		}
	}
	triggers := func() string {
		t.Helper()
		var s string
		if err := db.QueryRow(ctx, `SELECT string_agg(c.relname || ' ' || t.tgname || CASE WHEN t.tgparentid <> 0 THEN ' (clone)' ELSE '' END, ', ' ORDER BY c.relname, t.tgname)
			FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
			WHERE c.relname IN ('accounts', 'events', 'events_1') AND (NOT t.tgisinternal OR t.tgparentid <> 0)`).Scan(&s); err != nil { // clones are internal up to 14
			t.Fatal(err)
		}
		return s
	}
	if got, want := triggers(), "accounts ~pgfence_backstop, accounts ~pgfence_backstop_truncate, events ~pgfence_backstop, events ~pgfence_backstop_truncate, "+
		"events_1 ~pgfence_backstop (clone), events_1 ~pgfence_backstop_truncate"; got != want {
		t.Fatalf("the previous version's triggers:\n%s\nwant\n%s", got, want)
	}
	var oldFunctions []string
	for _, g := range guards {
		f, _ := v258923c.RowFunction(g, v258923c.Options{})
		oldFunctions = append(oldFunctions, f.Name)
	}
	tf, _ := v258923c.TruncateFunction(v258923c.Options{})
	oldFunctions = append(oldFunctions, tf.Name)
	for _, f := range oldFunctions {
		if !functionExists(t, f, db) {
			t.Fatalf("the previous version's function %s is not there", f)
		}
	}
	direct := func(tok string) *pgx.Conn {
		c := pgtest.Connect(t, url)
		exec(t, c, "SET fence.token = '"+tok+"'")
		return c
	}
	stale := func(when string) {
		t.Helper()
		c := direct("3")
		for _, sql := range []string{"UPDATE accounts SET val = 'stale' WHERE id = 1", "UPDATE events SET val = 'stale' WHERE id = 1", "DELETE FROM events_1 WHERE id = 1"} {
			if tag := exec(t, c, sql); !strings.HasSuffix(tag, " 0") {
				t.Fatalf("%s: a stale write landed: %s: %s", when, sql, tag)
			}
		}
	}
	stale("under the previous version's backstop")

	// The current version reads it as another version's.
	r, err := backstop.Reconcile(ctx, db, guards, backstop.Options{Discovered: &discovered}, backstop.Verify)
	if err != nil {
		t.Fatal(err)
	}
	if r.SetUp || r.Missing() != len(guards) {
		t.Fatalf("Verify of the previous version's backstop: set up %v, %d of %d tables missing", r.SetUp, r.Missing(), len(guards))
	}

	// And installs over it.
	r, err = backstop.Reconcile(ctx, db, guards, backstop.Options{Discovered: &discovered}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	var eventsOID uint32
	if err := db.QueryRow(ctx, "SELECT 'events'::regclass::oid").Scan(&eventsOID); err != nil {
		t.Fatal(err)
	}
	partitioned := "~pgfence_backstop_p" + strconv.FormatUint(uint64(eventsOID), 10)
	for _, tb := range r.Tables {
		if !tb.OK {
			t.Fatalf("after the upgrade: %s: %s", tb.Guard.Name(), tb.Problem)
		}
		if tb.Guard.Table == "events" && !strings.Contains(tb.Changed, "renamed "+partitioned) {
			t.Errorf("events: %q, want the row trigger renamed %s", tb.Changed, partitioned)
		}
	}
	if got, want := triggers(), "accounts ~pgfence_backstop, accounts ~pgfence_backstop_truncate, accounts ~pgfence_epoch, "+
		"events "+partitioned+", events ~pgfence_backstop_truncate, events ~pgfence_epoch, "+
		"events_1 "+partitioned+" (clone), events_1 ~pgfence_backstop_truncate, events_1 ~pgfence_epoch"; got != want {
		t.Fatalf("triggers after the upgrade:\n%s\nwant\n%s", got, want)
	}
	// The previous version's functions that this one does not want are
	// gone. (258923c's bodies are this version's, so none here: see
	// TestUpgradeBodies.)
	current := map[string]bool{}
	for _, g := range guards {
		f, _ := backstop.RowFunction(g, backstop.Options{})
		current[f.Name] = true
	}
	tfNow, _ := backstop.TruncateFunction(backstop.Options{})
	current[tfNow.Name] = true
	for _, f := range oldFunctions {
		if there := functionExists(t, f, db); there != current[f] {
			t.Errorf("the previous version's function %s: there %v, wanted by this version %v (dropped: %q)", f, there, current[f], r.DroppedFunctions)
		}
	}
	if len(r.Differences) > 0 {
		t.Errorf("after the upgrade, with the same flags: differences %q", r.Differences)
	}
	if !r.GuardingDDL || !r.WatchingDDL || !r.Recorded {
		t.Fatalf("after the upgrade: guarding DDL %v (%s), watching DDL %v (%s), recorded %v", r.GuardingDDL, r.NotGuardingDDL, r.WatchingDDL, r.NotWatchingDDL, r.Recorded)
	}
	var rollout *string
	if err := db.QueryRow(ctx, "SELECT rollout FROM pgfence.ddl_backstop").Scan(&rollout); err != nil || rollout == nil || *rollout != "enforce" {
		t.Fatalf("the DDL watch's recorded rollout after the upgrade: %v %v, want enforce", rollout, err)
	}
	r, err = backstop.Reconcile(ctx, db, guards, backstop.Options{Discovered: &discovered}, backstop.Verify)
	if err != nil || !r.SetUp || r.Missing() != 0 {
		t.Fatalf("Verify after the upgrade: %v, set up %v, %d missing", err, r.SetUp, r.Missing())
	}

	// The fence holds, the counters went on, and a newer holder writes.
	stale("after the upgrade")
	counts, err := backstop.ReadCounts(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Rejects["public.accounts"] != 2 || counts.Rejects["public.events_1"] != 4 {
		t.Errorf("reject counters after the upgrade: %v, want accounts 2 and events_1 4 (each stale row, before and after)", counts.Rejects)
	}
	if tag := exec(t, direct("6"), "UPDATE events SET val = 'new' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("a newer holder's write: %s", tag)
	}
	// The current DDL watch puts the current backstop on a new table.
	exec(t, db, "CREATE TABLE later (id int PRIMARY KEY, fence_epoch bigint NOT NULL DEFAULT 0)")
	r, err = backstop.Reconcile(ctx, db, []sqlrewrite.Guard{guardOf("public", "later")}, backstop.Options{Discovered: &discovered}, backstop.Verify)
	if err != nil || r.Missing() != 0 {
		t.Fatalf("a table created after the upgrade: %v %+v", err, r.Tables)
	}
}

// TestUpgradeBodies: a newer version whose trigger function bodies differ
// for the same configuration (so their names do) moves every trigger, the
// recorded configuration and the DDL watch's record to its own functions,
// drops the older ones, and finds no difference in configuration.
func TestUpgradeBodies(t *testing.T) {
	tb := guarded(t, tableName(t, ""), [3]any{1, "a", 5})
	dropWatch(t)
	o := backstop.Options{ExemptRoles: []string{newRole(t, tableName(t, "_mig"), "")}}
	discovered := sqlrewrite.Guard{Column: "fence_epoch"}
	o.Discovered = &discovered
	installGuards(t, o, guardOf("public", tb))
	// What an older version left: its own body (here with a line more),
	// named after it, run by the table's trigger and recorded.
	now, _ := backstop.RowFunction(guardOf("public", tb), o)
	body := now.Body + "-- an older version's body\n"
	sum := sha256.Sum256([]byte(body))
	older := backstop.Function{Name: "backstop_" + hex.EncodeToString(sum[:8]), Body: body}
	db := pgtest.Direct(t)
	exec(t, db, older.DDL())
	exec(t, db, `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OR DELETE ON public.`+tb+` FOR EACH ROW EXECUTE FUNCTION pgfence.`+older.Name+`()`)
	exec(t, db, `UPDATE pgfence.guarded SET row_function = '`+older.Name+`' WHERE relid = 'public.`+tb+`'::regclass`)
	exec(t, db, `UPDATE pgfence.ddl_backstop SET row_function = '`+older.Name+`'`)
	// This version, without --replace (serve), as after an upgrade.
	o.Replace = false
	r, err := backstop.Reconcile(ctx, db, []sqlrewrite.Guard{guardOf("public", tb)}, o, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	if tbl := oneTable(t, r); !tbl.OK || tbl.Changed != "updated" {
		t.Fatalf("the table: OK %v, changed %q, problem %q", tbl.OK, tbl.Changed, tbl.Problem)
	}
	if len(r.Differences) > 0 {
		t.Errorf("a newer version's bodies for the same configuration are no difference: %q", r.Differences)
	}
	if functionExists(t, older.Name) || !slices.Contains(r.DroppedFunctions, older.Name) {
		t.Errorf("the older version's function %s is still there (dropped %q)", older.Name, r.DroppedFunctions)
	}
	var recorded string
	if err := db.QueryRow(ctx, "SELECT row_function::text FROM pgfence.ddl_backstop").Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if fd, _ := backstop.RowFunction(discovered, o); recorded != fd.Name {
		t.Errorf("the DDL watch's function is %s, want this version's %s", recorded, fd.Name)
	}
}
