package backstop_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// asRole is u (a postgres:// URL) with its user replaced by role.
func asRole(u, role string) string {
	p, _ := url.Parse(u)
	p.User = url.User(role)
	return p.String()
}

// wantCode fails the test unless err has SQLSTATE want.
func wantCode(t *testing.T, what string, err error, want string) {
	t.Helper()
	if code(err) != want {
		t.Fatalf("%s: %v, want SQLSTATE %s", what, err, want)
	}
}

// exec runs sql on c and returns its command tag, failing the test on
// error.
func exec(t *testing.T, c *pgx.Conn, sql string) string { t.Helper(); return pgtest.Exec(t, c, sql) }

// domainName is a lock domain name of the test's own.
func domainName(t *testing.T) string {
	sum := sha256.Sum256([]byte(t.Name()))
	return "d_" + hex.EncodeToString(sum[:6])
}

// newDomain creates lock domain d's row (as serve does), removed when the
// test ends.
func newDomain(t *testing.T, d string) {
	t.Helper()
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, "DELETE FROM pgfence.domains WHERE domain = $1", d)
	pgtest.Exec(t, db, sqlrewrite.DomainRowSQL(), d)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DELETE FROM pgfence.domains WHERE domain = $1", d) })
}

func domainToken(t *testing.T, d string) int64 {
	t.Helper()
	var tok int64
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT token FROM pgfence.domains WHERE domain = $1", d).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

// reconcile runs Reconcile on a direct connection as the superuser.
func reconcile(t *testing.T, mode backstop.Mode, o backstop.Options, gs ...sqlrewrite.Guard) *backstop.Report {
	t.Helper()
	o.Replace = true // as installGuards
	r, err := backstop.Reconcile(ctx, pgtest.Direct(t), gs, o, mode)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRejectCounting: the backstop counts every stale row in the
// database (backstop.ReadCounts), even when the transaction rolls back; a
// session through pgfence counts each statement with stale rows once in
// fencing_reject_total{via="backstop",mode="enforce",kind="row"}, never as
// via="rewrite", and its client sees the backstop's notice only with
// NotifyStale; a client straight to Postgres sees it as a NOTICE.
func TestRejectCounting(t *testing.T) {
	pgtest.Need(t)
	base := baseName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 5}, [3]any{2, "b", 5}, [3]any{3, "c", 1}), base+"_s"
	helperSchema(t, s)
	exec(t, pgtest.Direct(t), expand(viewSetup, tb, s, "", 0))
	installGuards(t, backstop.Options{}, guardOf("public", tb))
	staleAll := expand(`UPDATE {s}.v SET val = 'x' WHERE id IN (1, 2)`, tb, s, "", 0)

	// Direct: one per stale row, rolled back or not; one notice per
	// statement and table.
	before := rejects(t, tb)
	c, ns := connectNoticed(t, pgtest.DirectURL(), "3")
	if tag := exec(t, c, staleAll); tag != "UPDATE 0" {
		t.Fatalf("stale: %s", tag)
	}
	exec(t, c, "BEGIN")
	exec(t, c, staleAll)
	exec(t, c, "ROLLBACK")
	if got := rejects(t, tb) - before; got != 4 {
		t.Fatalf("ReadCounts grew by %d, want 4 (2 rows, twice, one transaction rolled back)", got)
	}
	if got := ns.Codes(backstop.CodeStaleNotice); got != 2 {
		t.Fatalf("direct client got %d notices, want 2 (one per statement)", got)
	}
	// A row that is not stale is written and not counted.
	if tag := exec(t, c, expand(`UPDATE {s}.v SET val = 'x' WHERE id = 3`, tb, s, "", 0)); tag != "UPDATE 1" {
		t.Fatalf("fresh row: %s", tag)
	}
	if got := rejects(t, tb) - before; got != 4 {
		t.Fatalf("a fresh row was counted: %d", got)
	}

	for _, notify := range []bool{false, true} {
		t.Run(fmt.Sprintf("proxy_notify_%v", notify), func(t *testing.T) {
			px := backstopProxy(t, []sqlrewrite.Guard{guardOf("public", tb)}, func(fc *fence.Config) { fc.NotifyStale = notify })
			c, ns := connectNoticed(t, px.URL(), "3")
			counter := func(labels ...string) float64 {
				return px.Counter(t, "fencing_reject_total", append([]string{"table=public." + tb}, labels...)...)
			}
			db := rejects(t, tb)
			exec(t, c, staleAll)
			exec(t, c, staleAll)
			if _, err := c.Exec(ctx, staleAll, pgx.QueryExecModeExec); err != nil { // extended protocol
				t.Fatal(err)
			}
			if got := counter("via=backstop", "mode=enforce", "kind=row"); got != 3 {
				t.Errorf(`fencing_reject_total{via="backstop",mode="enforce",kind="row"} = %v, want 3 (statements)`, got)
			}
			if got := counter("via=rewrite"); got != 0 {
				t.Errorf(`backstop rejects counted as via="rewrite": %v`, got)
			}
			// The notices name the epoch that won: 5, over token 3.
			if n, sum := px.Histogram(t, "fencing_token_gap", "table=public."+tb, "kind=row"); n != 3 || sum != 6 {
				t.Errorf("fencing_token_gap from the backstop's notices: count %d sum %v, want 3, 6", n, sum)
			}
			if got := rejects(t, tb) - db; got != 6 {
				t.Errorf("ReadCounts grew by %d, want 6 (rows)", got)
			}
			want := 0
			if notify {
				want = 3
			}
			if got := ns.Codes(backstop.CodeStaleNotice); got != want {
				t.Errorf("NotifyStale=%v: the client got %d backstop notices, want %d", notify, got, want)
			}
			// The rewriter's own rejects are via="rewrite".
			if tag := exec(t, c, "UPDATE public."+tb+" SET val = 'x' WHERE id = 1"); tag != "UPDATE 0" {
				t.Fatalf("fenced UPDATE: %s", tag)
			}
			if got := counter("via=rewrite"); got != 1 {
				t.Errorf(`a rewritten stale write: via="rewrite" = %v, want 1`, got)
			}
			if got := counter("via=backstop"); got != 3 {
				t.Errorf(`a rewritten stale write was also counted via="backstop": %v`, got)
			}
			// A notice with the backstop's code that a client raises
			// itself, made up or as the backstop raised one before, is
			// passed on and not counted.
			detail := "kind=row mode=enforce epoch=9 token=3 rel=1 at=1 mark=0123"
			if notify {
				all := ns.All()
				detail = all[len(all)-1].Detail // a real one, raised again
			}
			before := ns.Codes(backstop.CodeStaleNotice)
			exec(t, c, "DO $$ BEGIN RAISE NOTICE USING ERRCODE = 'PF010', MESSAGE = 'not the backstop', DETAIL = "+
				"'"+detail+"', SCHEMA = 'public', TABLE = '"+tb+"'; END $$")
			if got := counter("via=backstop"); got != 3 {
				t.Errorf(`a client's own notice was counted via="backstop": %v`, got)
			}
			if got := ns.Codes(backstop.CodeStaleNotice) - before; got != 1 {
				t.Errorf("the client's own notice reached it %d times, want 1", got)
			}
		})
	}
}

// TestExemptRoles: an exempt role (Options.ExemptRoles) writes without a
// token, as it writes, and may TRUNCATE; each row is counted
// (Counts.Exempt) and the first of each statement logged in the server
// log. Other roles are still fenced.
func TestExemptRoles(t *testing.T) {
	pgtest.Need(t)
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5}, [3]any{2, "b", 5})
	mig, app := newRole(t, base+"_mig", ""), newRole(t, base+"_app", "")
	db := pgtest.Direct(t)
	exec(t, db, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON public.%s TO %s, %s", tb, mig, app))
	installGuards(t, backstop.Options{ExemptRoles: []string{mig}}, guardOf("public", tb))
	countsOf := func() backstop.Counts {
		c, err := backstop.ReadCounts(ctx, pgtest.Direct(t))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// The application role is fenced.
	a := pgtest.Connect(t, roleURL(app))
	_, err := a.Exec(ctx, "UPDATE public."+tb+" SET val = 'app' WHERE id = 1")
	wantCode(t, "no token, not exempt", err, "55000")
	exec(t, a, "SET fence.token = '3'")
	if tag := exec(t, a, "UPDATE public."+tb+" SET val = 'app' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale, not exempt: %s", tag)
	}
	_, err = a.Exec(ctx, "TRUNCATE public."+tb)
	wantCode(t, "TRUNCATE, not exempt", err, "0A000")

	// The exempt role is not.
	before := countsOf()
	m := pgtest.Connect(t, roleURL(mig))
	if tag := exec(t, m, "UPDATE public."+tb+" SET val = 'mig', fence_epoch = 6 WHERE id IN (1, 2)"); tag != "UPDATE 2" {
		t.Fatalf("exempt role without a token: %s", tag)
	}
	if v, e := rowOf(t, tb, 1); v != "mig" || e != 6 {
		t.Fatalf("exempt write: %q, %d; want it as written", v, e)
	}
	exec(t, m, "SET fence.token = '3'")
	if tag := exec(t, m, "DELETE FROM public."+tb+" WHERE id = 2"); tag != "DELETE 1" {
		t.Fatalf("exempt role with a stale token: %s", tag)
	}
	after := countsOf()
	if got := after.Exempt - before.Exempt; got != 3 {
		t.Errorf("Counts.Exempt grew by %d, want 3", got)
	}
	if got := after.Rejects["public."+tb] - before.Rejects["public."+tb]; got != 0 {
		t.Errorf("exempt writes counted as rejects: %d", got)
	}
	audit := "pgfence: role " + mig + " (session user " + mig + ") wrote guarded table public." + tb + " without the fence"
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(pgtest.Server().LogTail(), audit) {
		if time.Now().After(deadline) {
			t.Fatalf("the server log has no audit line %q; tail:\n%s", audit, pgtest.Server().LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	exec(t, m, "TRUNCATE public."+tb)
	if exists(t, tb, 1) {
		t.Fatal("exempt TRUNCATE left the row")
	}
}

// TestReplicationRole: logical-replication apply (session_replication_role
// = replica) is not fenced a second time: its writes land as the publisher
// made them, and nothing is counted; only a superuser can set it.
func TestReplicationRole(t *testing.T) {
	base := baseName(t)
	tb := guarded(t, base, [3]any{1, "a", 5})
	app := newRole(t, base+"_app", "")
	exec(t, pgtest.Direct(t), fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON public.%s TO %s", tb, app))
	installGuards(t, backstop.Options{}, guardOf("public", tb))
	before := rejects(t, tb)

	apply := session(t, "3") // a token the apply worker would not have; ignored
	exec(t, apply, "SET session_replication_role = replica")
	if tag := exec(t, apply, "UPDATE public."+tb+" SET val = 'replicated', fence_epoch = 4 WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("replica apply: %s", tag)
	}
	if v, e := rowOf(t, tb, 1); v != "replicated" || e != 4 {
		t.Fatalf("replica apply: row %q, %d; want it as the publisher wrote it", v, e)
	}
	exec(t, apply, "RESET fence.token")
	if tag := exec(t, apply, "INSERT INTO public."+tb+" VALUES (2, 'r', 9)"); tag != "INSERT 0 1" {
		t.Fatalf("replica apply INSERT: %s", tag)
	}
	if _, e := rowOf(t, tb, 2); e != 9 {
		t.Fatalf("replica apply INSERT: epoch %d, want 9", e)
	}
	if got := rejects(t, tb) - before; got != 0 {
		t.Fatalf("replica apply counted %d rejects", got)
	}
	_, err := pgtest.Connect(t, roleURL(app)).Exec(ctx, "SET session_replication_role = replica")
	wantCode(t, "an application role setting session_replication_role", err, "42501")
}

// TestDomainRowsGuard: a non-superuser application role with only table
// privileges on a guarded table in a lock domain writes through the
// backstop (straight to Postgres and through pgfence), which claims the
// domain for it; it cannot lower or delete the domain's token, nor turn
// the backstop off.
func TestDomainRowsGuard(t *testing.T) {
	base := baseName(t)
	d := domainName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 0}, [3]any{2, "b", 0}), base+"_s"
	helperSchema(t, s)
	app := newRole(t, base+"_app", "")
	db := pgtest.Direct(t)
	exec(t, db, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON public.%s TO %s", tb, app))
	newDomain(t, d)
	g := guardOf("public", tb)
	g.Domain = d
	installGuards(t, backstop.Options{}, g)

	a := pgtest.Connect(t, roleURL(app))
	exec(t, a, "SET fence.token = '7'")
	if tag := exec(t, a, "UPDATE public."+tb+" SET val = 'seven' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("fresh domain write: %s", tag)
	}
	if tok := domainToken(t, d); tok != 7 {
		t.Fatalf("domain token %d after a write with 7", tok)
	}
	// A stale token: row 2 (epoch 0, never written at 7) is not written
	// either, and a stale INSERT fails.
	before := rejects(t, tb)
	exec(t, a, "SET fence.token = '6'")
	if tag := exec(t, a, "UPDATE public."+tb+" SET val = 'six' WHERE id = 2"); tag != "UPDATE 0" {
		t.Fatalf("stale domain write: %s", tag)
	}
	_, err := a.Exec(ctx, "INSERT INTO public."+tb+" (id, val) VALUES (3, 'six')")
	wantCode(t, "stale domain INSERT", err, "PF001")
	if got := rejects(t, tb) - before; got != 2 {
		t.Errorf("domain rejects counted: %d, want 2", got)
	}

	// The domain's row is pgfence's.
	for _, sql := range []string{
		"UPDATE pgfence.domains SET token = 0 WHERE domain = '" + d + "'",
		"UPDATE pgfence.domains SET domain = 'x' WHERE domain = '" + d + "'",
		"DELETE FROM pgfence.domains WHERE domain = '" + d + "'",
		"TRUNCATE pgfence.domains",
		"INSERT INTO pgfence.domains VALUES ('" + d + "_2', 0)",
		"ALTER TABLE public." + tb + " DISABLE TRIGGER ALL",
		"DROP TRIGGER \"" + backstop.RowTrigger + "\" ON public." + tb,
		"CREATE OR REPLACE FUNCTION pgfence.claim_domain(d text, tok bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
		"SET session_replication_role = replica",
		"SELECT pg_catalog.setval(('pgfence.rejects_' || 'public." + tb + "'::regclass::oid)::regclass, 1)",
	} {
		_, err := a.Exec(ctx, sql)
		wantCode(t, sql, err, "42501")
	}
	if tok := domainToken(t, d); tok != 7 {
		t.Fatalf("domain token %d, want 7", tok)
	}

	// Through pgfence, as the same role: the rewriter's claim and, for a
	// write it cannot see (a DO block), the backstop's.
	px := backstopProxy(t, []sqlrewrite.Guard{g})
	p := pgtest.Connect(t, asRole(px.URL(), app))
	exec(t, p, "SET fence.token = '8'")
	if tag := exec(t, p, "UPDATE public."+tb+" SET val = 'eight' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("fresh write through pgfence: %s", tag)
	}
	exec(t, p, "SET fence.token = '9'")
	exec(t, p, "DO $$ BEGIN UPDATE public."+tb+" SET val = 'nine' WHERE id = 2; END $$")
	if v, e := rowOf(t, tb, 2); v != "nine" || e != 9 || domainToken(t, d) != 9 {
		t.Fatalf("fresh DO block through pgfence: row %q, %d, domain token %d", v, e, domainToken(t, d))
	}
	pxBefore := px.Counter(t, "fencing_reject_total", "table=public."+tb, "via=backstop", "kind=domain")
	exec(t, p, "SET fence.token = '8'")
	exec(t, p, "DO $$ BEGIN UPDATE public."+tb+" SET val = 'stale' WHERE id = 1; END $$")
	if v, _ := rowOf(t, tb, 1); v != "eight" {
		t.Fatalf("stale DO block through pgfence wrote row 1: %q", v)
	}
	if got := px.Counter(t, "fencing_reject_total", "table=public."+tb, "via=backstop", "kind=domain") - pxBefore; got != 1 {
		t.Errorf(`fencing_reject_total{via="backstop",kind="domain"} grew by %v, want 1`, got)
	}
	_, err = p.Exec(ctx, "UPDATE pgfence.domains SET token = 0 WHERE domain = '"+d+"'")
	wantCode(t, "lowering the token through pgfence", err, "42501")
}

// TestDomainPrecedence: for a table in a lock domain, the domain's own
// setting (fence.token.<domain>) is the token; both it and fence.token set
// to different non-empty values is 22023, straight to Postgres and for a
// write pgfence cannot see, and nothing is written.
func TestDomainPrecedence(t *testing.T) {
	pgtest.Need(t)
	base := baseName(t)
	d := domainName(t)
	tb := guarded(t, base, [3]any{1, "a", 0})
	newDomain(t, d)
	g := guardOf("public", tb)
	g.Domain = d
	installGuards(t, backstop.Options{}, g)
	px := backstopProxy(t, []sqlrewrite.Guard{g})
	write := "DO $$ BEGIN UPDATE public." + tb + " SET val = 'x' WHERE id = 1; END $$"
	for _, u := range []string{pgtest.DirectURL(), px.URL()} {
		c := pgtest.Connect(t, u)
		exec(t, c, "SET fence.token = '40'")
		exec(t, c, "SET fence.token."+d+" = '50'")
		_, err := c.Exec(ctx, write)
		wantCode(t, "both settings, different", err, "22023")
		if v, e := rowOf(t, tb, 1); v != "a" || e != 0 {
			t.Fatalf("conflicting tokens wrote: %q, %d", v, e)
		}
		exec(t, c, "SET fence.token = '50'")
		exec(t, c, write)
		if _, e := rowOf(t, tb, 1); e != 50 {
			t.Fatalf("both settings the same: epoch %d, want 50", e)
		}
		exec(t, c, "RESET fence.token")
		exec(t, c, "SET fence.token."+d+" = '60'")
		exec(t, c, write)
		if _, e := rowOf(t, tb, 1); e != 60 {
			t.Fatalf("only the domain's setting: epoch %d, want 60", e)
		}
		exec(t, c, "UPDATE public."+tb+" SET val = 'a' WHERE id = 1")
		exec(t, pgtest.Direct(t), "UPDATE pgfence.domains SET token = 0 WHERE domain = '"+d+"'; "+
			"ALTER TABLE public."+tb+" DISABLE TRIGGER \""+backstop.RowTrigger+"\"; "+
			"UPDATE public."+tb+" SET fence_epoch = 0; "+
			"ALTER TABLE public."+tb+" ENABLE TRIGGER \""+backstop.RowTrigger+"\"")
	}
}

// TestTokens: the token is read as the rewriter reads it. Enforce: none
// or empty is 55000, not a number 22023, no int8 Postgres's own error;
// SET LOCAL holds for its transaction.
func TestTokens(t *testing.T) {
	base := baseName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 5}), base+"_s"
	helperSchema(t, s)
	exec(t, pgtest.Direct(t), expand(viewSetup, tb, s, "", 0))
	installGuards(t, backstop.Options{}, guardOf("public", tb))
	write := expand(`UPDATE {s}.v SET val = 'x' WHERE id = 1`, tb, s, "", 0)
	for _, c := range []struct{ tok, code string }{
		{"", "55000"}, {"abc", "22023"}, {"7;", "22023"}, {"1-2", "22P02"}, {"99999999999999999999", "22003"},
	} {
		conn := pgtest.Direct(t)
		exec(t, conn, "SET fence.token = '"+c.tok+"'")
		_, err := conn.Exec(ctx, write)
		wantCode(t, fmt.Sprintf("token %q", c.tok), err, c.code)
	}
	if v, e := rowOf(t, tb, 1); v != "a" || e != 5 {
		t.Fatalf("a bad token wrote: %q, %d", v, e)
	}
	conn := pgtest.Direct(t)
	exec(t, conn, "BEGIN")
	exec(t, conn, "SET LOCAL fence.token = ' 7 '")
	if tag := exec(t, conn, write); tag != "UPDATE 1" {
		t.Fatalf("SET LOCAL token: %s", tag)
	}
	exec(t, conn, "COMMIT")
	_, err := conn.Exec(ctx, write)
	wantCode(t, "after the SET LOCAL's transaction", err, "55000")
	if _, e := rowOf(t, tb, 1); e != 7 {
		t.Fatalf("epoch %d, want 7", e)
	}
}

// TestShadow: in shadow mode every write lands; a stale row keeps its
// epoch (never lowered) and is counted in the database (no notice: a
// write pgfence rewrites is counted once, via="rewrite"); a fresh one is
// stamped; a missing or malformed token fences and fails nothing (an
// INSERT is stamped 0).
func TestShadow(t *testing.T) {
	pgtest.Need(t)
	base := baseName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 5}, [3]any{2, "b", 5}), base+"_s"
	helperSchema(t, s)
	exec(t, pgtest.Direct(t), expand(viewSetup, tb, s, "", 0))
	g := guardOf("public", tb)
	g.Rollout = sqlrewrite.Shadow
	installGuards(t, backstop.Options{}, g)
	w := func(sql string) string { return expand(sql, tb, s, "", 0) }

	before := rejects(t, tb)
	c, ns := connectNoticed(t, pgtest.DirectURL(), "3")
	if tag := exec(t, c, w(`UPDATE {s}.v SET val = 'stale', fence_epoch = 1 WHERE id = 1`)); tag != "UPDATE 1" {
		t.Fatalf("shadow stale write: %s", tag)
	}
	if v, e := rowOf(t, tb, 1); v != "stale" || e != 5 {
		t.Fatalf("shadow stale write: %q, %d; want it landed with epoch 5 kept", v, e)
	}
	if got := rejects(t, tb) - before; got != 1 {
		t.Errorf("shadow stale write counted %d, want 1", got)
	}
	if got := ns.Codes(backstop.CodeStaleNotice); got != 0 {
		t.Errorf("a shadow write raised %d notices (schema.go: counted only in the database)", got)
	}
	exec(t, c, "SET fence.token = '7'")
	exec(t, c, w(`UPDATE {s}.v SET val = 'fresh', fence_epoch = 999 WHERE id = 1`))
	if v, e := rowOf(t, tb, 1); v != "fresh" || e != 7 {
		t.Fatalf("shadow fresh write: %q, %d", v, e)
	}
	for _, tok := range []string{"", "abc"} {
		n := pgtest.Direct(t)
		exec(t, n, "SET fence.token = '"+tok+"'")
		exec(t, n, w(`UPDATE {s}.v SET val = 'none', fence_epoch = 1 WHERE id = 1`))
		if v, e := rowOf(t, tb, 1); v != "none" || e != 7 {
			t.Fatalf("shadow, token %q: %q, %d; want it landed, epoch kept", tok, v, e)
		}
		exec(t, n, w(`INSERT INTO {s}.v VALUES (3, 'none', 999)`))
		if _, e := rowOf(t, tb, 3); e != 0 {
			t.Fatalf("shadow INSERT, token %q: epoch %d, want 0", tok, e)
		}
		exec(t, n, w(`DELETE FROM {s}.v WHERE id = 3`))
	}

	px := backstopProxy(t, []sqlrewrite.Guard{g})
	p, pns := connectNoticed(t, px.URL(), "3")
	before = rejects(t, tb)
	exec(t, p, w(`DO $$ BEGIN UPDATE {s}.v SET val = 'stale2' WHERE id = 2; END $$`))
	if v, e := rowOf(t, tb, 2); v != "stale2" || e != 5 {
		t.Fatalf("shadow stale write through pgfence: %q, %d", v, e)
	}
	if got := rejects(t, tb) - before; got != 1 {
		t.Errorf("ReadCounts: %d, want 1", got)
	}
	// A write pgfence rewrites is counted once, by the rewrite, though
	// the backstop sees its stale row too (it lands).
	exec(t, p, "UPDATE public."+tb+" SET val = 'stale3' WHERE id = 2")
	if v, e := rowOf(t, tb, 2); v != "stale3" || e != 5 {
		t.Fatalf("shadow stale write rewritten by pgfence: %q, %d", v, e)
	}
	if got := px.Counter(t, "fencing_reject_total", "table=public."+tb, "via=rewrite", "mode=shadow"); got != 1 {
		t.Errorf(`fencing_reject_total{via="rewrite",mode="shadow"} = %v, want 1`, got)
	}
	if got := px.Counter(t, "fencing_reject_total", "table=public."+tb, "via=backstop"); got != 0 {
		t.Errorf(`shadow: fencing_reject_total{via="backstop"} = %v, want 0 (counted in the database only)`, got)
	}
	if got := rejects(t, tb) - before; got != 2 {
		t.Errorf("ReadCounts: %d, want 2", got)
	}
	if pns.Codes(backstop.CodeStaleNotice) != 0 {
		t.Errorf("a client of pgfence got the backstop's notice")
	}
}

// TestAllowMissingToken: with the missing-token policy "allow", a write
// without a token lands unfenced, its rows keep their epoch and a forged
// epoch is not taken (an INSERT is stamped 0, as the rewriter stamps it);
// a token that is set is enforced; one that is no integer still fails.
func TestAllowMissingToken(t *testing.T) {
	pgtest.Need(t)
	base := baseName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 5}, [3]any{2, "b", 5}), base+"_s"
	helperSchema(t, s)
	exec(t, pgtest.Direct(t), expand(viewSetup, tb, s, "", 0))
	g := guardOf("public", tb)
	g.AllowMissingToken = true
	installGuards(t, backstop.Options{}, g)
	w := func(sql string) string { return expand(sql, tb, s, "", 0) }

	for _, u := range []string{pgtest.DirectURL(), backstopProxy(t, []sqlrewrite.Guard{g}).URL()} {
		c := pgtest.Connect(t, u)
		if tag := exec(t, c, w(`DO $$ BEGIN UPDATE {s}.v SET val = 'none', fence_epoch = 999 WHERE id = 1; END $$`)); tag != "DO" {
			t.Fatal(tag)
		}
		if v, e := rowOf(t, tb, 1); v != "none" || e != 5 {
			t.Fatalf("no token, allowed: %q, %d; want it landed with epoch 5 kept", v, e)
		}
		exec(t, c, w(`DO $$ BEGIN INSERT INTO {s}.v VALUES (3, 'none', 999); END $$`))
		if _, e := rowOf(t, tb, 3); e != 0 {
			t.Fatalf("no token, allowed: INSERT with a forged epoch landed with epoch %d, want 0", e)
		}
		exec(t, c, w(`DO $$ BEGIN DELETE FROM {s}.v WHERE id = 3; END $$`))
		if exists(t, tb, 3) {
			t.Fatal("no token, allowed: DELETE did not land")
		}
		exec(t, c, "SET fence.token = '3'")
		exec(t, c, w(`DO $$ BEGIN UPDATE {s}.v SET val = 'stale' WHERE id = 1; END $$`))
		if v, _ := rowOf(t, tb, 1); v != "none" {
			t.Fatalf("a stale token set under allow: %q", v)
		}
		exec(t, c, "SET fence.token = 'abc'")
		_, err := c.Exec(ctx, w(`DO $$ BEGIN UPDATE {s}.v SET val = 'bad' WHERE id = 1; END $$`))
		wantCode(t, "a malformed token under allow", err, "22023")
	}
}

// triggerState reads how a table's backstop triggers stand:
// "name:function:enabled" for each.
func triggerState(t *testing.T, tb string) string {
	return query(t, `SELECT string_agg(t.tgname || ':' || p.proname || ':' || t.tgenabled::text, ' ' ORDER BY t.tgname)
		FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgrelid = 'public.`+tb+`'::regclass AND t.tgname LIKE '~pgfence%'`)
}

func oneTable(t *testing.T, r *backstop.Report) backstop.Table {
	t.Helper()
	if len(r.Tables) != 1 {
		t.Fatalf("report has %d tables", len(r.Tables))
	}
	return r.Tables[0]
}

// TestDrift: Reconcile(Verify) reports what keeps the backstop from doing
// its work, changing nothing; Reconcile(Install) repairs it and the fence
// holds again.
func TestDrift(t *testing.T) {
	base := baseName(t)
	tb, s := guarded(t, base, [3]any{1, "a", 5}), base+"_s"
	helperSchema(t, s)
	exec(t, pgtest.Direct(t), "CREATE FUNCTION "+s+".mine() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$")
	// An exempt role of the test's own makes its functions its own, so
	// editing them touches no other test.
	o := backstop.Options{ExemptRoles: []string{base + "_nobody"}}
	g := guardOf("public", tb)
	fn, _ := backstop.RowFunction(g, o)
	tfn, _ := backstop.TruncateFunction(o)
	table := "public." + tb
	oid := query(t, "SELECT '"+table+"'::regclass::oid")

	fenced := func(t *testing.T) {
		t.Helper()
		if tag := exec(t, session(t, "3"), "UPDATE "+table+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
			t.Fatalf("the fence does not hold: %s", tag)
		}
	}
	cases := []struct {
		name    string
		drift   string // SQL
		problem string // in Verify's Problem
		changed string // in Install's Changed
	}{
		{"row_trigger_disabled", `ALTER TABLE {table} DISABLE TRIGGER "~pgfence_backstop"`, "is disabled", "enabled"},
		{"row_trigger_enabled_always", `ALTER TABLE {table} ENABLE ALWAYS TRIGGER "~pgfence_backstop"`, "is enabled always", "enabled"},
		{"row_trigger_enabled_replica", `ALTER TABLE {table} ENABLE REPLICA TRIGGER "~pgfence_backstop"`, "is enabled for replicas only", "enabled"},
		{"all_triggers_disabled", `ALTER TABLE {table} DISABLE TRIGGER ALL`, "is disabled", "enabled"},
		{"function_edited", `CREATE OR REPLACE FUNCTION pgfence.{fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`,
			"was edited by hand", ""},
		{"row_trigger_dropped", `DROP TRIGGER "~pgfence_backstop" ON {table}`, "has no backstop trigger", "created"},
		{"row_trigger_replaced", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OR DELETE ON {table}
			FOR EACH ROW EXECUTE FUNCTION {s}.mine()`, "runs " + s + ".mine, not pgfence." + fn.Name, "updated"},
		{"row_trigger_when_false", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OR DELETE ON {table}
			FOR EACH ROW WHEN (false) EXECUTE FUNCTION pgfence.{fn}()`, "is not as pgfence creates it", "updated"},
		{"row_trigger_insert_only", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT ON {table}
			FOR EACH ROW EXECUTE FUNCTION pgfence.{fn}()`, "is not as pgfence creates it", "updated"},
		{"row_trigger_after", `CREATE OR REPLACE TRIGGER "~pgfence_backstop" AFTER INSERT OR UPDATE OR DELETE ON {table}
			FOR EACH ROW EXECUTE FUNCTION pgfence.{fn}()`, "is not as pgfence creates it", "updated"},
		{"truncate_trigger_when_false", `CREATE OR REPLACE TRIGGER "~pgfence_backstop_truncate" BEFORE TRUNCATE ON {table}
			FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION pgfence.{tfn}()`, "TRUNCATE backstop trigger of table " + table + " is not pgfence's", "TRUNCATE trigger set"},
		{"truncate_trigger_disabled", `ALTER TABLE {table} DISABLE TRIGGER "~pgfence_backstop_truncate"`, "TRUNCATE backstop trigger of table " + table + " is disabled", "TRUNCATE trigger enabled"},
		{"truncate_trigger_dropped", `DROP TRIGGER "~pgfence_backstop_truncate" ON {table}`, "has no TRUNCATE backstop trigger", "TRUNCATE trigger set"},
		{"counter_dropped", `DROP SEQUENCE pgfence.rejects_{oid}`, "has no reject counter pgfence.rejects_" + oid, ""},
	}

	if err := backstop.Setup(ctx, pgtest.Direct(t)); err != nil { // else Verify says to run pgfence init
		t.Fatal(err)
	}
	r := oneTable(t, reconcile(t, backstop.Verify, o, g))
	if r.OK || !strings.Contains(r.Problem, "has no backstop trigger") {
		t.Fatalf("Verify before Install: %+v", r)
	}
	if st := triggerState(t, tb); st != "<null>" {
		t.Fatalf("Verify installed something: %s", st)
	}
	if r := oneTable(t, reconcile(t, backstop.Install, o, g)); !r.OK || r.Changed != "created" {
		t.Fatalf("Install: %+v", r)
	}
	fenced(t)
	want := triggerState(t, tb)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			exec(t, pgtest.Direct(t), strings.NewReplacer("{table}", table, "{fn}", fn.Name, "{tfn}", tfn.Name, "{s}", s, "{oid}", oid).Replace(c.drift))
			drifted := triggerState(t, tb)
			r := oneTable(t, reconcile(t, backstop.Verify, o, g))
			if r.OK || !strings.Contains(r.Problem, c.problem) || r.Changed != "" {
				t.Fatalf("Verify: OK %v, Problem %q, Changed %q; want a Problem with %q", r.OK, r.Problem, r.Changed, c.problem)
			}
			if got := triggerState(t, tb); got != drifted {
				t.Fatalf("Verify changed the triggers: %s, was %s", got, drifted)
			}
			r = oneTable(t, reconcile(t, backstop.Install, o, g))
			if !r.OK || !strings.Contains(r.Changed, c.changed) {
				t.Fatalf("Install: OK %v, Problem %q, Changed %q; want Changed with %q", r.OK, r.Problem, r.Changed, c.changed)
			}
			if got := triggerState(t, tb); got != want {
				t.Fatalf("after Install: %s, want %s", got, want)
			}
			if got := query(t, "SELECT prosrc FROM pg_proc WHERE proname = '"+fn.Name+"'"); got != fn.Body {
				t.Fatal("the function's body is not repaired")
			}
			if got := query(t, "SELECT prosrc FROM pg_proc WHERE proname = '"+tfn.Name+"'"); got != tfn.Body {
				t.Fatal("the TRUNCATE function's body is not repaired")
			}
			fenced(t)
			if r := oneTable(t, reconcile(t, backstop.Verify, o, g)); !r.OK {
				t.Fatalf("Verify after Install: %s", r.Problem)
			}
		})
	}

	// A table that carries the backstop but is not guarded is reported.
	other := guarded(t, base+"_o")
	exec(t, pgtest.Direct(t), `CREATE TRIGGER "~pgfence_backstop" BEFORE UPDATE ON public.`+other+` FOR EACH ROW EXECUTE FUNCTION `+s+`.mine()`)
	rep := reconcile(t, backstop.Verify, o, g)
	found := false
	for _, p := range rep.Problems {
		found = found || strings.Contains(p, other) && strings.Contains(p, "not guarded")
	}
	if !found {
		t.Fatalf("stray table %s not reported: %q", other, rep.Problems)
	}
}

// TestNotOwner: when pgfence's role may not create the triggers on a
// table (another role owns it and granted it no TRIGGER), Reconcile says
// so in that table's Problem, clearly, with the GRANT that would let it,
// and installs the backstop on the tables it may.
func TestNotOwner(t *testing.T) {
	base := baseName(t)
	mine, theirs := guarded(t, base+"_m", [3]any{1, "a", 5}), guarded(t, base+"_t", [3]any{1, "a", 5})
	// pgfence's role: not a superuser, a member of the owner of pgfence's
	// schema objects (here the bootstrap superuser), owning one table.
	pf, owner := newRole(t, base+"_pf", ""), newRole(t, base+"_own", "")
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	exec(t, db, "GRANT postgres TO "+pf)
	exec(t, db, "ALTER TABLE public."+mine+" OWNER TO "+pf)
	exec(t, db, "ALTER TABLE public."+theirs+" OWNER TO "+owner)
	exec(t, db, "GRANT SELECT, UPDATE ON public."+theirs+" TO "+pf)
	conn := pgtest.Connect(t, roleURL(pf))
	gs := []sqlrewrite.Guard{guardOf("public", mine), guardOf("public", theirs)}
	for _, mode := range []backstop.Mode{backstop.Install, backstop.Verify} {
		r, err := backstop.Reconcile(ctx, conn, gs, backstop.Options{Replace: true}, mode)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if !r.Tables[0].OK {
			t.Fatalf("mode %v: the table pgfence's role owns: %s", mode, r.Tables[0].Problem)
		}
		p := r.Tables[1]
		if p.OK || r.Missing() != 1 {
			t.Fatalf("mode %v: the other role's table: %+v", mode, p)
		}
		if mode == backstop.Install {
			for _, want := range []string{"cannot install the backstop on table public." + theirs, "needs the TRIGGER privilege", "pgfence still fences what it sees"} {
				if !strings.Contains(p.Problem, want) {
					t.Errorf("Problem %q does not say %q", p.Problem, want)
				}
			}
			if grant := `GRANT TRIGGER ON TABLE "public"."` + theirs + `" TO "` + pf + `";`; !slices.Equal(r.Grants, []string{grant}) {
				t.Errorf("Grants %q, want [%s]", r.Grants, grant)
			}
			t.Logf("Problem: %s", p.Problem)
		} else if !strings.Contains(p.Problem, "has no backstop trigger") {
			t.Errorf("Verify: %q", p.Problem)
		}
	}
	if st := triggerState(t, theirs); st != "<null>" {
		t.Fatalf("triggers on the other role's table: %s", st)
	}
}

// TestReconcileIdempotent: a second Install changes nothing: no table
// reported changed, no trigger or function of the backstop rewritten, and
// it does not wait on (or for) writers holding a lock domain's row.
func TestReconcileIdempotent(t *testing.T) {
	base := baseName(t)
	d := domainName(t)
	a, b := guarded(t, base+"_a", [3]any{1, "a", 0}), guarded(t, base+"_b", [3]any{1, "a", 0})
	newDomain(t, d)
	ga, gb := guardOf("public", a), guardOf("public", b)
	gb.Domain, gb.Rollout = d, sqlrewrite.Enforce
	ga.Rollout = sqlrewrite.Shadow
	o := backstop.Options{Replace: true}
	installGuards(t, o, ga, gb)
	catalog := func() string {
		return query(t, `SELECT string_agg(x, ' ' ORDER BY x) FROM (
			SELECT t.tgrelid::regclass || '.' || t.tgname || '@' || t.xmin AS x FROM pg_trigger t
			  WHERE t.tgrelid IN ('public.`+a+`'::regclass, 'public.`+b+`'::regclass, 'pgfence.domains'::regclass)
			UNION ALL
			SELECT p.proname || '@' || p.xmin FROM pg_proc p WHERE p.pronamespace = 'pgfence'::regnamespace
			UNION ALL
			SELECT c.relname || '@' || c.xmin FROM pg_class c WHERE c.relnamespace = 'pgfence'::regnamespace) s`)
	}
	before := catalog()

	// A writer in the lock domain holds its row, and its transaction open.
	w := session(t, "7")
	exec(t, w, "BEGIN")
	if tag := exec(t, w, "UPDATE public."+b+" SET val = 'w' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("writer: %s", tag)
	}
	defer exec(t, w, "ROLLBACK")

	c, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	r, err := backstop.Reconcile(c, pgtest.Direct(t), []sqlrewrite.Guard{ga, gb}, o, backstop.Install)
	if err != nil {
		t.Fatalf("second Install, with a writer in the domain: %v (after %v)", err, time.Since(start))
	}
	for _, tb := range r.Tables {
		if !tb.OK || tb.Changed != "" {
			t.Errorf("second Install: %s: OK %v, Changed %q, Problem %q", tb.Guard.Name(), tb.OK, tb.Changed, tb.Problem)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("second Install took %v with a writer in the domain", d)
	}
	if after := catalog(); after != before {
		t.Errorf("second Install rewrote the catalog:\nbefore %s\nafter  %s", before, after)
	}
}
