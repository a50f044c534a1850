package main

// Write shapes (issue 30): fenced writes of other shapes than the UPDATE of
// the main tables, each against the same write fenced by hand through
// PgBouncer, at -M simple, extended and prepared. Simple-protocol text with
// its literals inline is what psycopg2, many ORMs and hand-written tooling
// send; pgfence binds such a write to a statement it prepares once per
// session, where the shape allows.
//
// BENCH_ONLY=shapes runs this section alone and writes its table to
// bench/last-run-shapes.md.

import (
	"fmt"
	"strings"
	"time"
)

var shapesModes = []string{"simple", "extended", "prepared"}

// shapesWorkloads are the section's workloads: label, the script through
// PgBouncer (fenced by hand), and through pgfence.
var shapesWorkloads = []workload{
	{label: "UPDATE (reference)", hand: "fenced-hand", pgfence: "fenced-pgfence"},
	{label: "upsert, one row", hand: "upsert-hand", pgfence: "upsert-pgfence"},
	{label: "upsert, three rows", hand: "upsert3-hand", pgfence: "upsert3-pgfence"},
	{label: "DELETE ... IN (1 to 3)", hand: "delete-in-hand", pgfence: "delete-in-pgfence"},
	{label: "INSERT of 1 to 3 rows", hand: "insert-rows-hand", pgfence: "insert-rows-pgfence"},
	{label: "INSERT ... SELECT upsert, 5 rows", hand: "insert-select-hand", pgfence: "insert-select-pgfence"},
	{label: "writable CTE", hand: "cte-hand", pgfence: "cte-pgfence"},
	{label: "UPDATE in a lock domain", hand: "domain-hand", pgfence: "fenced-pgfence", domain: true},
}

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
	dom, _, err := r.startPgfence("pgfence domain", r.pgfenceBin, "--backstop", "off",
		"--guard", "pgbench_accounts", "--domain", "pgbench_accounts="+benchDomain)
	if err != nil {
		return err
	}
	var ms []measurement
	for _, w := range shapesWorkloads {
		through := pf
		if w.domain {
			through = dom
		}
		ms = append(ms, measurement{"PgBouncer: " + w.label, r.pgbouncer, []string{"-f", r.scripts[w.hand]}},
			measurement{"pgfence: " + w.label, through, []string{"-f", r.scripts[w.pgfence]}})
	}
	res, err := r.interleaveModes("write shapes", shapesModes, ms)
	if err != nil {
		return err
	}
	r.sectionReport("shapes", fmt.Sprintf("pgbench -c %d -j %d -T %d per run", r.clients, r.threads, r.seconds), start, load, renderShapes(res))
	return nil
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
