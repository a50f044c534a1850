package catalog

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// A guarded table whose guarded descendant, at any depth, is fenced
// otherwise has its writes refused; one whose descendants are fenced alike
// does not, nor does the descendant itself.
func TestMixedTrees(t *testing.T) {
	g := func(schema, table, domain string, r sqlrewrite.Rollout) sqlrewrite.Guard {
		return sqlrewrite.Guard{Schema: schema, Table: table, Column: "fence_epoch", Domain: domain, Rollout: r}
	}
	tables := []sqlrewrite.Guard{
		g("public", "top", "", sqlrewrite.Enforce),
		g("public", "mid", "", sqlrewrite.Enforce),
		g("public", "leaf", "billing", sqlrewrite.Enforce), // under mid, under top
		g("public", "same", "", sqlrewrite.Enforce),
		g("public", "same_child", "", sqlrewrite.Enforce),
		g("public", "shadowed", "", sqlrewrite.Enforce),
		g("public", "shadowed_child", "", sqlrewrite.Shadow),
	}
	parents := map[string][]string{
		"public.mid": {"public.top"}, "public.leaf": {"public.mid"},
		"public.same_child": {"public.same"}, "public.shadowed_child": {"public.shadowed"},
	}
	guards := append([]sqlrewrite.Guard{{Table: "top", Column: "fence_epoch"}}, tables[1:]...) // top guarded unqualified
	problems := mixedTrees(guards, tables, parents)
	refused := map[string]bool{}
	for _, gd := range guards {
		if gd.Unfenceable != "" {
			refused[gd.Table] = true
		}
	}
	for _, name := range []string{"top", "mid", "shadowed"} {
		if !refused[name] {
			t.Errorf("%s: not refused; its descendant is fenced otherwise", name)
		}
	}
	for _, name := range []string{"leaf", "same", "same_child", "shadowed_child"} {
		if refused[name] {
			t.Errorf("%s: refused", name)
		}
	}
	if len(problems) != 3 || !strings.Contains(problems[0], "public.leaf") || !strings.Contains(problems[0], `lock domain "billing"`) {
		t.Errorf("problems: %q", problems)
	}
}
