package backstop_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// ownedBy makes role the owner of public.tb, able to create functions in
// public, as an application whose migrations create its tables is.
func ownedBy(t *testing.T, tb, role string) {
	t.Helper()
	db := pgtest.Direct(t)
	exec(t, db, "ALTER TABLE public."+tb+" OWNER TO "+role)
	exec(t, db, "GRANT CREATE ON SCHEMA public TO "+role)
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "REVOKE CREATE ON SCHEMA public FROM "+role) })
}

// stillFenced fails the test unless a stale write to public.tb, straight to
// Postgres, changes nothing, and Verify finds the backstop as installed.
func stillFenced(t *testing.T, c *pgx.Conn, tb string, o backstop.Options) {
	t.Helper()
	exec(t, c, "SET fence.token = '3'")
	if tag := exec(t, c, "UPDATE public."+tb+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("a stale write landed: %s", tag)
	}
	exec(t, c, "RESET fence.token")
	if r := oneTable(t, reconcile(t, backstop.Verify, o, guardOf("public", tb))); !r.OK {
		t.Fatalf("Verify: %s", r.Problem)
	}
}

// TestGuardRefusesWeakening: with the DDL guard in place (pgfence's role a
// superuser), an application role that owns a guarded table cannot drop,
// replace, disable or rename its backstop's triggers, nor change, drop or
// rename its epoch column, straight to Postgres; the fence holds after
// each try. Its ordinary migrations still run, and an exempt role may do
// what the application may not.
func TestGuardRefusesWeakening(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	app, mig := newRole(t, base+"_app", ""), newRole(t, base+"_mig", "")
	ownedBy(t, tb, app)
	exec(t, pgtest.Direct(t), "GRANT "+app+" TO "+mig)
	o := backstop.Options{ExemptRoles: []string{mig}}
	r := installGuards(t, o, guardOf("public", tb))
	if !r.GuardingDDL {
		t.Fatalf("the DDL guard is not in place: %s", r.NotGuardingDDL)
	}
	fn, _ := backstop.RowFunction(guardOf("public", tb), o)
	a := pgtest.Connect(t, roleURL(app))
	exec(t, a, "CREATE FUNCTION public."+tb+"_forge() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.fence_epoch := 999; RETURN NEW; END $$")
	stillFenced(t, a, tb, o)

	table := "public." + tb
	cases := []struct {
		name, sql, code string
	}{
		{"drop_row_trigger", `DROP TRIGGER "~pgfence_backstop" ON {t}`, "42501"},
		{"drop_and_create_when_false", `BEGIN; DROP TRIGGER "~pgfence_backstop" ON {t};
			CREATE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW WHEN (false) EXECUTE FUNCTION pgfence.{fn}(); COMMIT`, "42501"},
		{"replace_when_false", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW WHEN (false) EXECUTE FUNCTION pgfence.{fn}()`, "42501"},
		{"replace_insert_only", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION pgfence.{fn}()`, "42501"},
		{"replace_after", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" AFTER INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION pgfence.{fn}()`, "42501"},
		{"replace_column_list", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OF id OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION pgfence.{fn}()`, "42501"},
		{"disable_user", `ALTER TABLE {t} DISABLE TRIGGER USER`, "42501"},
		{"disable_all", `ALTER TABLE {t} DISABLE TRIGGER ALL`, "42501"},
		{"disable_backstop", `ALTER TABLE {t} DISABLE TRIGGER "~pgfence_backstop"`, "42501"},
		{"enable_replica", `ALTER TABLE {t} ENABLE REPLICA TRIGGER "~pgfence_backstop"`, "42501"},
		{"rename_trigger", `ALTER TRIGGER "~pgfence_backstop" ON {t} RENAME TO mine`, "42501"},
		{"disable_write_enable", `BEGIN; ALTER TABLE {t} DISABLE TRIGGER USER;
			DO $$ BEGIN UPDATE {t} SET val = 'stale' WHERE id = 1; END $$; ALTER TABLE {t} ENABLE TRIGGER USER; COMMIT`, "42501"},
		{"epoch_type_using_0", `ALTER TABLE {t} ALTER COLUMN fence_epoch TYPE bigint USING 0`, "0A000"},
		{"epoch_type_int", `ALTER TABLE {t} ALTER COLUMN fence_epoch TYPE int`, "0A000"},
		{"drop_epoch", `ALTER TABLE {t} DROP COLUMN fence_epoch`, "2BP01"},
		{"drop_epoch_cascade", `ALTER TABLE {t} DROP COLUMN fence_epoch CASCADE`, "42501"},
		{"rename_epoch", `ALTER TABLE {t} RENAME COLUMN fence_epoch TO epoch2`, "42501"},
		{"drop_epoch_trigger", `DROP TRIGGER "~pgfence_epoch" ON {t}`, "42501"},
		{"drop_truncate_trigger", `DROP TRIGGER "~pgfence_backstop_truncate" ON {t}`, "42501"},
		{"truncate_when_false", `CREATE OR REPLACE TRIGGER "~pgfence_backstop_truncate" BEFORE TRUNCATE ON {t} FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION pgfence.epoch_guard()`, "42501"},
		{"disable_truncate_trigger", `ALTER TABLE {t} DISABLE TRIGGER "~pgfence_backstop_truncate"`, "42501"},
		{"trigger_after_backstop", `CREATE TRIGGER "~~forge" BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION public.{tb}_forge()`, "42501"},
		// Named as a partitioned table's backstop, on a plain table: it
		// would fire after the backstop's and change the epoch it stamps.
		{"trigger_named_partition_backstop", `CREATE TRIGGER "~pgfence_backstop_p1" BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION public.{tb}_forge()`, "42501"},
		{"trigger_named_partition_backstop_in_do", `DO $$ BEGIN EXECUTE 'CREATE TRIGGER "~pgfence_backstop_p1" BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public.{tb}_forge()'; END $$`, "42501"},
		{"column_rewrite_using", `ALTER TABLE {t} ALTER COLUMN val TYPE text USING CASE WHEN id = 1 THEN 'forged' ELSE val END`, "42501"},
		{"column_rewrite_type", `ALTER TABLE {t} ALTER COLUMN id TYPE bigint`, "42501"},
		{"backstop_function_named_partition_backstop", `CREATE TRIGGER "~pgfence_backstop_p1" BEFORE INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION pgfence.{fn}()`, "42501"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sql := strings.NewReplacer("{t}", table, "{fn}", fn.Name, "{tb}", tb).Replace(c.sql)
			_, err := a.Exec(ctx, sql)
			if code(err) != c.code {
				t.Fatalf("%s: %v, want SQLSTATE %s", sql, err, c.code)
			}
			if strings.HasPrefix(sql, "BEGIN") {
				exec(t, a, "ROLLBACK")
			}
			if c.code == "42501" && !strings.Contains(err.Error(), "pgfence") {
				t.Errorf("the refusal does not say it is pgfence's: %v", err)
			}
			stillFenced(t, a, tb, o)
		})
	}

	t.Run("ordinary_migrations", func(t *testing.T) {
		other := tb + "_other"
		for _, sql := range []string{
			"ALTER TABLE " + table + " ADD COLUMN note text",
			"CREATE INDEX ON " + table + " (val)",
			"ALTER TABLE " + table + " RENAME TO " + other,
			"ALTER TABLE public." + other + " RENAME TO " + tb,
			"ALTER TABLE " + table + " ALTER COLUMN note TYPE varchar", // no rewrite: text and varchar are binary compatible
			"ALTER TABLE " + table + " DROP COLUMN note",
			"COMMENT ON TABLE " + table + " IS 'mine'",
			"CREATE TRIGGER a_first BEFORE UPDATE ON " + table + " FOR EACH ROW EXECUTE FUNCTION public." + tb + "_forge()",
		} {
			if _, err := a.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		// A trigger that fires before the backstop cannot forge the epoch:
		// the backstop stamps the token after it.
		exec(t, a, "SET fence.token = '7'")
		exec(t, a, "UPDATE "+table+" SET val = 'fresh' WHERE id = 1")
		if _, e := rowOf(t, tb, 1); e != 7 {
			t.Fatalf("epoch %d, want 7", e)
		}
		exec(t, a, "DROP TRIGGER a_first ON "+table)
		stillFenced(t, a, tb, o)
	})

	t.Run("exempt_role", func(t *testing.T) {
		m := pgtest.Connect(t, roleURL(mig))
		exec(t, m, "SET ROLE "+app) // the owner's privileges, as a migration role has
		exec(t, m, "RESET ROLE")
		exec(t, m, "ALTER TABLE "+table+" DISABLE TRIGGER \"~pgfence_backstop\"")
		exec(t, m, "ALTER TABLE "+table+" ENABLE TRIGGER \"~pgfence_backstop\"")
		stillFenced(t, a, tb, o)
	})

	t.Run("impostor_reported", func(t *testing.T) {
		// Where the guard lets it through (an exempt role, or no guard at
		// all), Verify still finds a trigger named as the backstop's that
		// is not it.
		m := pgtest.Connect(t, roleURL(mig))
		exec(t, m, `CREATE TRIGGER "~pgfence_backstop_p1" BEFORE UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION public.`+tb+`_forge()`)
		r := oneTable(t, reconcile(t, backstop.Verify, o, guardOf("public", tb)))
		if r.OK || !strings.Contains(r.Problem, "~pgfence_backstop_p1") {
			t.Errorf("Verify with a trigger named as the backstop's that is not it: ok %v, problem %q", r.OK, r.Problem)
		}
		exec(t, m, `DROP TRIGGER "~pgfence_backstop_p1" ON `+table)
		stillFenced(t, a, tb, o)
	})

	t.Run("drop_table", func(t *testing.T) {
		gone := guarded(t, base+"_gone", [3]any{1, "a", 5})
		ownedBy(t, gone, app)
		installGuards(t, o, guardOf("public", gone))
		exec(t, a, "DROP TABLE public."+gone)
	})
}

// TestGuardOnlyItsTables: the guard refuses a weakening DDL only for the
// table it touches: an unrelated table's DDL runs while another guarded
// table's backstop is broken.
func TestGuardOnlyItsTables(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	installGuards(t, backstop.Options{}, guardOf("public", tb))
	db := pgtest.Direct(t)
	exec(t, db, `ALTER TABLE public.`+tb+` DISABLE TRIGGER "~pgfence_backstop"`) // pgfence's own role may
	app := newRole(t, base+"_app", "")
	plain := tableName(t, "_plain")
	exec(t, db, "CREATE TABLE public."+plain+" (id int)")
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS public."+plain) })
	exec(t, db, "ALTER TABLE public."+plain+" OWNER TO "+app)
	exec(t, pgtest.Connect(t, roleURL(app)), "ALTER TABLE public."+plain+" ADD COLUMN v text")
}

// TestGuardDetachAttach: a partition detached keeps a backstop of its own
// at once (a stale write in the same transaction is fenced), attaching it
// again succeeds, and so does attaching a table that got the backstop of
// its own as DDL created it.
func TestGuardDetachAttach(t *testing.T) {
	base := baseName(t)
	p := base
	app := newRole(t, base+"_app", "")
	db := pgtest.Direct(t)
	exec(t, db, `DROP TABLE IF EXISTS `+p+` CASCADE;
		CREATE TABLE `+p+` (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY LIST (id);
		CREATE TABLE `+p+`_1 PARTITION OF `+p+` FOR VALUES IN (1);
		CREATE TABLE `+p+`_2 PARTITION OF `+p+` FOR VALUES IN (2);
		INSERT INTO `+p+` VALUES (1, 'a', 5), (2, 'b', 5)`)
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+p+", "+p+"_new CASCADE") })
	for _, s := range []string{"", "_1", "_2"} {
		exec(t, db, "ALTER TABLE "+p+s+" OWNER TO "+app)
	}
	exec(t, db, "GRANT CREATE ON SCHEMA public TO "+app)
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "REVOKE CREATE ON SCHEMA public FROM "+app) })
	discovered := guardOf("", "")
	o := backstop.Options{Discovered: &discovered}
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		exec(t, c, "DROP EVENT TRIGGER IF EXISTS "+backstop.EventTrigger)
		exec(t, c, "DELETE FROM pgfence.ddl_backstop")
	})
	all := []sqlrewrite.Guard{guardOf("public", p), guardOf("public", p+"_1"), guardOf("public", p+"_2")}
	installGuards(t, o, all...)

	a := pgtest.Connect(t, roleURL(app))
	exec(t, a, "BEGIN")
	exec(t, a, "ALTER TABLE "+p+" DETACH PARTITION "+p+"_1")
	exec(t, a, "SET LOCAL fence.token = '3'")
	if tag := exec(t, a, "UPDATE "+p+"_1 SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale write to the partition just detached: %s", tag)
	}
	exec(t, a, "ALTER TABLE "+p+" ATTACH PARTITION "+p+"_1 FOR VALUES IN (1)")
	exec(t, a, "COMMIT")
	if st := triggerState(t, p+"_1"); strings.Count(st, "~pgfence_backstop") != 2 || !strings.Contains(st, "~pgfence_backstop_p") {
		t.Fatalf("triggers of the partition attached again: %s (want the clone of its parent's and the TRUNCATE trigger)", st)
	}

	// Detached for good, by the parent's owner, who does not own the
	// partition: fenced by a trigger of its own.
	exec(t, pgtest.Direct(t), "ALTER TABLE "+p+"_2 OWNER TO postgres")
	exec(t, a, "ALTER TABLE "+p+" DETACH PARTITION "+p+"_2")
	exec(t, pgtest.Direct(t), "ALTER TABLE "+p+"_2 OWNER TO "+app)
	exec(t, a, "SET fence.token = '3'")
	if tag := exec(t, a, "UPDATE "+p+"_2 SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale write to a detached partition: %s", tag)
	}
	if st := triggerState(t, p+"_2"); !strings.Contains(st, "~pgfence_backstop:") {
		t.Fatalf("triggers of the detached table: %s", st)
	}
	exec(t, a, "ALTER TABLE "+p+" ATTACH PARTITION "+p+"_2 FOR VALUES IN (2)")

	// A table made for a partition, discovered as DDL creates it (with a
	// backstop of its own), attaches.
	exec(t, a, "CREATE TABLE "+p+"_new (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	if st := triggerState(t, p+"_new"); !strings.Contains(st, "~pgfence_backstop:") {
		t.Fatalf("triggers of the new table: %s", st)
	}
	exec(t, a, "ALTER TABLE "+p+" ATTACH PARTITION "+p+"_new FOR VALUES IN (3)")
	exec(t, a, "INSERT INTO "+p+" VALUES (3, 'c', 0)")
	exec(t, a, "SET fence.token = '5'")
	exec(t, a, "UPDATE "+p+"_new SET val = 'fresh'")
	exec(t, a, "SET fence.token = '3'")
	if tag := exec(t, a, "UPDATE "+p+" SET val = 'stale'"); tag != "UPDATE 0" {
		t.Fatalf("stale write to the partitioned table after the attaches: %s", tag)
	}
	all = append(all, guardOf("public", p+"_new"))
	for _, tb := range reconcile(t, backstop.Verify, o, all...).Tables {
		if !tb.OK {
			t.Errorf("Verify after detach and attach: %s", tb.Problem)
		}
	}
}

// TestInstallNeverQueues: Install does not wait for a lock an open
// transaction holds on a guarded table (a writer behind it would wait
// too): it says it will try again soon, and does.
func TestInstallNeverQueues(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	w := pgtest.Direct(t)
	exec(t, w, "BEGIN")
	exec(t, w, "LOCK TABLE public."+tb+" IN ROW EXCLUSIVE MODE") // as a writer's open transaction holds it
	defer exec(t, w, "ROLLBACK")

	done := make(chan *backstop.Report, 1)
	go func() {
		r, err := backstop.Reconcile(ctx, pgtest.Direct(t), []sqlrewrite.Guard{guardOf("public", tb)}, backstop.Options{Replace: true}, backstop.Install)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	var r *backstop.Report
	waitedOn := func() bool {
		return query(t, `SELECT count(*) FROM pg_locks WHERE relation = 'public.`+tb+`'::regclass AND NOT granted`) != "0"
	}
	poll.Eventually(t, time.Minute, "Install's return", func() bool {
		if waitedOn() {
			t.Fatal("Install queued for the table's lock")
		}
		select {
		case r = <-done:
			return true
		default:
			return false
		}
	})
	tr := oneTable(t, r)
	if tr.OK || !tr.Retry || !strings.Contains(tr.Problem, "trying again shortly") {
		t.Fatalf("Install behind an open transaction: %+v", tr)
	}
	exec(t, w, "ROLLBACK")
	exec(t, w, "BEGIN") // for the deferred ROLLBACK
	if tr := oneTable(t, reconcile(t, backstop.Install, backstop.Options{}, guardOf("public", tb))); !tr.OK {
		t.Fatalf("Install once the transaction ended: %s", tr.Problem)
	}
}

// TestRecordedConfiguration: the first install records its configuration;
// an instance whose flags differ keeps the recorded one and says where
// they differ; Replace ('pgfence init') records its own.
func TestRecordedConfiguration(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	g := guardOf("public", tb)
	shadow := g
	shadow.Rollout = sqlrewrite.Shadow
	installGuards(t, backstop.Options{}, shadow) // records shadow
	direct := func() string {
		c := session(t, "3")
		return exec(t, c, "UPDATE public."+tb+" SET val = 'x' WHERE id = 1")
	}
	if tag := direct(); tag != "UPDATE 1" {
		t.Fatalf("shadow lets a stale write land: %s", tag)
	}
	exec(t, pgtest.Direct(t), "UPDATE public."+tb+" SET fence_epoch = 5 WHERE id = 1")

	// An instance that says enforce keeps the database's shadow.
	r, err := backstop.Reconcile(ctx, pgtest.Direct(t), []sqlrewrite.Guard{g}, backstop.Options{}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	tr := oneTable(t, r)
	if !tr.OK || tr.AsConfigured || r.Covers(g) || tr.Changed != "" {
		t.Fatalf("enforce over a recorded shadow: %+v", tr)
	}
	if len(r.Differences) != 1 || !strings.Contains(r.Differences[0], "shadow in the database, enforce here") {
		t.Fatalf("Differences: %q", r.Differences)
	}
	if tag := direct(); tag != "UPDATE 1" {
		t.Fatalf("the recorded shadow stays: %s", tag)
	}
	exec(t, pgtest.Direct(t), "UPDATE public."+tb+" SET fence_epoch = 5 WHERE id = 1")

	// 'pgfence init' with enforce records it.
	r = installGuards(t, backstop.Options{}, g)
	if !r.Covers(g) || len(r.Differences) != 0 {
		t.Fatalf("Replace: %+v %q", r.Tables, r.Differences)
	}
	if tag := direct(); tag != "UPDATE 0" {
		t.Fatalf("enforce after Replace: %s", tag)
	}
}

// TestReplicationRoleGrant: a role that may set session_replication_role
// (GRANT SET ON PARAMETER, Postgres 15 on) can switch every trigger off:
// Verify reports the backstop as not OK until the grant goes.
func TestReplicationRoleGrant(t *testing.T) {
	pgtest.NeedVersion(t, 15, "GRANT SET ON PARAMETER")
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	app := newRole(t, base+"_app", "")
	installGuards(t, backstop.Options{}, guardOf("public", tb))
	db := pgtest.Direct(t)
	exec(t, db, "GRANT SET ON PARAMETER session_replication_role TO "+app)
	t.Cleanup(func() { exec(t, pgtest.Direct(t), "REVOKE SET ON PARAMETER session_replication_role FROM "+app) })
	tr := oneTable(t, reconcile(t, backstop.Verify, backstop.Options{}, guardOf("public", tb)))
	if tr.OK || !strings.Contains(tr.Problem, "session_replication_role") || !strings.Contains(tr.Problem, app) {
		t.Fatalf("Verify with the grant: %+v", tr)
	}
	exec(t, db, "REVOKE SET ON PARAMETER session_replication_role FROM "+app)
	if tr := oneTable(t, reconcile(t, backstop.Verify, backstop.Options{}, guardOf("public", tb))); !tr.OK {
		t.Fatalf("Verify without it: %s", tr.Problem)
	}
}

// TestMarksUnforgeable: a client that sets pgfence's once-per-statement
// marks ahead of a write, as pgfence's helpers computed them before, no
// longer hides the backstop's notice (counted by pgfence) or the exempt
// role's audit line.
func TestMarksUnforgeable(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	mig := newRole(t, base+"_mig", "")
	exec(t, pgtest.Direct(t), "GRANT UPDATE, SELECT ON public."+tb+" TO "+mig)
	installGuards(t, backstop.Options{ExemptRoles: []string{mig}}, guardOf("public", tb))
	oid := query(t, "SELECT 'public."+tb+"'::regclass::oid")

	c, ns := connectNoticed(t, pgtest.DirectURL(), "3")
	exec(t, c, "SELECT pg_catalog.set_config('pgfence.noticed', pg_catalog.statement_timestamp()::text || ' "+oid+" row', false); "+
		"DO $$ BEGIN UPDATE public."+tb+" SET val = 'stale' WHERE id = 1; END $$")
	if got := ns.Codes(backstop.CodeStaleNotice); got != 1 {
		t.Fatalf("notices after a preset mark: %d, want 1", got)
	}
	// The notice's mark holds with pgfence's secret; one a client raises
	// itself cannot.
	key, err := backstop.ReadNoticeKey(ctx, pgtest.Direct(t))
	if err != nil || key == "" {
		t.Fatalf("ReadNoticeKey: %q %v", key, err)
	}
	all := ns.All()
	last := all[len(all)-1]
	detail := map[string]string{}
	for _, f := range strings.Fields(last.Detail) {
		k, v, _ := strings.Cut(f, "=")
		detail[k] = v
	}
	if detail["rel"] != oid || backstop.NoticeMark(key, detail["at"], detail["rel"], detail["kind"]) != detail["mark"] {
		t.Fatalf("the notice's mark does not hold: %q", last.Detail)
	}
	if backstop.NoticeMark("guess", detail["at"], detail["rel"], detail["kind"]) == detail["mark"] {
		t.Fatal("a mark holds without pgfence's secret")
	}
	app := newRole(t, base+"_app", "")
	if _, err := backstop.ReadNoticeKey(ctx, pgtest.Connect(t, roleURL(app))); code(err) != "42501" {
		t.Fatalf("another role reads pgfence's secret: %v", err)
	}

	m := pgtest.Connect(t, roleURL(mig))
	exec(t, m, "SELECT pg_catalog.set_config('pgfence.exempt_noted', pg_catalog.statement_timestamp()::text || ' "+oid+"', false); "+
		"UPDATE public."+tb+" SET val = 'mig' WHERE id = 1")
	audit := "pgfence: role " + mig + " (session user " + mig + ") wrote guarded table public." + tb + " without the fence"
	poll.Eventually(t, 30*time.Second, "the audit line "+audit+" after a preset mark", func() bool { return strings.Contains(pgtest.Server().LogTail(), audit) })
}

// TestGuardNeedsSuperuser: a pgfence role that is not a superuser cannot
// create the DDL guard: Reconcile says so and why it matters, and names
// each table's owner, so that serve can say which tables another role can
// switch the fence off on.
func TestGuardNeedsSuperuser(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	app, pf := newRole(t, base+"_app", ""), newRole(t, base+"_pf", "")
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	exec(t, db, "GRANT postgres TO "+pf) // owns pgfence's objects, not a superuser
	exec(t, db, "GRANT "+app+" TO "+pf)  // may create the triggers on app's table
	ownedBy(t, tb, app)
	exec(t, db, "DROP EVENT TRIGGER IF EXISTS "+backstop.GuardTrigger+"; DROP EVENT TRIGGER IF EXISTS "+backstop.DropGuardTrigger)
	t.Cleanup(func() {
		exec(t, pgtest.Direct(t), "REASSIGN OWNED BY "+pf+" TO postgres") // functions other tables' triggers may share
		reconcile(t, backstop.Install, backstop.Options{})                // the guard again, for the other tests
	})
	r, err := backstop.Reconcile(ctx, pgtest.Connect(t, roleURL(pf)), []sqlrewrite.Guard{guardOf("public", tb)}, backstop.Options{Replace: true}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	if r.GuardingDDL || r.Superuser || !strings.Contains(r.NotGuardingDDL, "not a superuser") || !strings.Contains(r.NotGuardingDDL, "owner of a guarded table can") {
		t.Fatalf("Install as a role that is not a superuser: %v %q", r.GuardingDDL, r.NotGuardingDDL)
	}
	if tr := oneTable(t, r); !tr.OK || tr.Owner != app || r.Role != pf {
		t.Fatalf("table: %+v, role %s", tr, r.Role)
	}
	// What the owner can then still do, and the next read finds.
	a := pgtest.Connect(t, roleURL(app))
	exec(t, a, `ALTER TABLE public.`+tb+` DISABLE TRIGGER "~pgfence_backstop"`)
	if tr := oneTable(t, reconcile(t, backstop.Verify, backstop.Options{}, guardOf("public", tb))); tr.OK || !strings.Contains(tr.Problem, "is disabled") {
		t.Fatalf("Verify after the owner disabled the backstop: %+v", tr)
	}
}

// TestGuardLetsRecordedChangesThrough: a superuser that is not pgfence's
// own role (a DBA running pgfence init) may change a table's backstop as
// the configuration it records says (here: to observe, which drops the
// row trigger), with the DDL guard standing: the guard judges DDL by what
// the database records, and Install records first.
func TestGuardLetsRecordedChangesThrough(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	if r := installGuards(t, backstop.Options{}, guardOf("public", tb)); !r.GuardingDDL {
		t.Fatalf("the DDL guard is not in place: %s", r.NotGuardingDDL)
	}
	dba := newRole(t, base+"_dba", "SUPERUSER")
	observe := guardOf("public", tb)
	observe.Rollout = sqlrewrite.Observe
	r, err := backstop.Reconcile(ctx, pgtest.Connect(t, roleURL(dba)), []sqlrewrite.Guard{observe}, backstop.Options{Replace: true}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	if tr := oneTable(t, r); !tr.OK || !strings.Contains(tr.Changed, "removed (observe)") {
		t.Fatalf("a DBA's init putting the table to observe: %+v", tr)
	}
	if st := triggerState(t, tb); strings.Contains(st, "~pgfence_backstop:") {
		t.Fatalf("the row trigger is still there: %s", st)
	}
}
