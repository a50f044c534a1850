package sqlrewrite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Fragments that combine into UPDATE and DELETE statements with the layouts
// clients really send: comments everywhere, odd spacing, aliases, joins,
// subqueries with keywords of their own, RETURNING.
var (
	genLead    = []string{"", "/* c */ ", "-- lead\n", "\n\t", "WITH s AS (SELECT 1 AS id WHERE true) "}
	genTargets = []string{"accounts", "ACCOUNTS", "public.accounts", `"accounts"`, "public . /*x*/ accounts",
		"ONLY accounts", "ONLY (accounts)", "other.accounts", "orders", "public.orders", "x.orders",
		`"Odd ""Name"""`, "billing.ledger", "ledger", "x.ledger", "audit", `U&"\0061ccounts"`}
	genAliases = []string{"", " a", " AS a", ` AS "set"`, " x", "/*a*/ AS b"}
	genSets    = []string{"SET v = 1", "SET(v)=(1)", "SET v = (SELECT 1 WHERE true), w = $1",
		"SET (v, w) = (SELECT 1, 2)", "set v = v || ' WHERE '", "SET v = (ARRAY[1,2])[1], w[1] = 2", "SET version = 1"}
	genFroms  = []string{"", " FROM t2", " FROM t2 JOIN t3 ON (t2.id = t3.id)", " FROM s"}
	genUsings = []string{"", " USING t2", " USING t2, s"}
	genWheres = []string{"", " WHERE id = 1", " WHERE(id=1)", " WHERE id = 1 OR id = 2", "\nWHERE -- c\n id IN (SELECT 1 WHERE false)",
		" WHERE a AND b", " WHERE $2 = id /* p */", " WHERE CURRENT OF c", " where not exists (select from t2 where t2.id = id)"}
	genRets  = []string{"", " RETURNING *", " RETURNING(id)", " /*r*/ RETURNING id, (SELECT 1 WHERE true)"}
	genTails = []string{"", " -- trailing", " /* t */", "\n"}
	genOther = []string{"SELECT 1", "INSERT INTO audit VALUES (1)", "SELECT * FROM accounts", "BEGIN", "COMMIT",
		"INSERT INTO accounts (id) VALUES (1)", "DELETE FROM audit WHERE x = 'accounts'"}
	genSeps = []string{";", " ;\n", ";-- x\n", "; /* y */ "}
)

func genStatement(rng *rand.Rand) string {
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	switch rng.IntN(4) {
	case 0:
		return pick(genOther)
	case 1:
		return pick(genLead) + "DELETE FROM " + pick(genTargets) + pick(genAliases) + pick(genUsings) +
			pick(genWheres) + pick(genRets) + pick(genTails)
	default:
		return pick(genLead) + "UPDATE " + pick(genTargets) + pick(genAliases) + " " + pick(genSets) +
			pick(genFroms) + pick(genWheres) + pick(genRets) + pick(genTails)
	}
}

// TestRewriteGenerated runs verify over many generated multi-statement
// texts, in both modes.
func TestRewriteGenerated(t *testing.T) {
	r := mustNew(t, "fence.token", "accounts", "public.orders:version", `"Odd ""Name"""`, "billing.ledger:epoch")
	rng := rand.New(rand.NewPCG(1, 2))
	n := 4000
	if testing.Short() {
		n = 400
	}
	fenced := 0
	for i := 0; i < n; i++ {
		var parts []string
		for k := 1 + rng.IntN(3); k > 0; k-- {
			parts = append(parts, genStatement(rng))
		}
		sql := strings.Join(parts, genSeps[rng.IntN(len(genSeps))])
		for _, mode := range []Mode{Simple, Prepared} {
			res, err := r.Rewrite(sql, mode)
			if err != nil {
				t.Fatalf("Rewrite(%q): %v", sql, err)
			}
			if err := verify(r, sql, mode, res); err != nil {
				t.Fatalf("Rewrite(%q): %v", sql, err)
			}
			fenced += len(res.Fenced)
		}
	}
	if fenced < n/2 {
		t.Errorf("only %d statements fenced; the generator has drifted", fenced)
	}
}
