package backstop_test

import (
	"slices"
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// functionExists reports whether pgfence.<name>() exists.
func functionExists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT pg_catalog.to_regprocedure('pgfence.' || pg_catalog.quote_ident($1) || '()') IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestDropsUnusedFunctions: each configuration change leaves the last
// configuration's trigger function behind; Install drops one once no
// trigger runs it, and keeps those a trigger, the recorded configuration
// of a table, or the DDL watch still names.
func TestDropsUnusedFunctions(t *testing.T) {
	a, b := guarded(t, tableName(t, "_a"), [3]any{1, "v", 5}), guarded(t, tableName(t, "_b"), [3]any{1, "v", 5})
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
