package fence_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// staleNotices is a proxy edit for a database with the backstop's helpers
// in place: fenced writes may go without their probe (see fence/quiet.go).
func staleNotices(t *testing.T) func(*proxy.Config, *fence.Config) {
	t.Helper()
	if err := backstop.Setup(ctx, pgtest.Direct(t)); err != nil {
		t.Fatal(err)
	}
	return func(pc *proxy.Config, fc *fence.Config) {
		fc.StaleNotice = true
		pc.GoroutineRelay = false // only the event loop answers SETs
	}
}

// noticed connects through p and collects the notices the client gets.
func noticed(t *testing.T, p *pgtest.Proxy) (*pgx.Conn, func() []*pgconn.Notice) {
	t.Helper()
	c, ns := pgtest.ConnectNoticed(t, p.URL())
	return c, ns.All
}

// TestQuietWrites: where the backstop's helpers are in place, a fenced
// write right after a SET pgfence answered goes without its probe: its
// stale rows raise notices, which pgfence counts and keeps from the
// client, and its token is the one pgfence set ahead of it. Everything
// counts as with the probe; a write pgfence cannot take the token of
// still runs its probe, and is counted once.
func TestQuietWrites(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0}, [3]any{2, "y", 0})
	p := pgtest.StartProxy(t, []string{tbl}, staleNotices(t))
	c, notices := noticed(t, p)
	// write sets the token (unless tok is "") and runs sql, which must
	// answer tag; then the probes left out must be left, as why says.
	write := func(tok, sql, tag string, left float64, why string) {
		t.Helper()
		if tok != "" {
			pgtest.Exec(t, c, "SET fence.token = '"+tok+"'")
		}
		if got := pgtest.Exec(t, c, sql); got != tag {
			t.Fatalf("%s: %s, want %s", sql, got, tag)
		}
		if got := p.Counter(t, "pgfence_probes_left_out_total"); got != left {
			t.Fatalf("probes left out: %v after %s, want %v", got, why, left)
		}
	}
	rejects := func(want float64, why string) {
		t.Helper()
		if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=row"); got != want {
			t.Fatalf("%s: %v rejects, want %v", why, got, want)
		}
	}
	accepted := func(want float64) {
		t.Helper()
		if got := p.Counter(t, "pgfence_token_accepted_max", "table="+tbl); got != want {
			t.Errorf("token accepted: %v, want %v", got, want)
		}
	}

	// Fresh: counted as set, its token accepted, no probe.
	write("43", "UPDATE "+tbl+" SET val = 'B' WHERE id = 1", "UPDATE 1", 1, "a fresh write right after its SET")
	if got := p.Counter(t, "pgfence_guarded_writes_total", "table="+tbl, "token=set"); got != 1 {
		t.Errorf("guarded writes with a token: %v, want 1", got)
	}
	accepted(43)

	// Stale, on two rows: one reject, with its gap, and no notice shown.
	pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+" SET fence_epoch = 45")
	write("42", "UPDATE "+tbl+" SET val = 'A'", "UPDATE 0", 2, "a stale write right after its SET")
	rejects(1, "a stale write on two rows")
	if n, sum := p.Histogram(t, "fencing_token_gap", "table="+tbl); n != 1 || sum != 3 {
		t.Errorf("token gap: %d samples summing %v, want 1 of 3 (45 - 42)", n, sum)
	}
	accepted(43)
	if !strings.Contains(p.Logs.String(), "token=42 epoch=45") {
		t.Errorf("the reject's log line lacks its token and epoch:\n%s", p.Logs.String())
	}

	// A second write under the same SET: pgfence did not set the token
	// right ahead of it, so the probe runs, and counts the stale write once.
	write("", "UPDATE "+tbl+" SET val = 'A' WHERE id = 2", "UPDATE 0", 2, "a write whose token pgfence did not just set")
	rejects(2, "a probed stale write")
	for _, n := range notices() {
		t.Errorf("the client got a notice: %s %s (%s)", n.Code, n.Message, n.Detail)
	}

	// A session whose write went without its probe and was stale has its
	// next writes probed, which then raise no notice, until one is fresh.
	write("42", "UPDATE "+tbl+" SET val = 'A' WHERE id = 2", "UPDATE 0", 2, "a stale write right after a stale one")
	rejects(3, "a probed stale write")
	write("46", "UPDATE "+tbl+" SET val = 'C' WHERE id = 2", "UPDATE 1", 2, "the first fresh write since")
	write("46", "UPDATE "+tbl+" SET val = 'D' WHERE id = 2", "UPDATE 1", 3, "a fresh write once a probed one was fresh")
	accepted(46)

	// A notice a client raises itself, outside a write of its own, counts
	// nothing and is not shown.
	pgtest.Exec(t, c, "SELECT pgfence.raise_stale('pgfence.stale_0', 'x:99')")
	// Nor may it set the mark that has the helper raise one.
	if _, err := c.Exec(ctx, "SELECT set_config('pgfence.quiet', 'on', false)"); pgErr(t, err).Code != "42501" {
		t.Errorf("a client set pgfence.quiet: %v, want 42501", err)
	}
	rejects(3, "a client's own call of the helper")
	if n := notices(); len(n) != 0 {
		t.Errorf("the client got %d notices, want none", len(n))
	}
}

// TestQuietDomainWrites: the same in a lock domain, where a SET of the
// token setting alone tells the token of a strict write (a domain setting
// that differs would fail it), and a domain's flag is a domain reject.
func TestQuietDomainWrites(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0}, [3]any{2, "y", 0})
	p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "quiet"), staleNotices(t))
	out := func() float64 { return p.Counter(t, "pgfence_probes_left_out_total") }
	a, b := p.Connect(t), p.Connect(t)
	pgtest.Exec(t, b, "SET fence.token = '43'")
	if tag := pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B' WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("fresh write: %s", tag)
	}
	pgtest.Exec(t, a, "SET fence.token = '42'")
	if tag := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'A' WHERE id = 2"); tag != "UPDATE 0" {
		t.Fatalf("stale write to a row the newer holder never touched: %s", tag)
	}
	if got := out(); got != 2 {
		t.Fatalf("probes left out: %v, want 2", got)
	}
	if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=domain"); got != 1 {
		t.Fatalf("domain rejects: %v, want 1", got)
	}
	if got := p.Counter(t, "pgfence_domain_token_accepted_max", "domain=quiet"); got != 43 {
		t.Errorf("domain token accepted: %v, want 43", got)
	}

	// The domain's own setting set ahead of the write is its token.
	pgtest.Exec(t, a, "RESET fence.token")
	pgtest.Exec(t, a, "SET fence.token.quiet = '44'")
	if tag := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'A' WHERE id = 2"); tag != "UPDATE 1" {
		t.Fatalf("fence.token.quiet = 44: %s", tag)
	}
	if got := p.Counter(t, "pgfence_domain_token_accepted_max", "domain=quiet"); got != 44 {
		t.Errorf("domain token accepted: %v, want 44", got)
	}

	// A SET of the token setting alone, the domain's own left at another
	// token since an earlier statement: pgfence takes the token setting's
	// for the write's, which holds because the write fails.
	pgtest.Exec(t, a, "SET fence.token = '45'")
	before := out()
	_, err := a.Exec(ctx, "UPDATE "+tbl+" SET val = 'A' WHERE id = 2")
	if pe := pgErr(t, err); pe.Code != "22023" {
		t.Fatalf("both settings, different tokens: %s %s", pe.Code, pe.Message)
	}
	if got := out(); got != before {
		t.Errorf("a failed write was counted as one without its probe: %v, want %v", got, before)
	}
	if got := p.Counter(t, "pgfence_domain_token_accepted_max", "domain=quiet"); got != 44 {
		t.Errorf("domain token accepted after a failed write: %v, want 44", got)
	}
}

// TestQuietNotifyStale: a stale writer told of its stale write
// (NotifyStale) is told so without the probe too, and only so.
func TestQuietNotifyStale(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 50})
	p := pgtest.StartProxy(t, []string{tbl}, staleNotices(t), func(_ *proxy.Config, fc *fence.Config) { fc.NotifyStale = true })
	c, notices := noticed(t, p)
	pgtest.Exec(t, c, "SET fence.token = '42'")
	if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'A' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale write: %s", tag)
	}
	if got := p.Counter(t, "pgfence_probes_left_out_total"); got != 1 {
		t.Fatalf("probes left out: %v, want 1", got)
	}
	got := notices()
	if len(got) != 1 || got[0].Severity != "WARNING" || !strings.Contains(got[0].Message, "stale write fenced") || !strings.Contains(got[0].Message, "42") {
		for _, n := range got {
			t.Logf("notice: %s %s %s", n.Severity, n.Code, n.Message)
		}
		t.Fatalf("the stale writer got %d notices, want one WARNING naming its token", len(got))
	}
}

// TestQuietProtocols: the probe is left out in each way a driver sends a
// write after a SET pgfence answered: a Query (bound by pgfence to a
// statement of its own), a Bind of a prepared statement, and a Parse,
// Bind and Execute of the unnamed one.
func TestQuietProtocols(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0})
	p := pgtest.StartProxy(t, []string{tbl}, staleNotices(t))
	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{{"simple", pgx.QueryExecModeSimpleProtocol}, {"prepared", pgx.QueryExecModeCacheStatement}, {"unnamed", pgx.QueryExecModeExec}}
	for i, m := range modes {
		fresh, stale := int64(100+10*i), int64(99+10*i)
		// A session of its own: after its stale write, a session's writes
		// are probed until one is fresh (see TestQuietZombie).
		c := p.Connect(t)
		// pgx prepares a statement at its first use, in a unit of its
		// own: the SET's token is then set ahead of that, and the write
		// is probed. Prepared here, every write below is a unit of one.
		if _, err := c.Prepare(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id = 1", "UPDATE "+tbl+" SET val = $1 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SET fence.token = '"+pgtestItoa(fresh)+"'"); err != nil {
			t.Fatal(err)
		}
		tag, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id = 1", m.mode, m.name)
		if err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("%s: fresh write: %s %v", m.name, tag, err)
		}
		if _, err := c.Exec(ctx, "SET fence.token = '"+pgtestItoa(stale)+"'"); err != nil {
			t.Fatal(err)
		}
		tag, err = c.Exec(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id = 1", m.mode, "stale")
		if err != nil || tag.String() != "UPDATE 0" {
			t.Fatalf("%s: stale write: %s %v", m.name, tag, err)
		}
		if got, want := p.Counter(t, "pgfence_probes_left_out_total"), float64(2*(i+1)); got != want {
			t.Fatalf("%s: probes left out: %v, want %v", m.name, got, want)
		}
		if got := p.Counter(t, "fencing_reject_total", "table="+tbl); got != float64(i+1) {
			t.Fatalf("%s: rejects: %v, want %d", m.name, got, i+1)
		}
		if got := p.Counter(t, "pgfence_token_accepted_max", "table="+tbl); got != float64(fresh) {
			t.Fatalf("%s: token accepted: %v, want %d", m.name, got, fresh)
		}
		if v, e := row(t, tbl, 1); v != m.name || e != fresh {
			t.Fatalf("%s: row is %q at %d, want %s at %d", m.name, v, e, m.name, fresh)
		}
	}
}

func pgtestItoa(n int64) string { return strconv.FormatInt(n, 10) }
