package fence_test

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/server"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Each session is fenced by the policy of its database: a table of the
// same name in another database is another table, with a policy of its
// own (here: none), and its series carry their database. A session Route
// finds no policy for has every statement refused.
func TestDatabasesRouteEachSession(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 5})
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP DATABASE IF EXISTS fence_other WITH (FORCE)")
	pgtest.Exec(t, db, "CREATE DATABASE fence_other")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP DATABASE IF EXISTS fence_other WITH (FORCE)") })
	other := pgtest.Connect(t, pgtest.Server().URL("fence_other"))
	pgtest.Exec(t, other, "CREATE TABLE "+tbl+" (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO "+tbl+" VALUES (1, 'a', 5)")

	var policies map[string]*fence.Policy
	var routeOther atomic.Bool
	srv, err := server.New(server.Config{
		Proxy: proxy.Config{Upstream: pgtest.Server().Addr()},
		Route: &fence.Routes{Policy: func(c *proxy.Client) *fence.Policy {
			if c.Database == "fence_other" && !routeOther.Load() {
				return nil
			}
			return policies[c.Database]
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	guarded, err := srv.Databases.New("postgres", fence.Config{Guards: []sqlrewrite.Guard{{Table: tbl, Column: "fence_epoch"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	unguarded, err := srv.Databases.New("fence_other", fence.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	policies = map[string]*fence.Policy{"postgres": guarded, "fence_other": unguarded}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { ln.Close(); srv.Close() })
	url := func(db string) string {
		return "postgres://postgres@" + ln.Addr().String() + "/" + db + "?sslmode=disable"
	}

	// No policy for fence_other: refused, statement by statement.
	c := pgtest.Connect(t, url("fence_other"))
	_, err = c.Exec(ctx, "SELECT 1")
	if pe := pgErr(t, err); pe.Code != "08004" || !strings.Contains(pe.Message, `no fencing policy for database "fence_other"`) {
		t.Fatalf("a statement of a session without a policy: %s %s", pe.Code, pe.Message)
	}

	routeOther.Store(true)
	a := pgtest.Connect(t, url("postgres"))
	b := pgtest.Connect(t, url("fence_other"))
	pgtest.Exec(t, a, "SET fence.token = '3'")
	pgtest.Exec(t, b, "SET fence.token = '3'")
	if got := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("stale write in the guarded database: %s", got)
	}
	if got := pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'unfenced' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("write to the table of the same name in a database whose policy does not guard it: %s, want it untouched", got)
	}
	p := &pgtest.Proxy{Registry: srv.Registry}
	if n := p.Counter(t, "fencing_reject_total", "database=postgres", "table="+tbl); n != 1 {
		t.Fatalf(`fencing_reject_total{database="postgres"} = %v, want 1`, n)
	}
	if n := p.Counter(t, "fencing_reject_total", "database=fence_other"); n != 0 {
		t.Fatalf(`fencing_reject_total{database="fence_other"} = %v, want 0`, n)
	}
}

// Retiring a table's series in one database leaves those of the table of
// that name in another; Retire removes a database's series; a reload of
// any database's policy changes the Generation every session sees.
func TestDatabaseSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := fence.NewMetrics(reg)
	d := fence.NewDatabases(m, fence.Routes{Policy: func(*proxy.Client) *fence.Policy { return nil }})
	cfg := fence.Config{Guards: []sqlrewrite.Guard{{Schema: "public", Table: "t", Column: "fence_epoch", Domain: "dom"}}}
	a, err := d.New("a", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.New("b", cfg, nil); err != nil {
		t.Fatal(err)
	}
	series := func() map[string]int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "database" {
						out[l.GetValue()]++
					}
				}
			}
		}
		return out
	}
	before := series()
	if before["a"] == 0 || before["a"] != before["b"] {
		t.Fatalf("series by database at start: %v, want as many for a as for b", before)
	}
	gen := d.Generation()
	if err := a.Reload(fence.Config{}); err != nil {
		t.Fatal(err)
	}
	if d.Generation() == gen || a.Generation() != d.Generation() {
		t.Fatalf("generation %d -> %d (policy a: %d): a reload must change the one every session sees", gen, d.Generation(), a.Generation())
	}
	after := series()
	if after["b"] != before["b"] {
		t.Fatalf("series of b after a stopped guarding its table of the same name: %d, want %d", after["b"], before["b"])
	}
	// What a keeps: its configuration's gauges.
	if after["a"] >= before["a"] || after["a"] == 0 {
		t.Fatalf("series of a after it stopped guarding t: %d (before %d), want only its configuration's", after["a"], before["a"])
	}
	m.Database("a").Retire()
	if got := series(); got["a"] != 0 || got["b"] != before["b"] {
		t.Fatalf("series after a is retired: %v", got)
	}
}
