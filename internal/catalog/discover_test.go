package catalog

import (
	"testing"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// Each table gets one guard and one label, schema-qualified, whichever way
// it was guarded: `--guard accounts`, `--guard public.accounts`, discovery,
// or the first with the second.
func TestDiscoverLabels(t *testing.T) {
	epoch := map[string]columnInfo{"fence_epoch": {typ: "int8", notNull: true}}
	table := func(schema, name string, parents ...string) *catalogTable {
		return &catalogTable{schema: schema, name: name, parents: parents, columns: epoch}
	}
	guard := func(spec string) sqlrewrite.Guard {
		g, err := sqlrewrite.ParseGuard(spec)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	same := func(g sqlrewrite.Guard) sqlrewrite.Guard { return g }
	cases := []struct {
		name     string
		tables   []*catalogTable
		explicit []string
		auto     bool
		want     []string // the guards' labels
	}{
		{"unqualified", []*catalogTable{table("public", "accounts")}, []string{"accounts"}, false, []string{"public.accounts"}},
		{"unqualified and discovered", []*catalogTable{table("public", "accounts")}, []string{"accounts"}, true, []string{"public.accounts"}},
		{"qualified and discovered", []*catalogTable{table("public", "accounts")}, []string{"public.accounts"}, true, []string{"public.accounts"}},
		{"discovered", []*catalogTable{table("public", "accounts")}, nil, true, []string{"public.accounts"}},
		{"missing", nil, []string{"accounts"}, true, []string{"accounts"}},
		// Two tables of that name: the unqualified guard stands for both
		// and is labelled as written.
		{"ambiguous", []*catalogTable{table("billing", "accounts"), table("public", "accounts")}, []string{"accounts"}, true, []string{"accounts"}},
		{"partitions", []*catalogTable{table("public", "accounts"), table("public", "accounts_1", "public.accounts")}, []string{"accounts"}, true,
			[]string{"public.accounts", "public.accounts_1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var explicit []sqlrewrite.Guard
			for _, spec := range c.explicit {
				explicit = append(explicit, guard(spec))
			}
			d := discover(c.tables, explicit, c.auto, "fence_epoch", same)
			var got []string
			for _, g := range d.Guards {
				got = append(got, g.Label())
			}
			if len(got) != len(c.want) {
				t.Fatalf("guards %q, want %q", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("guards %q, want %q", got, c.want)
				}
			}
			for _, tb := range d.Tables {
				if tb.As != "" {
					t.Errorf("backstop table %s carries a label %q", tb.Name(), tb.As)
				}
			}
		})
	}
}
