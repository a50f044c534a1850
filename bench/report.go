package main

// The table printed at the end (Markdown, readable as plain text too).

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

type machine struct {
	nproc                        int
	cpu, mem, kernel             string
	goVersion                    string
	postgres, pgbouncer, pgbench string
	pgfence                      string // version and git state
}

type report struct {
	seconds, rounds, clients, threads, conns int

	machine               machine
	loadBefore, loadAfter string
	elapsed               time.Duration

	selectOnly, writes, storm map[string]map[string]series
	writesStr                 map[string]map[string]series // fenced writes with a string value, -M simple
	writesTx                  map[string]map[string]series // fenced writes in a transaction block (SET LOCAL)
	selectEqual               map[string]map[string]series // select-only at selectRate, PgBouncer and pgfence
	selectRate                map[string]int               // pgbench -R, by mode
	selectTLS                 map[string]map[string]series // select-only with client TLS, PgBouncer and pgfence
	domain                    map[string]map[string]series // lock-domain cost, -M prepared
	backstop                  *backstopResult              // backstop cost
	memPgfence, memPgBouncer  memResult
	memPgfenceTLS             memResult // the same over TLS
	memPgBouncerTLS           memResult
	goBench                   []*goBench
	goBenchErr                string
}

func machineInfo() machine {
	m := machine{nproc: runtime.NumCPU(), goVersion: firstLine(exec.Command("go", "version"))}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				fmt.Sscan(strings.TrimSpace(v), &kb)
				m.mem = fmt.Sprintf("%.1f GiB", kb/1024/1024)
			}
		}
	}
	m.kernel = firstLine(exec.Command("uname", "-sr"))
	return m
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func firstLine(cmd *exec.Cmd) string {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "?"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// table is a Markdown table under construction.
type table struct{ rows [][]string }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) String() string {
	width := make([]int, len(t.rows[0]))
	for _, row := range t.rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(row []string) {
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i == 0 {
				b.WriteString("| " + c + pad + " ")
			} else {
				b.WriteString("| " + pad + c + " ")
			}
		}
		b.WriteString("|\n")
	}
	line(t.rows[0])
	for i := range t.rows[0] {
		if i == 0 {
			b.WriteString("|" + strings.Repeat("-", width[i]+2))
		} else {
			b.WriteString("|" + strings.Repeat("-", width[i]+1) + ":")
		}
	}
	b.WriteString("|\n")
	for _, row := range t.rows[1:] {
		line(row)
	}
	return b.String()
}

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }
func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func (r *report) render() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := r.machine
	p("## Results\n\n")
	p("Run %s, took %s. pgbench -c %d -j %d -T %d per run, %d interleaved rounds; medians (ratios: median of the per-round ratios). "+
		"Load average before %s, after %s.\n\n",
		time.Now().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second), r.clients, r.threads, r.seconds, r.rounds,
		r.loadBefore, r.loadAfter)
	p("Machine: %d CPUs (%s), %s RAM, %s; %s; %s; %s; %s.\n\n", m.nproc, m.cpu, m.mem, m.kernel, m.postgres, m.pgbench, m.pgbouncer, m.goVersion)
	p("pgfence: %s.\n\n", m.pgfence)

	var targets table
	targets.add("target", "measured", "met")

	// 1. Select-only.
	p("### 1. Select-only (pgbench -S)\n\n")
	var t1 table
	t1.add("mode", "direct tps", "PgBouncer tps", "pgfence tps", "pgfence/PgBouncer", "pgfence/direct",
		"PgBouncer CPU µs/txn", "pgfence CPU µs/txn", "Postgres CPU µs/txn: direct", "via PgBouncer", "via pgfence")
	var t1g table
	t1g.add("mode", "pgfence, pgbench_accounts guarded: tps", "/PgBouncer", "pgfence CPU µs/txn", "Postgres CPU µs/txn")
	for _, mode := range modes {
		s := r.selectOnly[mode]
		d, pb, pf, pg := s["direct"], s["PgBouncer"], s["pgfence"], s["pgfence guarded"]
		t1.add(mode, f0(d.tps()), f0(pb.tps()), f0(pf.tps()), f2(ratio(pf, pb)), f2(ratio(pf, d)),
			f1(pb.cpuUs()), f1(pf.cpuUs()), f1(d.pgCPUUs()), f1(pb.pgCPUUs()), f1(pf.pgCPUUs()))
		t1g.add(mode, f0(pg.tps()), f2(ratio(pg, pb)), f1(pg.cpuUs()), f1(pg.pgCPUUs()))
		targets.add("select-only -M "+mode+": pgfence tps >= PgBouncer's",
			fmt.Sprintf("%.2f×", ratio(pf, pb)), yes(ratio(pf, pb) >= 1))
		targets.add("select-only -M "+mode+": pgfence CPU/txn <= PgBouncer's",
			fmt.Sprintf("%.1f vs %.1f µs", pf.cpuUs(), pb.cpuUs()), yes(pf.cpuUs() <= pb.cpuUs()))
	}
	p("%s\nThe same through a pgfence guarding pgbench_accounts (every SELECT names it, so none is passed by the prefilter):\n\n%s\n",
		t1.String(), t1g.String())
	if r.selectEqual != nil {
		var t1e table
		t1e.add("mode", "rate (pgbench -R)", "PgBouncer tps", "pgfence tps", "PgBouncer CPU µs/txn", "pgfence CPU µs/txn",
			"pgfence/PgBouncer CPU")
		for _, mode := range modes {
			s := r.selectEqual[mode]
			pb, pf := s["PgBouncer"], s["pgfence"]
			t1e.add(mode, fmt.Sprint(r.selectRate[mode]), f0(pb.tps()), f0(pf.tps()), f1(pb.cpuUs()), f1(pf.cpuUs()),
				f2(pf.cpuUs()/pb.cpuUs()))
			targets.add(fmt.Sprintf("select-only -M %s at equal load (-R %d): pgfence CPU/txn <= PgBouncer's", mode, r.selectRate[mode]),
				fmt.Sprintf("%.1f vs %.1f µs", pf.cpuUs(), pb.cpuUs()), yes(pf.cpuUs() <= pb.cpuUs()))
		}
		p("The same at equal load: both proxies at one rate, 80%% of the slower one's median tps above, so their CPU per "+
			"transaction is compared for the same work:\n\n%s\n", t1e.String())
	}

	if r.selectTLS != nil {
		var t1t table
		t1t.add("mode", "PgBouncer tps", "pgfence tps", "pgfence/PgBouncer", "PgBouncer CPU µs/txn", "pgfence CPU µs/txn",
			"Postgres CPU µs/txn: via PgBouncer", "via pgfence")
		for _, mode := range modes {
			s := r.selectTLS[mode]
			pb, pf := s["PgBouncer, TLS"], s["pgfence, TLS"]
			t1t.add(mode, f0(pb.tps()), f0(pf.tps()), f2(ratio(pf, pb)), f1(pb.cpuUs()), f1(pf.cpuUs()),
				f1(pb.pgCPUUs()), f1(pf.pgCPUUs()))
		}
		p("The same over TLS (pgbench with sslmode=require; each proxy terminates TLS with a self-signed P-256 "+
			"certificate and its default settings, and reaches Postgres in plain text). Not one of the issue's targets:\n\n%s\n", t1t.String())
	}

	// 2. Fenced writes.
	p("### 2. Fenced writes (SET fence.token + UPDATE pgbench_accounts per transaction)\n\n")
	var t2 table
	t2.add("mode", "direct, hand-fenced tps", "PgBouncer, hand-fenced tps", "pgfence, rewritten tps",
		"pgfence/PgBouncer", "pgfence/direct", "PgBouncer CPU µs/txn", "pgfence CPU µs/txn",
		"Postgres CPU µs/txn: direct", "via PgBouncer", "via pgfence")
	var t2f table
	t2f.add("mode", "pgfence, SET forwarded: tps", "/PgBouncer", "/pgfence answering the SET", "pgfence CPU µs/txn", "Postgres CPU µs/txn")
	var t2b table
	t2b.add("mode", "direct, pgfence's SQL by hand: tps", "/direct hand-fenced", "pgfence/this",
		"Postgres CPU µs/txn")
	for _, mode := range modes {
		s := r.writes[mode]
		d, pb, pf := s["direct, hand-fenced"], s["PgBouncer, hand-fenced"], s["pgfence, rewritten"]
		t2.add(mode, f0(d.tps()), f0(pb.tps()), f0(pf.tps()), f2(ratio(pf, pb)), f2(ratio(pf, d)),
			f1(pb.cpuUs()), f1(pf.cpuUs()), f1(d.pgCPUUs()), f1(pb.pgCPUUs()), f1(pf.pgCPUUs()))
		if fw, ok := s["pgfence, SET forwarded"]; ok {
			t2f.add(mode, f0(fw.tps()), f2(ratio(fw, pb)), f2(ratio(fw, pf)), f1(fw.cpuUs()), f1(fw.pgCPUUs()))
		}
		if rs, ok := s["direct, pgfence's SQL"]; ok {
			t2b.add(mode, f0(rs.tps()), f2(ratio(rs, d)), f2(ratio(pf, rs)), f1(rs.pgCPUUs()))
		}
		targets.add("fenced writes -M "+mode+": pgfence >= 0.9 × hand-fenced via PgBouncer",
			fmt.Sprintf("%.2f×", ratio(pf, pb)), yes(ratio(pf, pb) >= 0.9))
	}
	p("%s\n", t2.String())
	if len(t2f.rows) > 1 {
		p("pgfence answers the plain `SET fence.token` itself and sets the token ahead of the UPDATE, in its transaction, so a transaction "+
			"waits for Postgres once where through PgBouncer it waits twice (see docs/token.md). The same script through a "+
			"pgfence with `--forward-token-sets`, which sends the SET as PgBouncer does: what the fenced UPDATE and its probe cost by "+
			"themselves:\n\n%s\n", t2f.String())
	}
	if len(t2b.rows) > 1 {
		p("What the rewritten SQL costs Postgres by itself: the UPDATE and probe that `pgfence rewrite` prints, sent straight to Postgres "+
			"as two statements (pgfence sends the probe in the same Query or batch instead):\n\n%s\n", t2b.String())
	}

	if s := r.writesStr["simple"]; s != nil {
		pb, pf := s["PgBouncer, hand-fenced"], s["pgfence, rewritten"]
		var t2s table
		t2s.add("mode", "PgBouncer, hand-fenced tps", "pgfence, rewritten tps", "pgfence/PgBouncer",
			"PgBouncer CPU µs/txn", "pgfence CPU µs/txn", "Postgres CPU µs/txn: via PgBouncer", "via pgfence")
		t2s.add("simple", f0(pb.tps()), f0(pf.tps()), f2(ratio(pf, pb)), f1(pb.cpuUs()), f1(pf.cpuUs()),
			f1(pb.pgCPUUs()), f1(pf.pgCPUUs()))
		targets.add("fenced writes with a string value -M simple: pgfence >= 0.9 × hand-fenced via PgBouncer",
			fmt.Sprintf("%.2f×", ratio(pf, pb)), yes(ratio(pf, pb) >= 0.9))
		p("The same with a string value that changes (`SET ..., filler = 'note :delta'`), as drivers that interpolate values "+
			"send it; only a simple-protocol Query carries it in the text:\n\n%s\n", t2s.String())
	}

	if r.writesTx != nil {
		var t2t table
		t2t.add("mode", "PgBouncer, hand-fenced tps", "pgfence, rewritten tps", "pgfence/PgBouncer",
			"PgBouncer CPU µs/txn", "pgfence CPU µs/txn", "Postgres CPU µs/txn: via PgBouncer", "via pgfence")
		for _, mode := range modes {
			s := r.writesTx[mode]
			pb, pf := s["PgBouncer, hand-fenced"], s["pgfence, rewritten"]
			t2t.add(mode, f0(pb.tps()), f0(pf.tps()), f2(ratio(pf, pb)), f1(pb.cpuUs()), f1(pf.cpuUs()),
				f1(pb.pgCPUUs()), f1(pf.pgCPUUs()))
			targets.add("fenced writes in a block -M "+mode+": pgfence >= 0.9 × hand-fenced via PgBouncer",
				fmt.Sprintf("%.2f×", ratio(pf, pb)), yes(ratio(pf, pb) >= 0.9))
		}
		p("The same in a transaction block, the token set for the transaction (`BEGIN; SET LOCAL fence.token = '1000'; UPDATE ...; "+
			"COMMIT`): pgfence answers the `SET LOCAL` itself in the open block, so a transaction waits for Postgres three times "+
			"where through PgBouncer it waits four times:\n\n%s\n", t2t.String())
	}

	// 3. Storm.
	p("### 3. Stale-writer storm (even clients token 2000, odd clients stale 1000; every row at epoch 2000)\n\n")
	var t3 table
	t3.add("mode", "PgBouncer, hand-fenced tps", "pgfence, rewritten tps", "pgfence/PgBouncer",
		"PgBouncer CPU µs/txn", "pgfence CPU µs/txn", "Postgres CPU µs/txn: via PgBouncer", "via pgfence",
		"fencing_reject_total growth per run", "rejects/txn")
	for _, mode := range modes {
		s := r.storm[mode]
		pb, pf := s["PgBouncer, hand-fenced"], s["pgfence, rewritten"]
		rej := median(pf, func(x run) float64 { return x.rejects })
		perTxn := median(pf, func(x run) float64 { return x.rejects / x.txns })
		t3.add(mode, f0(pb.tps()), f0(pf.tps()), f2(ratio(pf, pb)), f1(pb.cpuUs()), f1(pf.cpuUs()),
			f1(pb.pgCPUUs()), f1(pf.pgCPUUs()), f0(rej), f2(perTxn))
	}
	p("%s\n", t3.String())

	if r.domain != nil {
		p("%s", renderDomain(r.domain))
	}
	if r.backstop != nil {
		p("%s", renderBackstop(r.backstop))
	}

	// 4. Connections.
	p("### 4. %d idle client connections (each did SELECT 1, then idles)\n\n", r.conns)
	var t4 table
	t4.add("proxy", "open", "VmRSS before MiB", "VmRSS with them MiB", "KiB per connection")
	for _, x := range []struct {
		name string
		m    memResult
	}{{"pgfence (fresh process)", r.memPgfence}, {"pgfence over TLS (fresh process)", r.memPgfenceTLS},
		{"PgBouncer (after the runs above)", r.memPgBouncer}, {"PgBouncer over TLS (right after)", r.memPgBouncerTLS}} {
		t4.add(x.name, fmt.Sprint(x.m.open), f1(x.m.before/1024), f1(x.m.with/1024),
			f1((x.m.with-x.m.before)/float64(max(x.m.open, 1))))
	}
	p("%s\n", t4.String())
	if r.memPgfence.gauge > 0 {
		p("pgfence_client_connections while they were open: %.0f.\n\n", r.memPgfence.gauge)
	}
	targets.add(fmt.Sprintf("%d idle connections < 100 MiB (pgfence VmRSS)", r.conns),
		fmt.Sprintf("%.1f MiB", r.memPgfence.with/1024), yes(r.memPgfence.with/1024 < 100))
	targets.add(fmt.Sprintf("%d idle connections over TLS < 100 MiB (pgfence VmRSS)", r.conns),
		fmt.Sprintf("%.1f MiB", r.memPgfenceTLS.with/1024), yes(r.memPgfenceTLS.with/1024 < 100))

	// 5. Go benchmarks.
	p("### 5. Go benchmarks (go test -bench -benchmem, median of 3)\n\n")
	if r.goBenchErr != "" {
		p("Failed: %s\n\n", r.goBenchErr)
	}
	if len(r.goBench) > 0 {
		var t5 table
		t5.add("benchmark", "ns/op", "B/op", "allocs/op")
		for _, g := range r.goBench {
			t5.add(g.name, f1(g.nsOp), f0(g.bOp), f0(g.allocsOp))
		}
		p("%s\n", t5.String())
		for _, g := range r.goBench {
			switch {
			case strings.HasPrefix(g.name, "PolicyCacheHit/"):
				targets.add("cache hit < 1 µs ("+g.name+")", fmt.Sprintf("%.0f ns", g.nsOp), yes(g.nsOp < 1000))
				targets.add("cache hit 0 allocs ("+g.name+")", fmt.Sprintf("%.0f allocs, %.0f B", g.allocsOp, g.bOp), yes(g.allocsOp == 0))
			case strings.HasPrefix(g.name, "PrefilterMiss/") && !strings.HasSuffix(g.name, "1KiB"):
				targets.add("prefilter < 0.5 µs, 0 allocs ("+g.name+")",
					fmt.Sprintf("%.0f ns, %.0f allocs", g.nsOp, g.allocsOp), yes(g.nsOp < 500 && g.allocsOp == 0))
			}
		}
	}

	p("### Targets\n\n%s", targets.String())

	// Raw per-round numbers, for anyone doubting a median.
	p("\n<details><summary>Every run, in round order (tps/proxy CPU µs/txn/Postgres CPU µs/txn)</summary>\n\n```\n")
	for _, sec := range []struct {
		name string
		m    map[string]map[string]series
	}{{"select-only", r.selectOnly}, {"equal load", r.selectEqual}, {"select, TLS", r.selectTLS}, {"fenced writes", r.writes}, {"string writes", r.writesStr}, {"block writes", r.writesTx}, {"stale storm", r.storm}} {
		for _, mode := range modes {
			for _, s := range sortedSeries(sec.m[mode]) {
				var parts []string
				for _, x := range s.runs {
					parts = append(parts, fmt.Sprintf("%.0f/%.1f/%.1f", x.tps, x.cpuUs, x.pgCPUUs))
				}
				p("%-14s %-9s %-24s %s\n", sec.name, mode, s.label, strings.Join(parts, "  "))
			}
		}
	}
	p("```\n</details>\n")
	return b.String()
}

type labeled struct {
	label string
	runs  series
}

func sortedSeries(m map[string]series) []labeled {
	var out []labeled
	for _, l := range []string{"direct", "PgBouncer", "pgfence", "pgfence guarded", "PgBouncer, TLS", "pgfence, TLS",
		"direct, hand-fenced", "PgBouncer, hand-fenced", "pgfence, rewritten", "pgfence, SET forwarded", "direct, pgfence's SQL"} {
		if s, ok := m[l]; ok {
			out = append(out, labeled{l, s})
		}
	}
	return out
}
