package main

// Lock-domain cost: the fenced-writes script (SET fence.token + UPDATE
// pgbench_accounts) through a pgfence guarding pgbench_accounts with
// row-only fencing, against a pgfence that also puts the table in a lock
// domain (--domain pgbench_accounts=bench). A domain write first checks and
// raises the domain's token row in pgfence.domains, in the same statement,
// so every writer of the domain takes that row's lock until it commits:
// writers of one domain are serialised. Run at 1, 4 and 8 clients, -M
// extended and -M prepared, interleaved and repeated like the other sections.
//
// BENCH_ONLY=domain runs this section alone (setup, the two pgfence
// processes, 3 rounds × 2 modes × 2 targets × 3 client counts × 3 s),
// then where a domain write's time goes (benchDomainCost, 3 rounds × 10
// lines × 3 s): about 4.5 min. It writes its tables to
// bench/last-run-domain.md.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfence/pgfence/sqlrewrite"
)

const benchDomain = "bench"

var domainClients = []int{1, 4, 8}

var domainModes = []string{"extended", "prepared"}

func domainLabel(domain bool, clients int) string {
	kind := "row-only"
	if domain {
		kind = "domain"
	}
	if clients == 1 {
		return kind + ", 1 client"
	}
	return fmt.Sprintf("%s, %d clients", kind, clients)
}

// benchDomain starts the domain pgfence and runs the section; rowOnly is
// the pgfence that guards pgbench_accounts without a domain. Every write
// uses token 1000, so no row may be at a higher epoch.
func (r *runner) benchDomain(rowOnly target) (map[string]map[string]series, error) {
	logf("starting pgfence with --guard pgbench_accounts --domain pgbench_accounts=%s", benchDomain)
	dom, domSvc, err := r.startPgfence("pgfence domain", r.pgfenceBin, "--backstop", "off",
		"--guard", "pgbench_accounts", "--domain", "pgbench_accounts="+benchDomain)
	if err != nil {
		return nil, err
	}
	// checkFencing wants row 1 below token 5; earlier sections may have
	// raised it to 1000.
	if err := r.sql("UPDATE pgbench_accounts SET fence_epoch = 0 WHERE aid = 1"); err != nil {
		return nil, err
	}
	if err := r.checkFencing(dom); err != nil {
		return nil, err
	}
	script := []string{"-f", r.scripts["fenced-pgfence"]}
	var ms []measurement
	for _, c := range domainClients {
		ro, do := rowOnly, dom
		ro.clients, do.clients = c, c
		ms = append(ms,
			measurement{domainLabel(false, c), ro, script},
			measurement{domainLabel(true, c), do, script})
	}
	w0, err := r.queryInt("SELECT count(*) FROM pgbench_accounts WHERE fence_epoch = 1000")
	if err != nil {
		return nil, err
	}
	out, err := r.interleaveModes("lock domain", domainModes, ms)
	if err != nil {
		return nil, err
	}
	// The domain's token row was raised to 1000 and no write was fenced.
	tok, err := r.queryInt("SELECT token FROM pgfence.domains WHERE domain = '" + benchDomain + "'")
	if err != nil || tok != 1000 {
		return nil, fmt.Errorf("after the domain runs pgfence.domains has token %d for %q, want 1000 (%v)", tok, benchDomain, err)
	}
	if w1, err := r.queryInt("SELECT count(*) FROM pgbench_accounts WHERE fence_epoch = 1000"); err != nil || w1 <= w0 {
		return nil, fmt.Errorf("the domain runs raised no row to epoch 1000 (%d before, %d after, %v)", w0, w1, err)
	}
	for _, mode := range domainModes {
		for label, s := range out[mode] {
			for i, x := range s {
				if x.rejects != 0 {
					return nil, fmt.Errorf("lock domain -M %s %s round %d: %.0f fenced writes, want 0", mode, label, i+1, x.rejects)
				}
			}
		}
	}
	// The domain pgfence recorded pgbench_accounts in the lock domain in
	// the database, which every pgfence started from now on would apply
	// (see startPgfence): stop it and take the table out again, so that
	// later sections' pgfences guard it row-only, as before.
	domSvc.stop()
	if err := r.sql("DELETE FROM pgfence.domain_members WHERE relid = 'pgbench_accounts'::regclass"); err != nil {
		return nil, err
	}
	return out, nil
}

// benchDomainOnly is BENCH_ONLY=domain.
func (r *runner) benchDomainOnly() error {
	start := time.Now()
	load := loadAvg()
	if err := r.setup(); err != nil {
		return err
	}
	logf("starting pgfence with --guard pgbench_accounts")
	rowOnly, _, err := r.startPgfence("pgfence guarded", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts")
	if err != nil {
		return err
	}
	if err := r.checkFencing(rowOnly); err != nil {
		return err
	}
	res, err := r.benchDomain(rowOnly)
	if err != nil {
		return err
	}
	fresh, storm, err := r.benchDomainCost()
	if err != nil {
		return err
	}
	r.sectionReport("domain", fmt.Sprintf("pgbench -T %d per run", r.seconds), start, load, renderDomain(res)+renderDomainCost(fresh, storm))
	return nil
}

// sectionReport prints a section run alone (BENCH_ONLY=name) with when,
// where and how it ran, and writes it to bench/last-run-<name>.md.
func (r *runner) sectionReport(name, runs string, start time.Time, load, body string) {
	m := machineInfo()
	var b strings.Builder
	fmt.Fprintf(&b, "## Results (BENCH_ONLY=%s)\n\nRun %s, took %s. %s, %d interleaved rounds; "+
		"medians (ratios: median of the per-round ratios). Load average before %s, after %s.\n\n",
		name, time.Now().Format("2006-01-02 15:04 MST"), time.Since(start).Round(time.Second), runs, r.rounds, load, loadAvg())
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s RAM, %s; %s; %s.\n\npgfence: %s.\n\n", m.nproc, m.cpu, m.mem, m.kernel,
		firstLine(exec.Command(filepath.Join(r.pg.BinDir, "postgres"), "--version")),
		firstLine(exec.Command(r.pgbenchBin, "--version")), pgfenceVersion(r.pgfenceBin))
	b.WriteString(body)
	text := b.String()
	fmt.Println(text)
	file := filepath.Join("bench", "last-run-"+name+".md")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		logf("writing %s: %v", file, err)
	}
}

func renderDomain(res map[string]map[string]series) string {
	var b strings.Builder
	b.WriteString("### Lock-domain cost (fenced writes, row-only fencing vs pgbench_accounts in a lock domain)\n\n")
	var t table
	t.add("mode", "clients", "row-only tps", "domain tps", "domain/row-only",
		"pgfence CPU µs/txn: row-only", "domain", "Postgres CPU µs/txn: row-only", "domain")
	var raw []string
	for _, mode := range domainModes {
		for _, c := range domainClients {
			ro, do := res[mode][domainLabel(false, c)], res[mode][domainLabel(true, c)]
			t.add(mode, fmt.Sprint(c), f0(ro.tps()), f0(do.tps()), f2(ratio(do, ro)),
				f1(ro.cpuUs()), f1(do.cpuUs()), f1(ro.pgCPUUs()), f1(do.pgCPUUs()))
			for _, l := range []string{domainLabel(false, c), domainLabel(true, c)} {
				var parts []string
				for _, x := range res[mode][l] {
					parts = append(parts, fmt.Sprintf("%.0f/%.1f/%.1f", x.tps, x.cpuUs, x.pgCPUUs))
				}
				raw = append(raw, fmt.Sprintf("%-9s %-20s %s", mode, l, strings.Join(parts, "  ")))
			}
		}
	}
	b.WriteString(t.String())
	b.WriteString("\n<details><summary>Every lock-domain run, in round order (tps/pgfence CPU µs/txn/Postgres CPU µs/txn)</summary>\n\n```\n")
	b.WriteString(strings.Join(raw, "\n"))
	b.WriteString("\n```\n</details>\n\n")
	return b.String()
}

// Where a lock-domain write's time goes (BENCH_ONLY=domain only): the
// UPDATE pgfence sends for the fenced-writes script with pgbench_accounts
// in a lock domain, and the probe it runs after each Execute, sent
// straight to Postgres, against the same UPDATE fenced by hand with the
// domain's claim (as Write shapes fences it), with and without that probe.
// The probe rides in the UPDATE's implicit transaction as pgfence sends it
// (a pgbench pipeline: one Sync after both), so it runs while the UPDATE
// holds the domain's row, which every writer of the domain waits for.
// -M prepared, 8 clients, fresh (token 1000) and in a stale-writer storm
// (rows and the domain at 2000, odd clients at the stale 1000).
//
// "by hand + SELECT 1" puts the cheapest statement there is where the
// probe goes: what any statement of its own in the hold costs.
//
// "probe after commit" runs the probe in a transaction of its own, after
// the UPDATE's has committed and let the domain's row go: what moving the
// probe out of the row's hold would give, a transaction more per write
// included. pgfence does not send it so (its flags are the transaction's,
// gone by then): the line measures a design, not what pgfence does.
//
// The "SET answered" lines send the UPDATE as pgfence does after a SET of
// the token it answered itself: no SET of its own, the token set by
// pgfence's set_config statement (sqlrewrite.SettingSQL) in the write's
// pipeline, so in its transaction. They are how much of the write's cost
// through pgfence is the probe's.

// domainCostLabels are the section's lines, in order.
var domainCostLabels = []string{"by hand", "by hand + SELECT 1", "by hand + probe", "pgfence's UPDATE", "pgfence's UPDATE + probe",
	"pgfence's UPDATE, probe after commit", "pgfence's UPDATE, SET answered", "pgfence's UPDATE + probe, SET answered"}

// writeDomainCostScripts writes the section's scripts and returns their
// paths by label, fresh and storm.
func (r *runner) writeDomainCostScripts() (fresh, storm map[string]string, err error) {
	update, probe, err := rewrittenUpdate(r.pgfenceBin, "--domain", "pgbench_accounts="+benchDomain)
	if err != nil {
		return nil, nil, err
	}
	_, hand, ok := strings.Cut(domainByHand, shapeToken)
	if !ok || !handToken.MatchString(hand) {
		return nil, nil, fmt.Errorf("the lock-domain script by hand does not set and write token 1000: %q", domainByHand)
	}
	hand = strings.TrimSuffix(strings.TrimSpace(hand), ";")
	// As pgfence sets a token whose SET it answered: :tok is the client's.
	setToken := strings.Replace(strings.Replace(sqlrewrite.SettingSQL, "$1, $2, $3", "E'fence.token', :tok, false", 1), "$4", "false", 1)
	if strings.Contains(setToken, "$") {
		return nil, nil, fmt.Errorf("pgfence's setting statement has changed shape: %q", sqlrewrite.SettingSQL)
	}
	lines := []struct {
		byHand   bool
		answered bool     // the token set by pgfence's statement in the pipeline, not by a SET before it
		stmts    []string // in one pipeline: one Sync after them all
		after    string   // a statement of its own after that Sync
	}{
		{byHand: true, stmts: []string{hand}},
		{byHand: true, stmts: []string{hand, "SELECT 1"}},
		{byHand: true, stmts: []string{hand, probe}},
		{stmts: []string{update}},
		{stmts: []string{update, probe}},
		{stmts: []string{update}, after: probe},
		{answered: true, stmts: []string{setToken, update}},
		{answered: true, stmts: []string{setToken, update, probe}},
	}
	if len(lines) != len(domainCostLabels) {
		return nil, nil, fmt.Errorf("%d lock-domain cost lines for %d labels", len(lines), len(domainCostLabels))
	}
	fresh, storm = map[string]string{}, map[string]string{}
	write := func(name, body string) (string, error) {
		p := filepath.Join(r.tmp, name)
		return p, os.WriteFile(p, []byte(fmt.Sprintf(vars, accounts)+body), 0o644)
	}
	for i, line := range lines {
		body := "\\startpipeline\n" + strings.Join(line.stmts, ";\n") + ";\n\\endpipeline\n"
		if line.after != "" {
			body += line.after + ";\n"
		}
		// In the storm the fence by hand writes the client's token (:tok).
		freshBody, stormBody := shapeToken+body, stormTokenPgfence+body
		switch {
		case line.byHand:
			stormBody = stormTokenHand + handToken.ReplaceAllString(body, ":tok")
		case line.answered:
			freshBody, stormBody = "\\set tok 1000\n"+body, stormTokenVar+body
		}
		label := domainCostLabels[i]
		if fresh[label], err = write(fmt.Sprintf("domain-cost-%d-fresh.sql", i), freshBody); err != nil {
			return nil, nil, err
		}
		if storm[label], err = write(fmt.Sprintf("domain-cost-%d-storm.sql", i), stormBody); err != nil {
			return nil, nil, err
		}
	}
	return fresh, storm, nil
}

// benchDomainCost runs the section: fresh, then the storm, each
// interleaved. It leaves every row at epoch 2000 and the domain at 2000.
func (r *runner) benchDomainCost() (fresh, storm map[string]series, err error) {
	freshScripts, stormScripts, err := r.writeDomainCostScripts()
	if err != nil {
		return nil, nil, err
	}
	direct := r.direct
	direct.clients = 8
	run := func(name string, scripts map[string]string) (map[string]series, error) {
		var ms []measurement
		for _, label := range domainCostLabels {
			ms = append(ms, measurement{label, direct, []string{"-f", scripts[label]}})
		}
		out, err := r.interleaveModes("lock-domain write, "+name, []string{"prepared"}, ms)
		if err != nil {
			return nil, err
		}
		return out["prepared"], nil
	}
	if err := r.sql("UPDATE pgfence.domains SET token = 0 WHERE domain = '"+benchDomain+"'",
		"UPDATE pgbench_accounts SET fence_epoch = 0", "VACUUM ANALYZE pgbench_accounts"); err != nil {
		return nil, nil, err
	}
	if fresh, err = run("fresh", freshScripts); err != nil {
		return nil, nil, err
	}
	// Every line wrote: the domain is at 1000 (the claim by hand sets it
	// as pgfence's does).
	if tok, err := r.queryInt("SELECT token FROM pgfence.domains WHERE domain = '" + benchDomain + "'"); err != nil || tok != 1000 {
		return nil, nil, fmt.Errorf("after the fresh lock-domain writes the domain's token is %d, want 1000 (%v)", tok, err)
	}
	if err := r.sql("UPDATE pgfence.domains SET token = 2000 WHERE domain = '"+benchDomain+"'",
		"UPDATE pgbench_accounts SET fence_epoch = 2000", "VACUUM ANALYZE pgbench_accounts"); err != nil {
		return nil, nil, err
	}
	if storm, err = run("storm", stormScripts); err != nil {
		return nil, nil, err
	}
	// No stale write landed, by hand or by pgfence's UPDATE.
	if n, err := r.queryInt("SELECT count(*) FROM pgbench_accounts WHERE fence_epoch <> 2000"); err != nil || n != 0 {
		return nil, nil, fmt.Errorf("after the lock-domain storm %d rows are not at epoch 2000 (%v)", n, err)
	}
	return fresh, storm, nil
}

func renderDomainCost(fresh, storm map[string]series) string {
	var b strings.Builder
	b.WriteString("### Where a lock-domain write's time goes (straight to Postgres, -M prepared, 8 clients)\n\n")
	var t table
	t.add("line", "fresh tps", "/ by hand", "Postgres CPU µs/txn", "storm tps", "/ by hand", "Postgres CPU µs/txn")
	for _, label := range domainCostLabels {
		f, s := fresh[label], storm[label]
		t.add(label, f0(f.tps()), f2(ratio(f, fresh["by hand"])), f1(f.pgCPUUs()),
			f0(s.tps()), f2(ratio(s, storm["by hand"])), f1(s.pgCPUUs()))
	}
	b.WriteString(t.String())
	return b.String()
}
