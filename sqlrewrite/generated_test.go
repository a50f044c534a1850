package sqlrewrite

import (
	"flag"
	"math/rand/v2"
	"strings"
	"testing"
)

var (
	genN    = flag.Int("gen.n", 0, "TestRewriteGenerated: texts to generate (default 1500, 300 with -short)")
	genSeed = flag.Uint64("gen.seed", 1, "TestRewriteGenerated: random seed")
)

// Fragments that combine into the writes clients really send: comments
// everywhere, odd spacing, aliases, joins, subqueries with keywords of
// their own, RETURNING, nesting in WITH, EXPLAIN, PREPARE and COPY.
var (
	genLead    = []string{"", "/* c */ ", "-- lead\n", "\n\t", "WITH s AS (SELECT 1 AS id WHERE true) "}
	genTargets = []string{"accounts", "ACCOUNTS", "public.accounts", `"accounts"`, "public . /*x*/ accounts",
		"orders", "public.orders", "x.orders", `"Odd ""Name"""`, "billing.ledger", "ledger", "x.ledger", "audit", `U&"\0061ccounts"`}
	genOnly    = []string{"", "", "ONLY ", "ONLY ("}
	genAliases = []string{"", " a", " AS a", ` AS "set"`, " x", "/*a*/ AS b"}
	genSets    = []string{"SET v = 1", "SET(v)=(1)", "SET v = (SELECT 1 WHERE true), w = $1",
		"SET (v, w) = (SELECT 1, 2)", "set v = v || ' WHERE '", "SET v = (ARRAY[1,2])[1], w[1] = 2", "SET version = 1", "SET v = t2.where"}
	genFroms  = []string{"", " FROM t2", " FROM t2 JOIN t3 ON (t2.id = t3.id)", " FROM s"}
	genUsings = []string{"", " USING t2", " USING t2, s"}
	genWheres = []string{"", " WHERE id = 1", " WHERE(id=1)", " WHERE id = 1 OR id = 2", "\nWHERE -- c\n id IN (SELECT 1 WHERE false)",
		" WHERE a AND b", " WHERE $2 = id /* p */", " WHERE CURRENT OF c", " where not exists (select from t2 where t2.id = id)",
		" WHERE x IS DISTINCT FROM y"}
	genRets  = []string{"", " RETURNING *", " RETURNING(id)", " /*r*/ RETURNING id, (SELECT 1 WHERE true)", " RETURNING id AS where"}
	genTails = []string{"", " -- trailing", " /* t */", "\n"}
	genCols  = []string{"", " (id)", " (id, v)", " (a, /* c */ b)", " (fence_epoch)", " (version)", " (v[1], w.x)", " (id -- c\n)"}
	genSrcs  = []string{" VALUES (1)", " VALUES (1, 2), (3, DEFAULT)", " VALUES ((1), ARRAY[2])", " (VALUES (1))",
		" SELECT 1", " SELECT a, b FROM t2 WHERE c", " SELECT a IS DISTINCT FROM b, t.from FROM t", " SELECT 1 AS from",
		" SELECT x FROM t2 UNION ALL SELECT y FROM t3", " VALUES (1) UNION VALUES (2)", " TABLE t2", " SELECT",
		" SELECT DISTINCT ON (a) a FROM t ORDER BY a LIMIT 1", " SELECT count(*) FILTER (WHERE x) FROM t GROUP BY y HAVING true",
		" (SELECT 1) ORDER BY 1", " OVERRIDING SYSTEM VALUE VALUES (1)", " OVERRIDING USER VALUE SELECT 1 UNION SELECT 2",
		" WITH w AS (SELECT 1) SELECT * FROM w", " SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM t",
		" DEFAULT VALUES", " SELECT 'a'FOR UPDATE"}
	genConflicts = []string{"", " ON CONFLICT DO NOTHING", " ON CONFLICT (id) DO NOTHING", " ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
		" ON CONFLICT (id) WHERE id > 0 DO UPDATE SET v = 1 WHERE a.v < 2", " ON CONFLICT ON CONSTRAINT k DO UPDATE SET (v, w) = (1, 2) WHERE true",
		" ON CONFLICT (id) DO UPDATE SET fence_epoch = 1", " ON CONFLICT DO UPDATE SET v = (SELECT 1 WHERE true) WHERE EXISTS (SELECT 1 WHERE false)"}
	genWraps = []string{"%s", "%s", "%s", "EXPLAIN %s", "EXPLAIN ANALYZE %s", "EXPLAIN (ANALYZE off) %s", "PREPARE p AS %s",
		"PREPARE p2 (int) AS %s", "WITH w AS (%s RETURNING 1) SELECT * FROM w", "WITH w AS (%s), v AS (%s) SELECT 1",
		"COPY (%s RETURNING 1) TO STDOUT", "CREATE TABLE z AS WITH w AS (%s RETURNING 1) SELECT * FROM w",
		"WITH w AS (%s RETURNING 1) %s", "CREATE RULE r AS ON INSERT TO audit DO ALSO %s",
		"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 2), w AS (%s RETURNING 1) SELECT * FROM w, r",
		"SELECT * FROM (WITH w AS (%s RETURNING 1) SELECT * FROM w) q", "INSERT INTO audit (a) WITH w AS (%s RETURNING 1) SELECT * FROM w",
		"WITH w AS (%s RETURNING 1) MERGE INTO audit USING w ON true WHEN MATCHED THEN DELETE", "WITH pgfence_domain_0 AS (SELECT 1) %s",
		"DECLARE c CURSOR FOR WITH w AS (%s RETURNING 1) SELECT * FROM w", "EXPLAIN ANALYZE WITH RECURSIVE w AS (%s RETURNING 1) SELECT 1",
		"WITH w AS (%s RETURNING 1) MERGE INTO accounts a USING w ON true WHEN MATCHED THEN UPDATE SET v = 1 WHEN NOT MATCHED THEN INSERT (id) VALUES (1)"}
	genOther = []string{"SELECT 1", "INSERT INTO audit VALUES (1)", "SELECT * FROM accounts", "BEGIN", "COMMIT",
		"DELETE FROM audit WHERE x = 'accounts'", "EXECUTE p", "EXECUTE q(1)", "EXPLAIN ANALYZE EXECUTE p", "EXECUTE nope",
		"TRUNCATE accounts, audit", "COPY orders FROM STDIN", "MERGE INTO accounts USING t ON true WHEN MATCHED THEN DELETE",
		"COPY accounts TO STDOUT", "SELECT * FROM accounts FOR UPDATE", "COPY public.accounts (id, v) FROM STDIN",
		"MERGE INTO billing.ledger l USING (SELECT 1 AS id) s ON l.id = s.id WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT VALUES (s.id)",
		"MERGE INTO orders o USING t ON true WHEN MATCHED THEN UPDATE SET version = 1", "DELETE FROM ledger WHERE CURRENT OF c"}
	genSeps = []string{";", " ;\n", ";-- x\n", "; /* y */ "}
)

func genWrite(rng *rand.Rand) string {
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	target := func() string {
		only, t := pick(genOnly), pick(genTargets)
		if only == "ONLY (" {
			return only + t + ")"
		}
		return only + t
	}
	switch rng.IntN(3) {
	case 0:
		return pick(genLead) + "DELETE FROM " + target() + pick(genAliases) + pick(genUsings) + pick(genWheres) + pick(genRets)
	case 1:
		return pick(genLead) + "UPDATE " + target() + pick(genAliases) + " " + pick(genSets) + pick(genFroms) + pick(genWheres) + pick(genRets)
	}
	alias := ""
	if rng.IntN(3) == 0 {
		alias = " AS a"
	}
	cols, src := pick(genCols), pick(genSrcs)
	if src == " DEFAULT VALUES" && rng.IntN(2) == 0 {
		cols = ""
	}
	return pick(genLead) + "INSERT INTO " + pick(genTargets) + alias + cols + src + pick(genConflicts) + pick(genRets)
}

func genStatement(rng *rand.Rand) string {
	if rng.IntN(5) == 0 {
		return genOther[rng.IntN(len(genOther))]
	}
	w := genWraps[rng.IntN(len(genWraps))]
	for strings.Contains(w, "%s") {
		w = strings.Replace(w, "%s", genWrite(rng), 1)
	}
	return w + genTails[rng.IntN(len(genTails))]
}

// TestRewriteGenerated runs verify over many generated multi-statement
// texts, in both modes, with and without a Session, over many
// configurations, half of them with lock domains, half with the database
// backstop on some tables.
func TestRewriteGenerated(t *testing.T) {
	rng := rand.New(rand.NewPCG(*genSeed, 2))
	n := 1500
	if testing.Short() {
		n = 300
	}
	if *genN > 0 {
		n = *genN
	}
	var rs [4][256]*Rewriter
	fenced, refused, domains, templates, backstops := 0, 0, 0, 0, 0
	for i := 0; i < n; i++ {
		cfg := uint8(rng.IntN(256))
		d := i % 4
		if rs[d][cfg] == nil {
			rs[d][cfg] = fuzzRewriterWith(t, cfg, [][]string{nil, fuzzDomains}[d%2], [][]bool{nil, fuzzBackstops}[d/2])
		}
		r := rs[d][cfg]
		var parts []string
		for k := 1 + rng.IntN(3); k > 0; k-- {
			parts = append(parts, genStatement(rng))
		}
		sql := strings.Join(parts, genSeps[rng.IntN(len(genSeps))])
		for _, mode := range []Mode{Simple, Prepared} {
			for _, s := range []Session{nil, fuzzSession} {
				res, err := r.Rewrite(sql, mode, s)
				if err != nil {
					t.Fatalf("Rewrite(%q) with config %#x: %v", sql, cfg, err)
				}
				if err := verify(r, sql, mode, s, res); err != nil {
					t.Fatalf("Rewrite(%q) with config %#x: %v", sql, cfg, err)
				}
				if mode == Simple && s == nil {
					if p, _ := Parameterize(sql); p.SQL != "" {
						if tres, ok, _ := r.RewriteTemplate(p); ok {
							templates++
							if err := verifyTemplatePositions(sql, p, tres); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
				fenced += len(res.Fenced)
				for _, f := range res.Fenced {
					if f.Backstop {
						backstops++
					}
				}
				if res.Refusal != nil {
					refused++
				}
				if strings.Contains(res.SQL, `"pgfence_domain_`) {
					domains++
				}
			}
		}
	}
	t.Logf("%d fenced (%d by the backstop), %d refused, %d checking a lock domain of %d; %d templates", fenced, backstops, refused, domains, 4*n, templates)
	if fenced < n || refused > 3*n || domains < n/10 {
		t.Errorf("%d writes fenced, %d texts refused, %d checking a lock domain; the generator has drifted", fenced, refused, domains)
	}
}

// FuzzGenerated verifies texts built by the statement generator from a
// fuzzed seed, splicing in a fuzzed fragment, so the fuzzer explores
// combinations of the realistic shapes above.
func FuzzGenerated(f *testing.F) {
	f.Add(uint64(1), uint8(0), "", false)
	f.Add(uint64(7), uint8(0x5a), " /* x */ ", true)
	var rs, ds, bs [256]*Rewriter
	for i := range rs {
		rs[i] = fuzzRewriter(f, uint8(i))
		ds[i] = fuzzRewriterIn(f, uint8(i), fuzzDomains)
		bs[i] = fuzzRewriterWith(f, uint8(i), [][]string{nil, fuzzDomains}[i%2], fuzzBackstops) // lock domains for odd cfg
	}
	f.Fuzz(func(t *testing.T, seed uint64, cfg uint8, extra string, prepared bool) {
		rng := rand.New(rand.NewPCG(seed, 3))
		var parts []string
		for k := 1 + rng.IntN(3); k > 0; k-- {
			parts = append(parts, genStatement(rng))
		}
		sql := strings.Join(parts, genSeps[rng.IntN(len(genSeps))])
		if at := rng.IntN(len(sql) + 1); extra != "" {
			sql = sql[:at] + extra + sql[at:]
		}
		rewriteAndVerify(t, sql, prepared, rs[cfg], ds[cfg], bs[cfg])
	})
}
