package main

// BENCH_ONLY=loops: how pgfence scales with its event loops. Select-only
// (-S) and the fenced UPDATE in each protocol mode, with 16 clients,
// through:
//
//   - pgfence with one loop on one P (GOMAXPROCS=1), as on a one-core
//     machine;
//   - pgfence with a loop per core, each always on a P of its own
//     (--core-governor=false);
//   - pgfence with its default: a loop per core, on as many Ps as its
//     load keeps busy (internal/cores);
//   - one PgBouncer, and as many PgBouncers as cores sharing one port
//     (so_reuseport), which is how PgBouncer's users scale it.
//
// Each run prints throughput, the cores the proxy used (its CPU time over
// the run's wall time), its CPU per transaction, and for pgfence the
// sessions each loop held halfway through and the Ps it ran on then
// (pgfence_cores). On a machine where Postgres and pgbench share the
// cores with the proxy, they, not the proxy, bound throughput; CPU per
// transaction and the balance show what the loops cost and where
// sessions went. The table goes to bench/last-run-loops.md.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// loopsClients is the section's pgbench -c: enough for every loop of a
// 2-core machine to hold several sessions.
const loopsClients = 16

var loopsWorkloads = []workload{
	{label: "select-only", hand: "", pgfence: ""},
	{label: "fenced UPDATE", hand: "fenced-hand", pgfence: "fenced-pgfence"},
}

// benchLoopsOnly is BENCH_ONLY=loops.
func (r *runner) benchLoopsOnly() error {
	start := time.Now()
	load := loadAvg()
	if err := r.setup(); err != nil {
		return err
	}
	cores := runtime.NumCPU()
	fleet, err := r.startPgBouncerFleet(cores)
	if err != nil {
		return err
	}
	type proxy struct {
		label string
		env   []string
		flags []string
	}
	proxies := []proxy{
		{"pgfence, 1 loop, GOMAXPROCS=1", []string{"GOMAXPROCS=1"}, []string{"--event-loops", "1"}},
		{fmt.Sprintf("pgfence, %d loops, every P", cores), []string{fmt.Sprintf("GOMAXPROCS=%d", cores)}, []string{"--core-governor=false"}},
		{fmt.Sprintf("pgfence, %d loops", cores), []string{fmt.Sprintf("GOMAXPROCS=%d", cores)}, nil},
	}
	bouncers := []target{r.pgbouncer, fleet}
	bouncers[0].name, bouncers[1].name = "PgBouncer ×1", fmt.Sprintf("PgBouncer ×%d, so_reuseport", cores)
	var pgfences []target
	for _, p := range proxies {
		t, _, err := r.startPgfenceEnv(p.label, r.pgfenceBin, p.env, append([]string{"--backstop", "off", "--guard", "pgbench_accounts"}, p.flags...)...)
		if err != nil {
			return err
		}
		if err := r.checkFencing(t); err != nil {
			return err
		}
		t.name, t.sampleLoops = p.label, true
		pgfences = append(pgfences, t)
	}
	var ms []measurement
	for _, w := range loopsWorkloads {
		hand, fenced := []string{"-S"}, []string{"-S"}
		if w.hand != "" {
			hand, fenced = []string{"-f", r.scripts[w.hand]}, []string{"-f", r.scripts[w.pgfence]}
		}
		for _, b := range bouncers {
			b.clients = loopsClients
			ms = append(ms, measurement{b.name + ": " + w.label, b, hand})
		}
		for _, p := range pgfences {
			p.clients = loopsClients
			ms = append(ms, measurement{p.name + ": " + w.label, p, fenced})
		}
	}
	res, err := r.interleave("loops", ms)
	if err != nil {
		return err
	}
	locks, err := r.lockProfiles(cores)
	if err != nil {
		// The runs above stand: report them, and why this part is missing.
		logf("lock profiles: %v", err)
		locks = fmt.Sprintf("### Lock and block profiles under load\n\nNot measured: %v\n\n", err)
	}
	var names []string
	for _, b := range bouncers {
		names = append(names, b.name)
	}
	for _, p := range pgfences {
		names = append(names, p.name)
	}
	r.sectionReport("loops", fmt.Sprintf("pgbench -c %d -j %d -T %d per run; %d cores", loopsClients, r.threads, r.seconds, cores),
		start, load, renderLoops(names, res)+locks)
	return nil
}

// lockProfiles runs the profiling build with a loop per core, recording
// every contended lock and every blocking event, under each workload in
// prepared and simple mode, and reports those whose stacks pass through
// pgfence's code: what the loops would wait for each other on.
func (r *runner) lockProfiles(cores int) (string, error) {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	bin := filepath.Join(r.tmp, "pgfence-prof")
	if out, err := exec.Command(goBin, "build", "-o", bin, "./bench/pgfence-prof").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building bench/pgfence-prof: %v\n%s", err, out)
	}
	prof, svc, err := r.startPgfence("pgfence-prof, lock profiles", bin, "--guard", "pgbench_accounts", "--lock-profiles",
		"--event-loops", strconv.Itoa(cores))
	if err != nil {
		return "", err
	}
	defer svc.stop()
	// The fenced UPDATEs above left epoch 1000 on the rows they wrote,
	// row 1 among them perhaps: the check writes it with tokens 5 and 3.
	if err := r.sql("UPDATE pgbench_accounts SET fence_epoch = 0 WHERE aid = 1"); err != nil {
		return "", err
	}
	if err := r.checkFencing(prof); err != nil {
		return "", err
	}
	prof.clients, prof.sampleLoops = loopsClients, true
	base := strings.TrimSuffix(prof.metrics, "/metrics")
	var b strings.Builder
	fmt.Fprintf(&b, "### Lock and block profiles under load (%d loops, pgbench -c %d, every event recorded)\n\n", cores, loopsClients)
	b.WriteString("Contended locks (`/debug/pprof/mutex`, fraction 1) and blocking events (`/debug/pprof/block`, rate 1) during each run whose stacks pass through pgfence's code: on a loop relaying messages, and at a session's start or end (its goroutine posting the session to its loop and waiting for it to end; pgbench connects its 16 clients at the start of each run and disconnects them at its end). The profiling build (bench/pgfence-prof) runs the same proxy and policy.\n\n")
	var t table
	t.add("run", "tps", "sessions per loop", "contended locks in pgfence's code: relaying / at sessions' start and end", "blocking events: relaying / at start and end", "contended runtime locks (the scheduler's)")
	var stacks []string
	for _, mode := range []string{"prepared", "simple"} {
		for _, w := range loopsWorkloads {
			workload := []string{"-S"}
			if w.pgfence != "" {
				workload = []string{"-f", r.scripts[w.pgfence]}
			}
			m0, err := profileRecords(base + "/debug/pprof/mutex?debug=1")
			if err != nil {
				return "", err
			}
			b0, err := profileRecords(base + "/debug/pprof/block?debug=1")
			if err != nil {
				return "", err
			}
			res, err := r.pgbenchClients(prof, mode, loopsClients, workload)
			if err != nil {
				return "", err
			}
			m1, err := profileRecords(base + "/debug/pprof/mutex?debug=1")
			if err != nil {
				return "", err
			}
			b1, err := profileRecords(base + "/debug/pprof/block?debug=1")
			if err != nil {
				return "", err
			}
			name := "-M " + mode + " " + w.label
			mh, ml, mr, ms := ourEvents(m0, m1)
			bh, bl, _, bs := ourEvents(b0, b1)
			logf("lock profiles: %s: %.0f tps; relaying: %d contended locks, %d blocking events; at sessions' start and end: %d and %d; the runtime's own locks: %d",
				name, res.tps, mh, bh, ml, bl, mr)
			t.add(name, f0(res.tps), "["+res.loops+"]", fmt.Sprintf("%d / %d", mh, ml), fmt.Sprintf("%d / %d", bh, bl), strconv.FormatInt(mr, 10))
			for _, st := range ms {
				stacks = append(stacks, name+", contended lock:\n"+st)
			}
			for _, st := range bs {
				stacks = append(stacks, name+", blocking:\n"+st)
			}
		}
	}
	b.WriteString(t.String())
	if len(stacks) > 0 {
		b.WriteString("\n<details><summary>Their stacks</summary>\n\n```\n" + strings.Join(stacks, "\n\n") + "\n```\n</details>\n")
	}
	b.WriteString("\n")
	return b.String(), nil
}

// profileRecord is one stack of a contention profile: how many events,
// and the stack's functions.
type profileRecord struct {
	count int64
	stack string
}

// profileRecords reads a mutex or block profile in its text form
// (debug=1), by stack.
func profileRecords(url string) (map[string]profileRecord, error) {
	text, err := httpGet(url)
	if err != nil {
		return nil, err
	}
	out := map[string]profileRecord{}
	for _, rec := range strings.Split(text, "\n\n") {
		lines := strings.Split(strings.TrimSpace(rec), "\n")
		for len(lines) > 0 && !strings.Contains(lines[0], " @ ") {
			lines = lines[1:] // the profile's header, before its first record
		}
		if len(lines) == 0 {
			continue
		}
		f := strings.Fields(lines[0])
		if len(f) < 3 || f[2] != "@" {
			continue
		}
		count, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		var fns []string
		for _, l := range lines[1:] {
			if parts := strings.Fields(l); len(parts) >= 3 && parts[0] == "#" {
				fns = append(fns, parts[2])
			}
		}
		stack := strings.Join(fns, "\n")
		r := out[stack]
		out[stack] = profileRecord{count: r.count + count, stack: stack}
	}
	return out, nil
}

// ourEvents counts the events between two snapshots whose stacks pass
// through pgfence's code: on a loop relaying messages (hot), and at a
// session's start or end (a session's goroutine posting to its loop, the
// loop taking the post, the goroutine waiting for its session to end),
// and returns those stacks.
func ourEvents(before, after map[string]profileRecord) (hot, lifecycle, runtimeLocks int64, stacks []string) {
	for k, r := range after {
		d := r.count - before[k].count
		if d > 0 && strings.HasPrefix(k, "runtime.unlock") {
			runtimeLocks += d // the scheduler's own (sched.lock and the like)
		}
		if d <= 0 || !strings.Contains(k, "github.com/pgfence/pgfence/") {
			continue
		}
		what := "at a session's start or end"
		if strings.Contains(k, "proxy.(*loop).run") && !strings.Contains(k, "drainPosts") {
			hot += d
			what = "relaying"
		} else {
			lifecycle += d
		}
		stacks = append(stacks, fmt.Sprintf("  %d events, %s:\n    %s", d, what, strings.ReplaceAll(k, "\n", "\n    ")))
	}
	return hot, lifecycle, runtimeLocks, stacks
}

// startPgBouncerFleet runs n PgBouncers in session mode sharing one port
// (so_reuseport), each with a Unix socket of its own for its admin console.
func (r *runner) startPgBouncerFleet(n int) (target, error) {
	bin, err := ensurePgBouncer()
	if err != nil {
		return target{}, err
	}
	cred, err := postgresCred()
	if err != nil {
		return target{}, err
	}
	port, err := freePort()
	if err != nil {
		return target{}, err
	}
	t := target{name: fmt.Sprintf("PgBouncer ×%d", n), port: port}
	var socks []string
	for i := range n {
		dir := filepath.Join(r.tmp, fmt.Sprintf("pgbouncer-fleet-%d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return target{}, err
		}
		if err := r.writePgBouncerConfig(dir, port, cred, "so_reuseport = 1\nunix_socket_dir = "+dir+"\n"); err != nil {
			return target{}, err
		}
		logPath := filepath.Join(dir, "pgbouncer.log")
		s, err := r.startService(fmt.Sprintf("pgbouncer fleet %d", i), exec.Command(bin, filepath.Join(dir, "pgbouncer.ini")), logPath, cred)
		if err != nil {
			return target{}, err
		}
		// Each listens on its own socket once it is up.
		sock := filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(port))
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return target{}, fmt.Errorf("PgBouncer %d of the fleet has no socket at %s:\n%s", i, sock, tail(logPath))
			}
			select {
			case <-s.done:
				return target{}, fmt.Errorf("PgBouncer %d of the fleet exited at start:\n%s", i, tail(logPath))
			case <-time.After(50 * time.Millisecond):
			}
		}
		if i == 0 {
			t.pid = s.cmd.Process.Pid
		} else {
			t.pids = append(t.pids, s.cmd.Process.Pid)
		}
		socks = append(socks, dir)
	}
	if err := waitPort(&service{name: t.name, done: make(chan struct{})}, fmt.Sprintf("127.0.0.1:%d", port), ""); err != nil {
		return target{}, err
	}
	t.fresh = func() error {
		for _, dir := range socks {
			if err := closeServersAt(fmt.Sprintf("postgres://postgres@/pgbouncer?host=%s&port=%d&sslmode=disable", dir, port)); err != nil {
				return err
			}
		}
		return nil
	}
	return t, nil
}

// loopSessions reads pgfence_loop_sessions from /metrics, by loop, and
// pgfence_cores: "2 2; 1 P".
func loopSessions(metricsURL string) string {
	text, err := httpGet(metricsURL)
	if err != nil {
		return "?"
	}
	ps := "?"
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "pgfence_cores "); ok {
			ps = v
		}
	}
	var out []string
	for i := 0; ; i++ {
		prefix := fmt.Sprintf(`pgfence_loop_sessions{loop="%d"} `, i)
		found := false
		for _, line := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				out, found = append(out, v), true
			}
		}
		if !found {
			return strings.Join(out, " ") + "; " + ps + " P"
		}
	}
}

func renderLoops(names []string, res map[string]map[string]series) string {
	var b strings.Builder
	b.WriteString("### Event loops (pgbench -c 16: throughput, the cores the proxy used, its CPU per transaction)\n\n")
	var t table
	t.add("mode", "workload", "proxy", "tps", "cores used", "proxy CPU µs/txn", "Postgres CPU µs/txn", "sessions per loop; Ps (halfway)")
	var raw []string
	for _, mode := range modes {
		for _, w := range loopsWorkloads {
			for _, n := range names {
				s := res[mode][n+": "+w.label]
				loops := ""
				if len(s) > 0 {
					var ls []string
					for _, x := range s {
						ls = append(ls, "["+x.loops+"]")
					}
					loops = strings.Join(ls, " ")
					if s[0].loops == "" {
						loops = ""
					}
				}
				t.add(mode, w.label, n, f0(s.tps()), f2(median(s, func(r run) float64 { return r.cores })), f1(s.cpuUs()), f1(s.pgCPUUs()), loops)
				var parts []string
				for _, x := range s {
					parts = append(parts, fmt.Sprintf("%.0f/%.2f/%.1f", x.tps, x.cores, x.cpuUs))
				}
				raw = append(raw, fmt.Sprintf("%-9s %-14s %-34s %s", mode, w.label, n, strings.Join(parts, "  ")))
			}
		}
	}
	b.WriteString(t.String())
	b.WriteString("\n")
	// Ratios within rounds: the loops against one loop, and against
	// PgBouncer.
	if len(names) >= 5 {
		one, many, bouncer, fleet := names[2], names[4], names[0], names[1]
		var r table
		r.add("mode", "workload", "tps: "+many+" / "+one, "CPU/txn: "+many+" / "+one,
			"tps: "+many+" / "+bouncer, "CPU/txn: "+many+" / "+bouncer, "tps: "+many+" / "+fleet)
		for _, mode := range modes {
			for _, w := range loopsWorkloads {
				m, o, pb, pf := res[mode][many+": "+w.label], res[mode][one+": "+w.label], res[mode][bouncer+": "+w.label], res[mode][fleet+": "+w.label]
				r.add(mode, w.label, f2(ratio(m, o)), f2(cpuRatio(m, o)), f2(ratio(m, pb)), f2(cpuRatio(m, pb)), f2(ratio(m, pf)))
			}
		}
		b.WriteString(r.String())
	}
	b.WriteString("\n<details><summary>Every run, in round order (tps/cores used/proxy CPU µs per txn)</summary>\n\n```\n")
	b.WriteString(strings.Join(raw, "\n"))
	b.WriteString("\n```\n</details>\n\n")
	return b.String()
}

// cpuRatio is the median over rounds of a's CPU per transaction over b's
// in the same round.
func cpuRatio(a, b series) float64 {
	var rs []float64
	for i := range a {
		if i < len(b) && b[i].cpuUs > 0 {
			rs = append(rs, a[i].cpuUs/b[i].cpuUs)
		}
	}
	return medianOf(rs)
}
