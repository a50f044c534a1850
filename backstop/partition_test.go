package backstop_test

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// A partitioned table's row trigger is created once on the table and
// cloned by Postgres to its partitions, present and future; the TRUNCATE
// trigger is each partition's own.
func TestPartitions(t *testing.T) {
	db := pgtest.Direct(t)
	p := tableName(t, "")
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS `+p+` CASCADE;
		CREATE TABLE `+p+` (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY LIST (id);
		CREATE TABLE `+p+`_1 PARTITION OF `+p+` FOR VALUES IN (1);
		CREATE TABLE `+p+`_2 PARTITION OF `+p+` FOR VALUES IN (2);
		INSERT INTO `+p+` VALUES (1, 'a', 5), (2, 'b', 5)`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+p+" CASCADE") })
	guard := func(name string) sqlrewrite.Guard {
		return sqlrewrite.Guard{Schema: "public", Table: name, Column: "fence_epoch"}
	}
	// Partitions first in the list: Reconcile orders parents first.
	installGuards(t, backstop.Options{}, guard(p+"_2"), guard(p+"_1"), guard(p))

	stale := session(t, "3")
	if tag := pgtest.Exec(t, stale, "UPDATE "+p+" SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale UPDATE of the partitioned table: %s", tag)
	}
	if tag := pgtest.Exec(t, stale, "DELETE FROM "+p+"_1"); tag != "DELETE 0" {
		t.Fatalf("stale DELETE naming a partition: %s", tag)
	}
	if _, err := stale.Exec(ctx, "TRUNCATE "+p+"_2"); code(err) != "0A000" {
		t.Fatalf("TRUNCATE of a partition: %v", err)
	}

	// A partition attached later has the row trigger at once (cloned);
	// its TRUNCATE trigger comes with the next Reconcile, which Verify
	// says is missing.
	pgtest.Exec(t, db, `CREATE TABLE `+p+`_3 (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO `+p+`_3 VALUES (3, 'c', 5);
		ALTER TABLE `+p+` ATTACH PARTITION `+p+`_3 FOR VALUES IN (3)`)
	if tag := pgtest.Exec(t, stale, "UPDATE "+p+"_3 SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale UPDATE of a partition attached after the install: %s", tag)
	}
	all := []sqlrewrite.Guard{guard(p), guard(p + "_1"), guard(p + "_2"), guard(p + "_3")}
	r, err := backstop.Reconcile(ctx, db, all, backstop.Options{Replace: true}, backstop.Verify)
	if err != nil {
		t.Fatal(err)
	}
	if r.Installed(guard(p+"_3")) || !strings.Contains(r.Tables[3].Problem, "testpartitions_3") {
		t.Fatalf("Verify on the attached partition: %+v", r.Tables[3])
	}
	installGuards(t, backstop.Options{}, all...)
	if _, err := stale.Exec(ctx, "TRUNCATE "+p+"_3"); code(err) != "0A000" {
		t.Fatalf("TRUNCATE of the attached partition after Reconcile: %v", err)
	}
	fresh := session(t, "7")
	if tag := pgtest.Exec(t, fresh, "UPDATE "+p+" SET val = 'fresh'"); tag != "UPDATE 3" {
		t.Fatalf("fresh UPDATE: %s", tag)
	}
	for id := 1; id <= 3; id++ {
		if v, e := rowOf(t, p, id); v != "fresh" || e != 7 {
			t.Fatalf("row %d: %q at %d", id, v, e)
		}
	}
	// A second Install changes nothing.
	r = installGuards(t, backstop.Options{}, all...)
	for _, tb := range r.Tables {
		if tb.Changed != "" {
			t.Fatalf("a second Install changed %s: %s", tb.Guard.Name(), tb.Changed)
		}
	}
}

// A BEFORE row trigger whose name sorts after the backstop's fires after
// it and could change the epoch it stamped: the backstop is not OK then.
func TestTriggerAfterBackstop(t *testing.T) {
	tb := guarded(t, tableName(t, ""), [3]any{1, "a", 5})
	install(t, backstop.Options{}, tb)
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `CREATE OR REPLACE FUNCTION `+tb+`_forge() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.fence_epoch := 999; RETURN NEW; END $$;
		CREATE TRIGGER "~~forge" BEFORE UPDATE ON `+tb+` FOR EACH ROW EXECUTE FUNCTION `+tb+`_forge()`)
	g := sqlrewrite.Guard{Schema: "public", Table: tb, Column: "fence_epoch"}
	r, err := backstop.Reconcile(ctx, db, []sqlrewrite.Guard{g}, backstop.Options{Replace: true}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	if r.Installed(g) || !strings.Contains(r.Tables[0].Problem, `"~~forge"`) {
		t.Fatalf("a trigger firing after the backstop: %+v", r.Tables[0])
	}
	pgtest.Exec(t, db, `ALTER TRIGGER "~~forge" ON `+tb+` RENAME TO forge`)
	installGuards(t, backstop.Options{}, g)
	pgtest.Exec(t, session(t, "7"), "UPDATE "+tb+" SET val = 'b'")
	if _, e := rowOf(t, tb, 1); e != 7 {
		t.Fatalf("epoch %d after a trigger that fires before the backstop forged it", e)
	}
}

// A partitioned table's BEFORE row trigger that fires after the backstop
// is cloned to its partitions: each partition's backstop is not OK either,
// on every version (up to PostgreSQL 14 the clones are marked internal).
func TestTriggerAfterBackstopPartition(t *testing.T) {
	db := pgtest.Direct(t)
	p := tableName(t, "")
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS `+p+` CASCADE;
		CREATE TABLE `+p+` (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY LIST (id);
		CREATE TABLE `+p+`_1 PARTITION OF `+p+` FOR VALUES IN (1);
		INSERT INTO `+p+` VALUES (1, 'a', 5)`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+p+" CASCADE; DROP FUNCTION IF EXISTS "+p+"_forge()")
	})
	gs := []sqlrewrite.Guard{{Schema: "public", Table: p, Column: "fence_epoch"}, {Schema: "public", Table: p + "_1", Column: "fence_epoch"}}
	installGuards(t, backstop.Options{}, gs...)
	pgtest.Exec(t, db, `CREATE FUNCTION `+p+`_forge() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.fence_epoch := 999; RETURN NEW; END $$;
		CREATE TRIGGER "~~forge" BEFORE UPDATE ON `+p+` FOR EACH ROW EXECUTE FUNCTION `+p+`_forge()`)
	r, err := backstop.Reconcile(ctx, db, gs, backstop.Options{Replace: true}, backstop.Verify)
	if err != nil {
		t.Fatal(err)
	}
	for i, tb := range r.Tables {
		if tb.OK || !strings.Contains(tb.Problem, `"~~forge"`) {
			t.Errorf("%s, with %s's trigger firing after the backstop: %+v", gs[i].Name(), p, tb)
		}
	}
}

// A helper of pgfence's schema edited by hand is found: Verify reports it,
// Install sets it up again. A body (claim_domain made to accept any
// token), and what an ALTER FUNCTION changes without touching the body:
// running as the caller, or without the client_min_messages that makes
// note_reject's notice reach pgfence whatever the client asked for.
func TestSetupDrift(t *testing.T) {
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	// def is what the edits below change, for both helpers.
	def := func() string {
		var d string
		if err := db.QueryRow(ctx, `SELECT string_agg(proname || ' ' || prosecdef::text || ' ' || coalesce(array_to_string(proconfig, ','), '') || ' ' || prosrc, '; ' ORDER BY proname)
			FROM pg_proc WHERE oid IN ('pgfence.claim_domain(text, bigint)'::regprocedure, 'pgfence.note_reject(oid, text, text, bigint, bigint)'::regprocedure)`).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	orig := def()
	if !strings.Contains(orig, "client_min_messages=notice") {
		t.Fatalf("note_reject does not set client_min_messages: %q", orig)
	}
	for _, edit := range []struct{ name, sql string }{
		{"body", `CREATE OR REPLACE FUNCTION pgfence.claim_domain(d text, tok bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$`},
		{"security invoker", `ALTER FUNCTION pgfence.claim_domain(text, bigint) SECURITY INVOKER`},
		{"client_min_messages reset", `ALTER FUNCTION pgfence.note_reject(oid, text, text, bigint, bigint) RESET client_min_messages`},
	} {
		t.Run(edit.name, func(t *testing.T) {
			pgtest.Exec(t, db, edit.sql)
			if def() == orig {
				t.Fatalf("%s changed nothing the test can see", edit.sql)
			}
			r, err := backstop.Reconcile(ctx, db, nil, backstop.Options{}, backstop.Verify)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Problems) == 0 || !strings.Contains(r.Problems[0], "changed by hand") {
				t.Fatalf("Verify after %s: %q", edit.sql, r.Problems)
			}
			if _, err := backstop.Reconcile(ctx, db, nil, backstop.Options{}, backstop.Install); err != nil {
				t.Fatal(err)
			}
			if d := def(); d != orig {
				t.Fatalf("Install left the helpers as edited: %q, want %q", d, orig)
			}
		})
	}
}

// TestAttachUnderOtherConfiguration: a table in a lock domain, attached as
// a partition of a partitioned table configured otherwise (no domain), would
// have the parent's clone for a backstop, which fences it less. The DDL
// guard refuses the ATTACH; where it is let through (an exempt role),
// Verify reports it, Install keeps the partition's own trigger, and a
// stale write routed through the parent into the partition still lands on
// the domain's check.
func TestAttachUnderOtherConfiguration(t *testing.T) {
	base := baseName(t)
	d := domainName(t)
	newDomain(t, d)
	ledger := guarded(t, base, [3]any{1, "a", 5})
	parent := base + "_p"
	db := pgtest.Direct(t)
	exec(t, db, "DROP TABLE IF EXISTS public."+parent+" CASCADE")
	exec(t, db, "CREATE TABLE public."+parent+" (id int NOT NULL, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id)")
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS public."+parent+" CASCADE") })
	app, mig := newRole(t, base+"_app", ""), newRole(t, base+"_mig", "")
	ownedBy(t, ledger, app)
	exec(t, db, "ALTER TABLE public."+parent+" OWNER TO "+app)
	exec(t, db, "GRANT "+app+" TO "+mig)
	inDomain := guardOf("public", ledger)
	inDomain.Domain = d
	gs := []sqlrewrite.Guard{guardOf("public", parent), inDomain}
	o := backstop.Options{ExemptRoles: []string{mig}}
	if r := installGuards(t, o, gs...); !r.GuardingDDL {
		t.Fatalf("the DDL guard is not in place: %s", r.NotGuardingDDL)
	}
	exec(t, db, "UPDATE pgfence.domains SET token = 10 WHERE domain = '"+d+"'")
	attach := "ALTER TABLE public." + parent + " ATTACH PARTITION public." + ledger + " FOR VALUES FROM (MINVALUE) TO (MAXVALUE)"

	a := pgtest.Connect(t, roleURL(app))
	_, err := a.Exec(ctx, attach)
	wantCode(t, "ATTACH under a parent outside the partition's lock domain", err, "42501")
	if !strings.Contains(err.Error(), "partition public."+ledger) {
		t.Errorf("the refusal does not name the partition: %v", err)
	}

	exec(t, pgtest.Connect(t, roleURL(mig)), attach)
	for _, mode := range []backstop.Mode{backstop.Verify, backstop.Install} {
		r := reconcile(t, mode, o, gs...)
		if tb := r.Tables[1]; tb.OK || !strings.Contains(tb.Problem, "partitioned ancestor") {
			t.Errorf("%v, the partition: ok %v, problem %q; want the clone of the other configuration reported", mode, tb.OK, tb.Problem)
		}
	}
	stale := session(t, "7") // below the domain's 10, above every row's epoch
	if _, err := stale.Exec(ctx, "INSERT INTO public."+parent+" (id, val) VALUES (2, 'stale')"); code(err) != "PF001" {
		t.Errorf("stale INSERT through the parent into the domain's table: %v, want PF001", err)
	}
	if tag := exec(t, stale, "UPDATE public."+parent+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
		t.Errorf("stale UPDATE through the parent of the domain's table: %s", tag)
	}
}
