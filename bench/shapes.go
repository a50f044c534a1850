package main

// Write shapes (issue 30): fenced writes of other shapes than the UPDATE of
// the main tables, each against the same write fenced by hand through
// PgBouncer, at -M simple, extended and prepared. Simple-protocol text with
// its literals inline is what psycopg2, many ORMs and hand-written tooling
// send; pgfence binds such a write to a statement it prepares once per
// session, where the shape allows. The shapes run three times: fresh, in a
// stale-writer storm (shapesStorm) and with the database backstop's
// trigger on the tables (shapesBackstop).
//
// BENCH_ONLY=shapes runs this section alone (it is not part of the full
// run) and writes its tables to bench/last-run-shapes.md.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var shapesModes = []string{"simple", "extended", "prepared"}

// shapesWorkloads are the section's workloads: label, the script through
// PgBouncer (fenced by hand), and through pgfence.
var shapesWorkloads = []workload{
	{label: "UPDATE (reference)", hand: "fenced-hand", pgfence: "fenced-pgfence"},
	{label: "upsert, one row", hand: "upsert-hand", pgfence: "upsert-pgfence"},
	{label: "upsert, three rows", hand: "upsert3-hand", pgfence: "upsert3-pgfence"},
	{label: "DELETE ... IN (1 to 10)", hand: "delete-in-hand", pgfence: "delete-in-pgfence"},
	{label: "INSERT of 1 to 3 rows", hand: "insert-rows-hand", pgfence: "insert-rows-pgfence"},
	{label: "INSERT ... SELECT upsert, 5 rows", hand: "insert-select-hand", pgfence: "insert-select-pgfence"},
	{label: "writable CTE", hand: "cte-hand", pgfence: "cte-pgfence"},
	{label: "UPDATE in a lock domain", hand: "domain-hand", pgfence: "fenced-pgfence", domain: true},
}

// stormWorkloads are the shapes a stale writer can be fenced in: the
// DELETE's IN list matches no row and the log INSERT has no row to be
// stale against, so their storm would be their fresh run again.
var stormWorkloads = slices.DeleteFunc(slices.Clone(shapesWorkloads), func(w workload) bool {
	return w.hand == "delete-in-hand" || w.hand == "insert-rows-hand"
})

// benchShapesOnly is BENCH_ONLY=shapes.
func (r *runner) benchShapesOnly() error {
	start := time.Now()
	load := loadAvg()
	if err := r.setup(); err != nil {
		return err
	}
	// A guarded log the INSERTs go to, emptied by nothing: pgbench_history's
	// shape with an epoch column.
	if err := r.sql("CREATE TABLE pgbench_fenced_log (LIKE pgbench_history INCLUDING ALL, fence_epoch bigint NOT NULL DEFAULT 0)"); err != nil {
		return err
	}
	pf, _, err := r.startPgfence("pgfence guarded", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts", "--guard", "pgbench_fenced_log")
	if err != nil {
		return err
	}
	if err := r.checkFencing(pf); err != nil {
		return err
	}
	// The same table in a lock domain, through a pgfence of its own (which
	// creates pgfence.domains, that the hand-fenced script claims too). The
	// row-only pgfence has read the catalog already and does not again.
	logf("starting pgfence with --domain pgbench_accounts=%s", benchDomain)
	dom, domSvc, err := r.startPgfence("pgfence domain", r.pgfenceBin, "--backstop", "off",
		"--guard", "pgbench_accounts", "--domain", "pgbench_accounts="+benchDomain)
	if err != nil {
		return err
	}
	res, err := r.interleaveModes("write shapes", shapesModes, shapesMeasurements(r.scripts, r.pgbouncer, pf, dom, shapesWorkloads, ""))
	if err != nil {
		return err
	}
	storm, err := r.shapesStorm(pf, dom)
	if err != nil {
		return err
	}
	domSvc.stop()
	bs, err := r.shapesBackstop()
	if err != nil {
		return err
	}
	body := renderShapes(res) + renderShapesStorm(storm, res) + renderAgainst("### Write shapes with the database backstop (its trigger on both sides' tables)",
		[2]string{"PgBouncer tps", "pgfence tps"}, shapesModes, shapesWorkloads, bs)
	r.sectionReport("shapes", fmt.Sprintf("pgbench -c %d -j %d -T %d per run", r.clients, r.threads, r.seconds), start, load, body)
	return nil
}

// shapesMeasurements pairs each workload's script through PgBouncer with
// its script through pgfence: pf, or dom for a lock-domain workload. suffix
// picks the scripts' variant ("-storm").
func shapesMeasurements(scripts map[string]string, pgbouncer, pf, dom target, ws []workload, suffix string) []measurement {
	var ms []measurement
	for _, w := range ws {
		through := pf
		if w.domain {
			through = dom
		}
		ms = append(ms, measurement{"PgBouncer: " + w.label, pgbouncer, []string{"-f", scripts[w.hand+suffix]}},
			measurement{"pgfence: " + w.label, through, []string{"-f", scripts[w.pgfence+suffix]}})
	}
	return ms
}

func renderShapes(res map[string]map[string]series) string {
	return renderAgainst("### Write shapes (pgfence against PgBouncer with the fence written by hand)",
		[2]string{"PgBouncer tps", "pgfence tps"}, shapesModes, shapesWorkloads, res)
}

// workload is a section's workload: its label, and its script through
// PgBouncer (the fence by hand) and through pgfence ("" for select-only);
// domain runs it through a pgfence that puts the table in a lock domain.
type workload struct {
	label, hand, pgfence string
	domain               bool
}

// renderAgainst renders a section that measures pgfence against PgBouncer
// with the fence by hand, per mode and workload, with every run below.
func renderAgainst(title string, tps [2]string, modes []string, workloads []workload, res map[string]map[string]series) string {
	var b strings.Builder
	b.WriteString(title + "\n\n")
	var t table
	t.add("mode", "workload", tps[0], tps[1], "ratio", "Postgres CPU µs/txn: PgBouncer", "pgfence")
	var raw []string
	for _, mode := range modes {
		for _, w := range workloads {
			h, p := res[mode]["PgBouncer: "+w.label], res[mode]["pgfence: "+w.label]
			t.add(mode, w.label, f0(h.tps()), f0(p.tps()), f2(ratio(p, h)), f1(h.pgCPUUs()), f1(p.pgCPUUs()))
			for _, l := range []string{"PgBouncer: " + w.label, "pgfence: " + w.label} {
				var parts []string
				for _, x := range res[mode][l] {
					parts = append(parts, fmt.Sprintf("%.0f/%.1f", x.tps, x.pgCPUUs))
				}
				raw = append(raw, fmt.Sprintf("%-9s %-36s %s", mode, l, strings.Join(parts, "  ")))
			}
		}
	}
	b.WriteString(t.String())
	b.WriteString("\n<details><summary>Every run, in round order (tps/Postgres CPU µs/txn)</summary>\n\n```\n")
	b.WriteString(strings.Join(raw, "\n"))
	b.WriteString("\n```\n</details>\n\n")
	return b.String()
}

// The stale-writer storm of a shape: every row at epoch 2000 and the lock
// domain at token 2000 first; even clients then hold the current token
// 2000, odd ones the stale 1000, as in section 3's storm.
const (
	shapeToken        = "SET fence.token = '1000';\n"
	stormTokenPgfence = "\\if :client_id % 2 = 0\nSET fence.token = '2000';\n\\else\nSET fence.token = '1000';\n\\endif\n"
	stormTokenHand    = "\\if :client_id % 2 = 0\n\\set tok 2000\nSET fence.token = '2000';\n\\else\n\\set tok 1000\nSET fence.token = '1000';\n\\endif\n"
	stormTokenVar     = "\\if :client_id % 2 = 0\n\\set tok 2000\n\\else\n\\set tok 1000\n\\endif\n" // the token in :tok alone
)

// handToken is the token in a script's fence by hand: a whole-word 1000
// (the account count, 1000000 at scale 10, is not one).
var handToken = regexp.MustCompile(`\b1000\b`)

// writeStormScripts writes NAME-storm for each storm workload's scripts:
// the token set by client parity and, in the fence by hand, used (:tok)
// wherever the script had 1000.
func (r *runner) writeStormScripts() error {
	for _, w := range stormWorkloads {
		for _, name := range []string{w.hand, w.pgfence} {
			b, err := os.ReadFile(r.scripts[name])
			if err != nil {
				return err
			}
			script := string(b)
			if strings.Count(script, shapeToken) != 1 {
				return fmt.Errorf("script %s does not set the token once as %q", name, shapeToken)
			}
			head, body, _ := strings.Cut(script, shapeToken)
			if name == w.hand {
				if !handToken.MatchString(body) {
					return fmt.Errorf("script %s writes no token by hand", name)
				}
				script = head + stormTokenHand + handToken.ReplaceAllString(body, ":tok")
			} else {
				script = head + stormTokenPgfence + body
			}
			p := strings.TrimSuffix(r.scripts[name], ".sql") + "-storm.sql"
			if err := os.WriteFile(p, []byte(script), 0o644); err != nil {
				return err
			}
			r.scripts[name+"-storm"] = p
		}
	}
	return nil
}

// shapesStorm runs the storm of every shape a stale writer can be fenced
// in, and checks that pgfence fenced stale writes in every run.
func (r *runner) shapesStorm(pf, dom target) (map[string]map[string]series, error) {
	if err := r.writeStormScripts(); err != nil {
		return nil, err
	}
	logf("shapes storm: setting every row's epoch and the lock domain's token to 2000")
	if err := r.sql("UPDATE pgbench_accounts SET fence_epoch = 2000",
		"UPDATE pgfence.domains SET token = 2000 WHERE domain = '"+benchDomain+"'", "VACUUM ANALYZE pgbench_accounts"); err != nil {
		return nil, err
	}
	res, err := r.interleaveModes("write shapes storm", shapesModes, shapesMeasurements(r.scripts, r.pgbouncer, pf, dom, stormWorkloads, "-storm"))
	if err != nil {
		return nil, err
	}
	for _, mode := range shapesModes {
		for _, w := range stormWorkloads {
			for i, x := range res[mode]["pgfence: "+w.label] {
				if x.rejects <= 0 {
					return nil, fmt.Errorf("shapes storm -M %s %s round %d: fencing_reject_total did not grow", mode, w.label, i+1)
				}
			}
		}
	}
	return res, nil
}

// shapesBackstop runs the shapes again with the database backstop's
// trigger on pgbench_accounts and pgbench_fenced_log, which every writer
// pays, through PgBouncer too: installed by a pgfence with --backstop
// install, as serve does by default. Rows and the domain go back to epoch
// and token 0 first (the scripts' token is 1000 again). The lock-domain
// UPDATE runs last, on its own: once a domain pgfence has recorded
// pgbench_accounts in the domain, the trigger claims the domain for every
// write to it, the other shapes' included.
func (r *runner) shapesBackstop() (map[string]map[string]series, error) {
	logf("shapes with the backstop: rows and the lock domain back to 0, installing the backstop")
	if err := r.sql("DELETE FROM pgfence.domain_members WHERE relid = 'pgbench_accounts'::regclass",
		"UPDATE pgbench_accounts SET fence_epoch = 0", "UPDATE pgfence.domains SET token = 0 WHERE domain = '"+benchDomain+"'",
		"VACUUM ANALYZE pgbench_accounts"); err != nil {
		return nil, err
	}
	bs, _, err := r.startPgfence("pgfence shapes backstop", r.pgfenceBin, "--backstop", "install", "--guard", "pgbench_accounts", "--guard", "pgbench_fenced_log")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, r.pg.URL("postgres"))
	if err != nil {
		return nil, err
	}
	err = awaitTriggers(ctx, c, "pgbench_accounts", "pgbench_fenced_log")
	c.Close(ctx)
	if err != nil {
		return nil, err
	}
	rowOnly := slices.DeleteFunc(slices.Clone(shapesWorkloads), func(w workload) bool { return w.domain })
	res, err := r.interleaveModes("write shapes, backstop", shapesModes, shapesMeasurements(r.scripts, r.pgbouncer, bs, bs, rowOnly, ""))
	if err != nil {
		return nil, err
	}
	logf("shapes with the backstop: starting pgfence with --domain pgbench_accounts=%s", benchDomain)
	dom, _, err := r.startPgfence("pgfence shapes backstop domain", r.pgfenceBin, "--backstop", "install",
		"--guard", "pgbench_accounts", "--domain", "pgbench_accounts="+benchDomain)
	if err != nil {
		return nil, err
	}
	domainOnly := slices.DeleteFunc(slices.Clone(shapesWorkloads), func(w workload) bool { return !w.domain })
	dres, err := r.interleaveModes("write shapes, backstop, lock domain", shapesModes, shapesMeasurements(r.scripts, r.pgbouncer, bs, dom, domainOnly, ""))
	if err != nil {
		return nil, err
	}
	for mode, byLabel := range dres {
		for label, s := range byLabel {
			res[mode][label] = s
		}
	}
	return res, nil
}

// renderShapesStorm renders the storm: pgfence against PgBouncer with the
// fence by hand, and pgfence's storm against its own fresh run of the
// same shape (fresh: the first table's runs).
func renderShapesStorm(storm, fresh map[string]map[string]series) string {
	var b strings.Builder
	b.WriteString(renderAgainst("### Write shapes, stale-writer storm (even clients token 2000, odd clients stale 1000; every row at epoch 2000)",
		[2]string{"PgBouncer tps", "pgfence tps"}, shapesModes, stormWorkloads, storm))
	b.WriteString("pgfence's storm against its own fresh run of the same shape (the first table), and its rejects per transaction:\n\n")
	var t table
	t.add("mode", "workload", "fresh tps", "storm tps", "storm/fresh", "rejects/txn")
	for _, mode := range shapesModes {
		for _, w := range stormWorkloads {
			f, s := fresh[mode]["pgfence: "+w.label], storm[mode]["pgfence: "+w.label]
			t.add(mode, w.label, f0(f.tps()), f0(s.tps()), f2(s.tps()/f.tps()), f2(median(s, func(x run) float64 { return x.rejects / x.txns })))
		}
	}
	b.WriteString(t.String() + "\n")
	return b.String()
}
