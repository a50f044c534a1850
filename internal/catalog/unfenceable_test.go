package catalog

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// TestDiscoverUnfenceable: a --guard table without an integer epoch column
// is marked Unfenceable, saying why and the fix; the other tables of an
// unqualified guard are not; observe tables are not (they fence nothing);
// none gets a backstop.
func TestDiscoverUnfenceable(t *testing.T) {
	epoch := map[string]columnInfo{"fence_epoch": {typ: "int8", notNull: true}}
	none := map[string]columnInfo{"id": {typ: "int4", notNull: true}}
	text := map[string]columnInfo{"fence_epoch": {typ: "text", notNull: true}}
	table := func(schema, name string, cols map[string]columnInfo) *catalogTable {
		return &catalogTable{schema: schema, name: name, columns: cols}
	}
	observe := func(g sqlrewrite.Guard) sqlrewrite.Guard { g.Rollout = sqlrewrite.Observe; return g }
	same := func(g sqlrewrite.Guard) sqlrewrite.Guard { return g }
	cases := []struct {
		name    string
		tables  []*catalogTable
		guard   string
		rollout func(sqlrewrite.Guard) sqlrewrite.Guard
		want    map[string]string // label -> what Unfenceable contains ("" for none)
	}{
		{"missing column", []*catalogTable{table("public", "accounts", none)}, "accounts", same,
			map[string]string{"public.accounts": `no epoch column "fence_epoch"; add it: ALTER TABLE public.accounts ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0`}},
		{"qualified", []*catalogTable{table("public", "accounts", none)}, "public.accounts", same,
			map[string]string{"public.accounts": "ADD COLUMN fence_epoch"}},
		{"not an integer", []*catalogTable{table("public", "accounts", text)}, "accounts", same,
			map[string]string{"public.accounts": `is of type text, not bigint`}},
		{"one of two", []*catalogTable{table("a", "accounts", epoch), table("b", "accounts", none)}, "accounts", same,
			map[string]string{"accounts": "", "b.accounts": "ALTER TABLE b.accounts ADD COLUMN"}},
		{"fenceable", []*catalogTable{table("public", "accounts", epoch)}, "accounts", same, map[string]string{"public.accounts": ""}},
		{"observe", []*catalogTable{table("public", "accounts", none)}, "accounts", observe, map[string]string{"public.accounts": ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := sqlrewrite.ParseGuard(c.guard)
			if err != nil {
				t.Fatal(err)
			}
			d := discover(c.tables, []sqlrewrite.Guard{c.rollout(g)}, false, "fence_epoch", same)
			got := map[string]string{}
			for _, g := range d.Guards {
				got[g.Label()] = g.Unfenceable
			}
			if len(got) != len(c.want) {
				t.Fatalf("guards %q, want %q", got, c.want)
			}
			for label, want := range c.want {
				u, ok := got[label]
				switch {
				case !ok:
					t.Errorf("no guard %s among %q", label, got)
				case want == "" && u != "":
					t.Errorf("%s: unfenceable %q, want fenceable", label, u)
				case want != "" && !strings.Contains(u, want):
					t.Errorf("%s: unfenceable %q, want it to say %q", label, u, want)
				}
			}
			for _, tb := range d.Tables {
				for _, ct := range c.tables {
					if ct.schema == tb.Schema && ct.name == tb.Table && (!isInteger(ct.columns[tb.Column].typ) || tb.Unfenceable != "") {
						t.Errorf("a backstop for %s, which cannot be fenced", tb.Name())
					}
				}
			}
		})
	}
}
