package catalog

import (
	"fmt"
	"slices"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// fencing is what decides how a guarded table's writes are fenced.
type fencing struct {
	column       string
	rollout      sqlrewrite.Rollout
	allowMissing bool
	domain       string
}

func fencingOf(g sqlrewrite.Guard) fencing {
	return fencing{g.Column, g.Rollout, g.AllowMissingToken, g.Domain}
}

func (f fencing) String() string {
	s := fmt.Sprintf("epoch column %q, %s", f.column, f.rollout)
	if f.domain != "" {
		s += fmt.Sprintf(", lock domain %q", f.domain)
	} else {
		s += ", no lock domain"
	}
	if f.allowMissing {
		s += ", missing token allowed"
	}
	return s
}

// mixedTrees refuses writes naming a guarded table whose guarded
// partition or inheritance child (at any depth) is fenced otherwise: a
// write naming the parent writes the child's rows too, and the rewrite
// fences it as the parent is (a parent outside the child's lock domain
// would let a stale writer into the domain). Such a guard gets
// Unfenceable; the problems say which tables, for the log. tables are the
// tables as their lock-domain membership left them, parents as
// Discovery.Parents has them.
func mixedTrees(guards, tables []sqlrewrite.Guard, parents map[string][]string) []string {
	byKey := make(map[string]sqlrewrite.Guard, len(tables))
	for _, t := range tables {
		byKey[t.Schema+"."+t.Table] = t
	}
	why := make(map[string]string) // an ancestor's key: why it cannot be fenced
	var keys []string
	for _, t := range tables {
		key := t.Schema + "." + t.Table
		seen := map[string]bool{key: true}
		up := slices.Clone(parents[key])
		for len(up) > 0 {
			a := up[0]
			up = up[1:]
			if seen[a] {
				continue
			}
			seen[a] = true
			up = append(up, parents[a]...)
			at, ok := byKey[a]
			if !ok || why[a] != "" || fencingOf(at) == fencingOf(t) {
				continue
			}
			why[a] = fmt.Sprintf("its partition or inheritance child %s is fenced otherwise (%s, where it has %s), and a write naming it writes the child's rows too; "+
				"configure both alike (--domain, --table-mode, --missing-token), or write to the child by name", t.Name(), fencingOf(t), fencingOf(at))
			keys = append(keys, a)
		}
	}
	slices.Sort(keys)
	var problems []string
	for _, a := range keys {
		at := byKey[a]
		problems = append(problems, fmt.Sprintf("guarded table %s: writes naming it are refused (PF003): %s", at.Name(), why[a]))
		for k, g := range guards {
			if g.Table == at.Table && (g.Schema == "" || g.Schema == at.Schema) && guards[k].Unfenceable == "" {
				guards[k].Unfenceable = why[a]
			}
		}
	}
	return problems
}
