package main

// Reading holds' cost: pipelines of fenced writes (pgbench \startpipeline,
// ten UPDATEs of pgbench_accounts per transaction, after a set_config of
// the token), with and without a function call between the writes, and
// with the writes' text all ASCII or with a non-ASCII string literal.
// pgfence holds a statement sent before the server has answered what came
// before only when it may write a guarded table and reads otherwise under
// another client_encoding or standard_conforming_strings (see proxy's
// Reading holds): an ASCII write never waits, whatever precedes it; a
// non-ASCII one waits for a round trip (a probe of the settings, in a
// batch) at every Parse, so in -M extended at every statement and in -M
// prepared only at its first.
//
// Targets: Postgres directly, pgfence, and, when BENCH_BEFORE_BIN names
// one, a pgfence binary built without the reading holds (the commit before
// them), side by side. BENCH_ONLY=holds runs this section alone and writes
// its table to bench/last-run-holds.md.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// holdsWrites is how many UPDATEs one pipeline sends.
const holdsWrites = 10

var holdsModes = []string{"extended", "prepared"}

// holdsWorkloads are the section's scripts, by label, in table order.
var holdsWorkloads = []struct {
	label string
	value string // the filler the writes set: ASCII or not
	call  bool   // a function call before each write
}{
	{"ASCII", "note", false},
	{"ASCII, call between", "note", true},
	{"non-ASCII", "notä", false},
	{"non-ASCII, call between", "notä", true},
}

// holdsScript is one pipelined transaction: the token, then holdsWrites
// UPDATEs of random accounts, each after a function call if call.
func holdsScript(value string, call bool) string {
	var b strings.Builder
	for i := 1; i <= holdsWrites; i++ {
		fmt.Fprintf(&b, "\\set a%d random(1, %d)\n", i, accounts)
	}
	b.WriteString("\\startpipeline\nSELECT set_config('fence.token', '1000', false);\n")
	for i := 1; i <= holdsWrites; i++ {
		if call {
			b.WriteString("SELECT set_config('application_name', 'bench', false);\n")
		}
		fmt.Fprintf(&b, "UPDATE pgbench_accounts SET abalance = abalance + 1, filler = '%s' WHERE aid = :a%d;\n", value, i)
	}
	b.WriteString("\\endpipeline\n")
	return b.String()
}

// benchHoldsOnly is BENCH_ONLY=holds.
func (r *runner) benchHoldsOnly() error {
	start := time.Now()
	load := loadAvg()
	if err := r.setup(); err != nil {
		return err
	}
	logf("starting pgfence with --guard pgbench_accounts")
	now, _, err := r.startPgfence("pgfence", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts")
	if err != nil {
		return err
	}
	if err := r.checkFencing(now); err != nil {
		return err
	}
	targets := []struct {
		name string
		t    target
	}{{"Postgres", r.direct}, {"pgfence", now}}
	before := os.Getenv("BENCH_BEFORE_BIN")
	if before != "" {
		logf("starting %s (BENCH_BEFORE_BIN) with --guard pgbench_accounts", before)
		b, _, err := r.startPgfence("pgfence before", before, "--backstop", "off", "--guard", "pgbench_accounts")
		if err != nil {
			return err
		}
		targets = append(targets, struct {
			name string
			t    target
		}{"pgfence before", b})
	}
	var ms []measurement
	for _, w := range holdsWorkloads {
		file := filepath.Join(r.tmp, "holds-"+strings.NewReplacer(" ", "-", ",", "").Replace(w.label)+".sql")
		if err := os.WriteFile(file, []byte(holdsScript(w.value, w.call)), 0o644); err != nil {
			return err
		}
		for _, t := range targets {
			tc := t.t
			tc.clients = 4
			ms = append(ms, measurement{t.name + ": " + w.label, tc, []string{"-f", file}})
		}
	}
	res, err := r.interleaveModes("holds", holdsModes, ms)
	if err != nil {
		return err
	}
	var names []string
	for _, t := range targets {
		names = append(names, t.name)
	}
	body := renderHolds(res, names)
	if before != "" {
		body += "\n`pgfence before`: " + before + ", `" + firstLine(exec.Command(before, "version")) + "`.\n"
	}
	r.sectionReport("holds", fmt.Sprintf("pgbench -c 4 -T %d per run, %d pipelined UPDATEs per transaction", r.seconds, holdsWrites), start, load, body)
	return nil
}

func renderHolds(res map[string]map[string]series, targets []string) string {
	var b strings.Builder
	b.WriteString("### Reading holds' cost (pipelines of fenced writes, with and without a call between them)\n\n")
	var t table
	head := []string{"mode", "writes"}
	for _, n := range targets {
		head = append(head, n+" tps")
	}
	for _, n := range targets[1:] {
		head = append(head, n+"/Postgres")
	}
	for _, n := range targets[1:] {
		head = append(head, n+" CPU µs/txn")
	}
	t.add(head...)
	for _, mode := range holdsModes {
		for _, w := range holdsWorkloads {
			row := []string{mode, w.label}
			direct := res[mode][targets[0]+": "+w.label]
			for _, n := range targets {
				row = append(row, f0(res[mode][n+": "+w.label].tps()))
			}
			for _, n := range targets[1:] {
				row = append(row, f2(ratio(res[mode][n+": "+w.label], direct)))
			}
			for _, n := range targets[1:] {
				row = append(row, f1(res[mode][n+": "+w.label].cpuUs()))
			}
			t.add(row...)
		}
	}
	b.WriteString(t.String())
	return b.String()
}
