package backstop_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// TestPooledRoles: behind a transaction pooler, server connections pass
// from client to client, and a token one client left on one for the
// session (in a function, where pgfence cannot see) would fence the next
// client's writes that pgfence did not see as writes. For a pooled role
// the backstop counts a token only in the transaction pgfence set it in,
// which the marker PooledSet leaves says; other roles are as before.
func TestPooledRoles(t *testing.T) {
	pgtest.Need(t)
	base := baseName(t)
	d := domainName(t)
	newDomain(t, d)
	tb := guarded(t, base, [3]any{1, "a", 5}, [3]any{2, "b", 5})
	dom := guarded(t, base+"_dom", [3]any{1, "a", 0})
	lenient := guarded(t, base+"_allow", [3]any{1, "a", 5})
	pooled, direct := newRole(t, base+"_pooled", ""), newRole(t, base+"_direct", "")
	db := pgtest.Direct(t)
	for _, tbl := range []string{tb, dom, lenient} {
		exec(t, db, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON public.%s TO %s, %s", tbl, pooled, direct))
	}
	domGuard := guardOf("public", dom)
	domGuard.Domain = d
	allowGuard := guardOf("public", lenient)
	allowGuard.AllowMissingToken = true
	installGuards(t, backstop.Options{PooledRoles: []string{pooled}}, guardOf("public", tb), domGuard, allowGuard)

	names := []string{"fence.token", "fence.token." + d}
	_, set := sqlrewrite.PooledSetSQL(names)

	p := pgtest.Connect(t, roleURL(pooled))
	// A token left for the session, as a client's function would leave it.
	exec(t, p, "SELECT set_config('fence.token', '9', false)")
	_, err := p.Exec(ctx, "UPDATE public."+tb+" SET val = 'leftover' WHERE id = 1")
	wantCode(t, "a pooled role's token that pgfence did not set", err, "55000")
	if err != nil && !strings.Contains(err.Error(), "transaction pooler") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	// A marker left with it, from an earlier transaction, does not help.
	exec(t, p, "BEGIN")
	exec(t, p, set("n1", []string{"9", ""}))
	marker := ""
	if err := p.QueryRow(ctx, "SELECT current_setting($1)", sqlrewrite.PooledMarker("fence.token")).Scan(&marker); err != nil {
		t.Fatal(err)
	}
	exec(t, p, "COMMIT")
	exec(t, p, fmt.Sprintf("SELECT set_config('fence.token', '9', false), set_config(%s, %s, false)",
		quote(sqlrewrite.PooledMarker("fence.token")), quote(marker)))
	_, err = p.Exec(ctx, "UPDATE public."+tb+" SET val = 'leftover' WHERE id = 1")
	wantCode(t, "a pooled role's token under an earlier transaction's marker", err, "55000")
	if v, e := rowOf(t, tb, 1); v != "a" || e != 5 {
		t.Fatalf("row 1 is %q at %d after refused writes", v, e)
	}

	// inTx runs sql in a transaction where PooledSet set the token
	// settings to values first, as pgfence does, and wants tag.
	inTx := func(nonce string, values []string, sql, tag string) {
		t.Helper()
		exec(t, p, "BEGIN")
		exec(t, p, set(nonce, values))
		if got := exec(t, p, sql); got != tag {
			t.Fatalf("%s, the token set by pgfence: %s, want %s", sql, got, tag)
		}
		exec(t, p, "COMMIT")
	}

	// Set by pgfence in the writing transaction, it counts: fresh and stale.
	inTx("n2", []string{"7", ""}, "UPDATE public."+tb+" SET val = 'fresh' WHERE id = 1", "UPDATE 1")
	if v, e := rowOf(t, tb, 1); v != "fresh" || e != 7 {
		t.Fatalf("fresh pooled write left %q at %d, want fresh at 7", v, e)
	}
	inTx("n3", []string{"4", ""}, "UPDATE public."+tb+" SET val = 'stale' WHERE id = 2", "UPDATE 0")

	// A lock domain's own setting is held to its own marker.
	start := domainToken(t, d)
	exec(t, p, "SELECT set_config('fence.token', '', false), set_config('fence.token."+d+"', '20', false)")
	_, err = p.Exec(ctx, "UPDATE public."+dom+" SET val = 'leftover' WHERE id = 1")
	wantCode(t, "a pooled role's domain token that pgfence did not set", err, "55000")
	if got := domainToken(t, d); got != start {
		t.Fatalf("a refused write claimed the domain at %d", got)
	}
	inTx("n4", []string{"", "21"}, "UPDATE public."+dom+" SET val = 'fresh' WHERE id = 1", "UPDATE 1")
	if got := domainToken(t, d); got != 21 {
		t.Fatalf("domain at %d after a fresh write at 21", got)
	}

	// Where a missing token lets a write through, an unbound one is missing:
	// the row keeps its epoch rather than take the leftover token.
	exec(t, p, "SELECT set_config('fence.token', '99', false)")
	if tag := exec(t, p, "UPDATE public."+lenient+" SET val = 'let' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("pooled write without a bound token, missing allowed: %s", tag)
	}
	if v, e := rowOf(t, lenient, 1); v != "let" || e != 5 {
		t.Fatalf("unbound token, missing allowed: %q at %d, want let at 5 (the epoch kept)", v, e)
	}

	// An instance started without the flag keeps the recorded roles (the
	// database's configuration stays) and says where it differs.
	r, err := backstop.Reconcile(ctx, pgtest.Direct(t), []sqlrewrite.Guard{guardOf("public", tb), domGuard, allowGuard}, backstop.Options{}, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	want := "--backstop-pooled-role: [" + pooled + "] in the database, [] here"
	if len(r.Differences) != 1 || r.Differences[0] != want {
		t.Errorf("Differences: %q, want [%q]", r.Differences, want)
	}
	exec(t, p, "SELECT set_config('fence.token', '9', false)")
	_, err = p.Exec(ctx, "UPDATE public."+tb+" SET val = 'leftover' WHERE id = 1")
	wantCode(t, "a pooled role's unbound token, the recorded roles kept", err, "55000")

	// Any other role's session token counts as ever.
	o := pgtest.Connect(t, roleURL(direct))
	exec(t, o, "SET fence.token = '8'")
	if tag := exec(t, o, "UPDATE public."+tb+" SET val = 'direct' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("another role's session token: %s", tag)
	}
	if v, e := rowOf(t, tb, 1); v != "direct" || e != 8 {
		t.Fatalf("another role's write left %q at %d", v, e)
	}
}

// quote is s as a string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
