package catalog

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

func same(g sqlrewrite.Guard) sqlrewrite.Guard { return g }

// A partition or inheritance child of a guarded table is guarded, found in
// the catalog, and tables with the epoch column are found too; what cannot
// be fenced as configured is a problem.
func TestDiscover(t *testing.T) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS disc_parted, disc_parent, disc_auto, disc_bad, disc_nullable CASCADE;
		CREATE TABLE disc_parted (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE disc_parted_1 PARTITION OF disc_parted FOR VALUES FROM (0) TO (100);
		CREATE TABLE disc_parent (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		CREATE TABLE disc_child () INHERITS (disc_parent);
		CREATE TABLE disc_auto (id int, fence_epoch bigint NOT NULL DEFAULT 0);
		CREATE TABLE disc_bad (id int, fence_epoch text);
		CREATE TABLE disc_nullable (id int, fence_epoch bigint)`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS disc_parted, disc_parent, disc_auto, disc_bad, disc_nullable CASCADE")
	})
	explicit := []sqlrewrite.Guard{{Table: "disc_parted", Column: "fence_epoch"}, {Table: "disc_parent", Column: "fence_epoch"}, {Table: "disc_missing", Column: "fence_epoch"}}

	d, err := Discover(ctx, db, explicit, false, "fence_epoch", same)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range d.Guards {
		names = append(names, g.Name())
	}
	if got := strings.Join(names, ","); got != "disc_parted,public.disc_parted_1,disc_parent,public.disc_child,disc_missing" {
		t.Fatalf("guards %s", got)
	}
	names = nil
	for _, g := range d.Tables {
		names = append(names, g.Name())
	}
	if got := strings.Join(names, ","); got != "public.disc_parted,public.disc_parted_1,public.disc_parent,public.disc_child" {
		t.Errorf("tables %s, want the existing ones, schema-qualified", got)
	}
	if got := strings.Join(d.Problems, "\n"); !strings.Contains(got, "disc_missing does not exist") {
		t.Fatalf("problems:\n%s", got)
	}

	d, err = Discover(ctx, db, nil, true, "fence_epoch", same)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, g := range d.Guards {
		found[g.Name()] = true
	}
	for _, want := range []string{"public.disc_auto", "public.disc_parted", "public.disc_parted_1", "public.disc_child", "public.disc_nullable"} {
		if !found[want] {
			t.Errorf("discovery missed %s (found %v)", want, found)
		}
	}
	if found["public.disc_bad"] {
		t.Error("a text fence_epoch column was guarded")
	}
	problems := strings.Join(d.Problems, "\n")
	for _, want := range []string{`disc_bad has a column "fence_epoch" of type text`, `guarded table public.disc_nullable is nullable`} {
		if !strings.Contains(problems, want) {
			t.Errorf("problems lack %q:\n%s", want, problems)
		}
	}
}

// The lock-domain membership the database keeps is the one a read applies:
// a read with InitDomains records the domain the flags give a table, a
// read whose flags give none applies the database's, and one whose flags
// say otherwise keeps the database's, saying so.
func TestReadDomainMembership(t *testing.T) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS member_a CASCADE;
		CREATE TABLE member_a (id int PRIMARY KEY, fence_epoch bigint NOT NULL DEFAULT 0)`)
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		pgtest.Exec(t, c, "DROP TABLE IF EXISTS member_a CASCADE")
		pgtest.Exec(t, c, "DELETE FROM pgfence.domain_members WHERE domain IN ('member_d', 'member_e')")
		pgtest.Exec(t, c, "DELETE FROM pgfence.domains WHERE domain IN ('member_d', 'member_e')")
	})
	guard := []sqlrewrite.Guard{{Schema: "public", Table: "member_a", Column: "fence_epoch"}}
	inDomain := func(d string) func(sqlrewrite.Guard) sqlrewrite.Guard {
		return func(g sqlrewrite.Guard) sqlrewrite.Guard { g.Domain = d; return g }
	}
	domainOf := func(f *Found) string {
		t.Helper()
		for _, g := range f.Guards {
			if g.Table == "member_a" {
				return g.Domain
			}
		}
		t.Fatalf("no guard of member_a among %v", f.Guards)
		return ""
	}
	o := Options{InitDomains: true, DiscoverColumn: "fence_epoch", Backstop: true, BackstopMode: backstop.Install, Replace: true}

	f, err := Read(ctx, db, o, []sqlrewrite.Guard{inDomain("member_d")(guard[0])}, inDomain("member_d"))
	if err != nil {
		t.Fatal(err)
	}
	if got := domainOf(f); got != "member_d" {
		t.Fatalf("domain %q after init, want member_d", got)
	}
	var recorded string
	if err := db.QueryRow(ctx, "SELECT domain FROM pgfence.domain_members WHERE relid = 'public.member_a'::regclass").Scan(&recorded); err != nil {
		t.Fatalf("the membership was not recorded: %v", err)
	}
	var rows int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM pgfence.domains WHERE domain = 'member_d'").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("domain rows of member_d: %d (%v), want 1", rows, err)
	}

	o.InitDomains, o.BackstopMode, o.Replace = false, backstop.Verify, false
	f, err = Read(ctx, db, o, guard, same)
	if err != nil {
		t.Fatal(err)
	}
	if got := domainOf(f); got != "member_d" {
		t.Errorf("domain %q without --domain, want the database's member_d", got)
	}

	f, err = Read(ctx, db, o, []sqlrewrite.Guard{inDomain("member_e")(guard[0])}, inDomain("member_e"))
	if err != nil {
		t.Fatal(err)
	}
	if got := domainOf(f); got != "member_d" {
		t.Errorf("domain %q with --domain member_e, want the database's member_d", got)
	}
	if p := strings.Join(f.Problems, "\n"); !strings.Contains(p, `is in lock domain "member_d" in the database`) || !strings.Contains(p, `--domain says "member_e"`) {
		t.Errorf("problems do not say the flags and the database disagree:\n%s", p)
	}
}

// Another session's temporary tables are not read: one named like a guard
// but without the epoch column would make every session's writes to the
// guard refused, and one with it would be guarded, and hold /readyz at 503
// while it cannot be given a backstop (red team 6b). Only its own session
// can write it, so fencing it protects nothing.
func TestDiscoverLeavesOutTemporaryTables(t *testing.T) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS disc_perm; CREATE TABLE disc_perm (id int, fence_epoch bigint NOT NULL DEFAULT 0)`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS disc_perm") })
	other := pgtest.Direct(t)
	pgtest.Exec(t, other, `CREATE TEMP TABLE disc_perm (id int);
		CREATE TEMP TABLE disc_temp (id int, fence_epoch bigint NOT NULL DEFAULT 0)`)

	d, err := Discover(ctx, db, []sqlrewrite.Guard{{Table: "disc_perm", Column: "fence_epoch"}}, true, "fence_epoch", same)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range d.Tables {
		if strings.HasPrefix(g.Schema, "pg_temp") {
			t.Errorf("read another session's temporary table %s", g.Name())
		}
	}
	for _, p := range d.Problems {
		if strings.Contains(p, "pg_temp") {
			t.Errorf("a problem with another session's temporary table: %s", p)
		}
	}
	found := false
	for _, g := range d.Tables {
		found = found || g.Name() == "public.disc_perm"
	}
	if !found {
		t.Errorf("public.disc_perm not read: %v", d.Tables)
	}
}
