package backstop_test

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// TestTriggerPrivilegeOnly: with the TRIGGER privilege on tables it does
// not own, pgfence's role installs the backstop, partitions included, and
// mends it once the owner disabled it (CREATE OR REPLACE TRIGGER enables it
// again). What takes owning the table (enabling a partition's clone of its
// parent's trigger; dropping a trigger, as a table going to observe asks)
// fails, saying so and how to get it done: for a table that is then not
// fenced, as its problem; for one fenced more than asked, among the
// report's problems.
func TestTriggerPrivilegeOnly(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	parent, part := base+"_p", base+"_p1"
	db := pgtest.Direct(t)
	exec(t, db, "CREATE TABLE public."+parent+" (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id)")
	exec(t, db, "CREATE TABLE public."+part+" PARTITION OF public."+parent+" FOR VALUES FROM (0) TO (100)")
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS public."+parent) })
	// pgfence's role: a member of the owner of pgfence's schema objects
	// (here the bootstrap superuser), with TRIGGER alone on the tables.
	pf, owner := newRole(t, base+"_pf", ""), newRole(t, base+"_own", "")
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	exec(t, db, "GRANT postgres TO "+pf)
	// Without the DDL guard, as where pgfence's role is no superuser: the
	// owner may disable the backstop.
	exec(t, db, "DROP EVENT TRIGGER IF EXISTS "+backstop.GuardTrigger+"; DROP EVENT TRIGGER IF EXISTS "+backstop.DropGuardTrigger)
	t.Cleanup(func() {
		exec(t, pgtest.Direct(t), "REASSIGN OWNED BY "+pf+" TO postgres") // functions other tables' triggers may share
		reconcile(t, backstop.Install, backstop.Options{})                // the guard again, for the other tests
	})
	for _, table := range []string{tb, parent, part} {
		exec(t, db, "ALTER TABLE public."+table+" OWNER TO "+owner)
		exec(t, db, "GRANT TRIGGER ON public."+table+" TO "+pf)
	}
	conn := pgtest.Connect(t, roleURL(pf))
	install := func(gs ...sqlrewrite.Guard) *backstop.Report {
		t.Helper()
		r, err := backstop.Reconcile(ctx, conn, gs, backstop.Options{Replace: true}, backstop.Install)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	all := []sqlrewrite.Guard{guardOf("public", tb), guardOf("public", parent), guardOf("public", part)}
	for _, tbl := range install(all...).Tables {
		if !tbl.OK {
			t.Fatalf("install with TRIGGER alone: %s", tbl.Problem)
		}
	}
	var clone string
	if err := db.QueryRow(ctx, "SELECT tgname FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass AND tgparentid <> 0", "public."+part).Scan(&clone); err != nil {
		t.Fatal(err)
	}
	exec(t, db, "SET ROLE "+owner)
	exec(t, db, `ALTER TABLE public.`+tb+` DISABLE TRIGGER "~pgfence_backstop"`)
	exec(t, db, `ALTER TABLE public.`+part+` DISABLE TRIGGER "`+clone+`"`)
	exec(t, db, "RESET ROLE")
	r := install(all...)
	if tbl := r.Tables[0]; !tbl.OK || !strings.HasPrefix(tbl.Changed, "enabled") {
		t.Fatalf("mending a disabled backstop with TRIGGER alone: OK %v, changed %q, problem %q", tbl.OK, tbl.Changed, tbl.Problem)
	}
	stillFenced(t, session(t, ""), tb, backstop.Options{})
	wants := []string{"takes owning the table", "its owner is " + owner, `GRANT "` + owner + `" TO "` + pf + `"`}
	if tbl := r.Tables[2]; tbl.OK {
		t.Errorf("a partition whose clone is disabled, with TRIGGER alone: OK")
	} else {
		for _, want := range wants {
			if !strings.Contains(tbl.Problem, want) {
				t.Errorf("enabling a partition's clone with TRIGGER alone: problem %q, want it to say %q", tbl.Problem, want)
			}
		}
	}
	observe := guardOf("public", tb)
	observe.Rollout = sqlrewrite.Observe
	r = install(observe)
	if tbl := oneTable(t, r); !tbl.OK {
		t.Fatalf("observe, its backstop left in place: %s", tbl.Problem)
	}
	for _, want := range wants {
		if !strings.Contains(strings.Join(r.Problems, "\n"), want) {
			t.Errorf("going to observe with TRIGGER alone: problems %q, want one to say %q", r.Problems, want)
		}
	}
}
