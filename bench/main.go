// Command bench is `make bench`: it measures pgfence against Postgres
// directly and against PgBouncer (session mode) on this machine, and prints
// the figures as one table (also written to bench/last-run.md).
//
// One run starts a throwaway Postgres, PgBouncer and pgfence on free
// loopback ports, then:
//
//  1. select-only pgbench (-S) in each protocol mode, through every target;
//     then PgBouncer and pgfence at one rate, and both over TLS;
//  2. fenced writes: pgfence rewriting the UPDATE vs the same fence written
//     by hand, straight to Postgres and through PgBouncer; then, in -M
//     simple only, the same with a string value that changes;
//  3. a stale-writer storm: half the clients hold a stale token;
//  4. 1000 idle client connections: the proxies' resident memory, plain
//     and over TLS;
//  5. the rewriter's Go benchmarks (run first, before anything starts).
//
// pgbench runs are interleaved (round-robin over the targets, order rotated
// each round) and repeated; medians are printed. Everything it starts is
// stopped and its temporary directory removed when it ends, however it ends.
//
// A sixth section, lock-domain cost, measures fenced writes through a
// pgfence that also puts pgbench_accounts in a lock domain; BENCH_ONLY=domain
// runs only it (~2 min; see domain.go). A seventh, backstop cost, measures
// fenced writes to a table with the database backstop's trigger against an
// identical table without it, through pgfence and straight to Postgres;
// BENCH_ONLY=backstop runs only it (~2 min; see backstop.go). Every other
// pgfence runs with --backstop off, so pgbench_accounts never gets the
// trigger and the other sections measure what they did before it existed.
// BENCH_ONLY=holds measures pipelines of fenced writes, which pgfence may
// hold until it knows how Postgres reads them (~5 min; see holds.go); it
// runs only alone. BENCH_ONLY=loops measures pgfence with one event loop
// and with one per core beside one PgBouncer and a PgBouncer per core
// sharing a port (~6 min; see loops.go); it runs only alone too.
//
// Environment: BENCH_SECONDS (per pgbench run, default 3), BENCH_ROUNDS
// (default 3), BENCH_CONNS (default 1000), PGFENCE_BIN (default
// bin/pgfence), BENCH_PGFENCE_PROF=1 to run the profiling build
// (bench/pgfence-prof) and write CPU and heap profiles to bench/profiles/
// instead of the benchmark.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgserver"
)

const scale = 10 // pgbench -i -s

var clockTicks = 100.0 // getconf CLK_TCK, read at start

var modes = []string{"simple", "extended", "prepared"}

type runner struct {
	seconds, rounds, clients, threads, conns int

	tmp        string
	pgbenchBin string
	pgfenceBin string
	profBuild  bool // pgfenceBin is bench/pgfence-prof, which takes fewer flags
	scripts    map[string]string

	pg                         *pgserver.Server
	direct, pgbouncer          target
	pgbouncerSvc               *service
	pgfencePlain, pgfenceGuard target
	// pgfenceFwd guards pgbench_accounts but sends every SET to Postgres
	// (--forward-token-sets): what a fenced write costs without the round
	// trip pgfence saves by answering the token's SET.
	pgfenceFwd target
	// tlsCert and tlsKey are a self-signed certificate both proxies offer
	// clients (PgBouncer's client_tls_sslmode = allow, pgfence's
	// --tls-cert): the select-only section over TLS.
	tlsCert, tlsKey string

	mu          sync.Mutex
	cleanups    []func()
	cleanOnce   sync.Once
	interrupted atomic.Bool
}

func (r *runner) onCleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// cleanup stops everything started, newest first, and removes the
// temporary directories. It runs once; a second caller waits for the first.
func (r *runner) cleanup() {
	r.cleanOnce.Do(func() {
		r.mu.Lock()
		fs := r.cleanups
		r.mu.Unlock()
		for i := len(fs) - 1; i >= 0; i-- {
			fs[i]()
		}
	})
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "%s=%q: want a positive integer\n", name, v)
			os.Exit(2)
		}
		return n
	}
	return def
}

func main() {
	r := &runner{
		seconds: envInt("BENCH_SECONDS", 3),
		rounds:  envInt("BENCH_ROUNDS", 3),
		conns:   envInt("BENCH_CONNS", 1000),
		clients: 8,
		threads: 2,
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		r.interrupted.Store(true)
		logf("%v: stopping everything", s)
		r.cleanup()
		os.Exit(130)
	}()
	var err error
	switch only := os.Getenv("BENCH_ONLY"); {
	case os.Getenv("BENCH_PGFENCE_PROF") != "":
		err = r.profile()
	case only == "domain":
		err = r.benchDomainOnly()
	case only == "backstop":
		err = r.benchBackstopOnly()
	case only == "pooling":
		err = r.benchPoolingOnly()
	case only == "shapes":
		err = r.benchShapesOnly()
	case only == "holds":
		err = r.benchHoldsOnly()
	case only == "loops":
		err = r.benchLoopsOnly()
	case only != "":
		err = fmt.Errorf("BENCH_ONLY=%q: the sections that run alone are domain, backstop, pooling, shapes, holds and loops", only)
	default:
		err = r.bench()
	}
	r.cleanup()
	if r.interrupted.Load() {
		select {} // the signal handler exits once everything is stopped
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// setup starts Postgres with pgbench's tables (pgbench_accounts with an
// epoch column) and PgBouncer.
func (r *runner) setup() error {
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			clockTicks = v
		}
	}
	var err error
	if r.tmp, err = os.MkdirTemp("", "pgfence-bench-"); err != nil {
		return err
	}
	os.Chmod(r.tmp, 0o755) // PgBouncer (the postgres user) reads its ini below
	tmp := r.tmp
	r.onCleanup(func() { os.RemoveAll(tmp) })
	if r.scripts, err = writeScripts(r.tmp); err != nil {
		return err
	}
	if r.pgfenceBin == "" {
		r.pgfenceBin = os.Getenv("PGFENCE_BIN")
		if r.pgfenceBin == "" {
			r.pgfenceBin = "bin/pgfence"
		}
	}
	if _, err := os.Stat(r.pgfenceBin); err != nil {
		return fmt.Errorf("%s: %v (build it: make build)", r.pgfenceBin, err)
	}
	if err := writeRewrittenScript(r.tmp, r.pgfenceBin, r.scripts); err != nil {
		logf("skipping the rewritten SQL sent by hand: %v", err)
	}
	binDir, err := pgserver.FindBinDir()
	if err != nil {
		return err
	}
	r.pgbenchBin = filepath.Join(binDir, "pgbench")

	logf("starting Postgres")
	if err := r.startPostgres(); err != nil {
		return err
	}
	logf("Postgres on port %d; pgbench -i -s %d", r.pg.Port, scale)
	init := exec.Command(r.pgbenchBin, "-i", "-q", "-s", strconv.Itoa(scale), "-h", "127.0.0.1",
		"-p", strconv.Itoa(r.pg.Port), "-U", "postgres", "postgres")
	init.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := init.CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v\n%s", err, out)
	}
	if err := r.sql("ALTER TABLE pgbench_accounts ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0",
		"VACUUM ANALYZE"); err != nil {
		return err
	}
	if r.tlsCert, r.tlsKey, err = writeCert(r.tmp); err != nil {
		return err
	}
	logf("starting PgBouncer")
	return r.startPgBouncer()
}

// sql runs statements straight on Postgres.
func (r *runner) sql(stmts ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, r.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for _, s := range stmts {
		if _, err := c.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func (r *runner) queryInt(q string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, r.pg.URL("postgres"))
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int64
	err = c.QueryRow(ctx, q).Scan(&n)
	return n, err
}

// checkFencing proves that the guarded pgfence rewrites: a write with a
// newer token lands, one with an older token then changes nothing.
func (r *runner) checkFencing(t target) error {
	if err := r.checkFencingOn(t, "pgbench_accounts", 1); err != nil {
		return err
	}
	return r.sql("UPDATE pgbench_accounts SET fence_epoch = 0 WHERE aid = 1")
}

// checkFencingOn is checkFencing's writes, through t, to row aid of table
// (at an epoch below 3), which it leaves at epoch 5.
func (r *runner) checkFencingOn(t target, table string, aid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", t.port))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for _, step := range []struct {
		token string
		rows  int64
	}{{"5", 1}, {"3", 0}} {
		if _, err := c.Exec(ctx, "SET fence.token = '"+step.token+"'"); err != nil {
			return err
		}
		tag, err := c.Exec(ctx, fmt.Sprintf("UPDATE %s SET abalance = abalance WHERE aid = %d", table, aid))
		if err != nil {
			return err
		}
		if tag.RowsAffected() != step.rows {
			return fmt.Errorf("fencing check through %s on %s: token %s updated %d rows, want %d", t.name, table, step.token, tag.RowsAffected(), step.rows)
		}
	}
	return nil
}

// measurement is one line of a section: a target and the workload sent.
type measurement struct {
	label    string
	t        target
	workload []string
}

// interleave runs every measurement in every mode, rounds times,
// round-robin, and returns the runs by mode and label.
func (r *runner) interleave(section string, ms []measurement) (map[string]map[string]series, error) {
	return r.interleaveModes(section, modes, ms)
}

// interleaveModes is interleave over the given protocol modes only.
func (r *runner) interleaveModes(section string, modes []string, ms []measurement) (map[string]map[string]series, error) {
	out := map[string]map[string]series{}
	for _, m := range modes {
		out[m] = map[string]series{}
	}
	total, done := r.rounds*len(modes)*len(ms), 0
	for round := 0; round < r.rounds; round++ {
		for mi, mode := range modes {
			for k := range ms {
				// Rotate the order so no target always runs first.
				m := ms[(k+round+mi)%len(ms)]
				clients := m.t.clients
				if clients == 0 {
					clients = r.clients
				}
				res, err := r.pgbenchClients(m.t, mode, clients, m.workload)
				if err != nil {
					return nil, err
				}
				done++
				logf("%s %d/%d: round %d, -M %-8s %-24s %7.0f tps  proxy %6.1f µs CPU/txn  Postgres %6.1f µs CPU/txn%s",
					section, done, total, round+1, mode, m.label, res.tps, res.cpuUs, res.pgCPUUs, rejectNote(m.t, res))
				out[mode][m.label] = append(out[mode][m.label], res)
			}
		}
	}
	return out, nil
}

// equalLoad runs select-only through PgBouncer and pgfence at one rate
// per mode (pgbench -R), 80% of the slower proxy's median throughput in
// section 1, so that their CPU per transaction is compared for the same
// work: unthrottled, the proxies run at different rates, and how many
// messages each wake-up finds depends on the rate.
func (r *runner) equalLoad(sel map[string]map[string]series) (map[string]map[string]series, map[string]int, error) {
	out, rates := map[string]map[string]series{}, map[string]int{}
	for _, mode := range modes {
		rate := int(0.8 * min(sel[mode]["PgBouncer"].tps(), sel[mode]["pgfence"].tps()))
		if rate < 1 {
			return nil, nil, fmt.Errorf("select-only -M %s: no throughput to base a rate on", mode)
		}
		rates[mode] = rate
		w := []string{"-S", "-R", strconv.Itoa(rate)}
		res, err := r.interleaveModes("select-only at equal load", []string{mode}, []measurement{
			{"PgBouncer", r.pgbouncer, w},
			{"pgfence", r.pgfencePlain, w},
		})
		if err != nil {
			return nil, nil, err
		}
		out[mode] = res[mode]
	}
	return out, rates, nil
}

func rejectNote(t target, res run) string {
	if t.metrics == "" || res.rejects == 0 {
		return ""
	}
	return fmt.Sprintf("  %.0f rejects", res.rejects)
}

func (r *runner) bench() error {
	start := time.Now()
	rep := &report{seconds: r.seconds, rounds: r.rounds, clients: r.clients, threads: r.threads, conns: r.conns}
	rep.machine = machineInfo()
	rep.loadBefore = loadAvg()

	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	logf("Go benchmarks (go test -bench -benchmem -count 3)")
	gb, err := goBenchmarks(goBin, 3)
	if err != nil {
		// Packages others are editing may not build right now: report it,
		// measure the rest.
		logf("Go benchmarks failed: %v", err)
		rep.goBenchErr = err.Error()
	}
	rep.goBench = gb

	if err := r.setup(); err != nil {
		return err
	}
	rep.machine.pgbouncer = firstLine(exec.Command(r.pgbouncerSvc.cmd.Path, "--version"))
	rep.machine.postgres = firstLine(exec.Command(filepath.Join(r.pg.BinDir, "postgres"), "--version"))
	rep.machine.pgbench = firstLine(exec.Command(r.pgbenchBin, "--version"))
	rep.machine.pgfence = pgfenceVersion(r.pgfenceBin)

	// Every pgfence but the backstop section's --backstop install one runs
	// with --backstop off, as the README's figures were measured: with the
	// default (install) the guarded ones would put the backstop's trigger
	// on pgbench_accounts, which every target writes (direct and
	// PgBouncer too). The backstop section measures it on tables of its own.
	logf("starting pgfence three times (--backstop off): no guards, --guard pgbench_accounts, and that with --forward-token-sets")
	if r.pgfencePlain, _, err = r.startPgfence("pgfence", r.pgfenceBin, "--backstop", "off", "--tls-cert", r.tlsCert, "--tls-key", r.tlsKey); err != nil {
		return err
	}
	if r.pgfenceGuard, _, err = r.startPgfence("pgfence guarded", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts"); err != nil {
		return err
	}
	if r.pgfenceFwd, _, err = r.startPgfence("pgfence guarded, SET forwarded", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts", "--forward-token-sets"); err != nil {
		return err
	}
	if err := r.checkFencing(r.pgfenceGuard); err != nil {
		return err
	}
	if err := r.checkTriggers(false); err != nil {
		return err
	}

	// 1. Select-only.
	sel := []string{"-S"}
	rep.selectOnly, err = r.interleave("select-only", []measurement{
		{"direct", r.direct, sel},
		{"PgBouncer", r.pgbouncer, sel},
		{"pgfence", r.pgfencePlain, sel},
		{"pgfence guarded", r.pgfenceGuard, sel},
	})
	if err != nil {
		return err
	}

	// 1b. Select-only at equal load.
	if rep.selectEqual, rep.selectRate, err = r.equalLoad(rep.selectOnly); err != nil {
		return err
	}

	// 1c. Select-only over TLS: each proxy terminates the client's TLS.
	rep.selectTLS, err = r.interleave("select-only, TLS", []measurement{
		{"PgBouncer, TLS", overTLS(r.pgbouncer), sel},
		{"pgfence, TLS", overTLS(r.pgfencePlain), sel},
	})
	if err != nil {
		return err
	}

	// 2. Fenced writes.
	hand := []string{"-f", r.scripts["fenced-hand"]}
	writes := []measurement{
		{"direct, hand-fenced", r.direct, hand},
		{"PgBouncer, hand-fenced", r.pgbouncer, hand},
		{"pgfence, rewritten", r.pgfenceGuard, []string{"-f", r.scripts["fenced-pgfence"]}},
		{"pgfence, SET forwarded", r.pgfenceFwd, []string{"-f", r.scripts["fenced-pgfence"]}},
	}
	if p, ok := r.scripts["fenced-rewrite-by-hand"]; ok {
		writes = append(writes, measurement{"direct, pgfence's SQL", r.direct, []string{"-f", p}})
	}
	rep.writes, err = r.interleave("fenced writes", writes)
	if err != nil {
		return err
	}
	if n, err := r.queryInt("SELECT count(*) FROM pgbench_accounts WHERE fence_epoch = 1000"); err != nil || n == 0 {
		return fmt.Errorf("after the fenced writes no row has epoch 1000 (%d, %v)", n, err)
	}

	// 2a. Fenced writes with a string value: only a Query carries it in
	// the text (in -M extended pgbench would send the literal unchanged).
	rep.writesStr, err = r.interleaveModes("fenced writes, string", []string{"simple"}, []measurement{
		{"PgBouncer, hand-fenced", r.pgbouncer, []string{"-f", r.scripts["fenced-str-hand"]}},
		{"pgfence, rewritten", r.pgfenceGuard, []string{"-f", r.scripts["fenced-str-pgfence"]}},
	})
	if err != nil {
		return err
	}

	// 2b. Fenced writes in a transaction block, the token set with SET LOCAL.
	rep.writesTx, err = r.interleave("fenced writes, block", []measurement{
		{"PgBouncer, hand-fenced", r.pgbouncer, []string{"-f", r.scripts["fenced-tx-hand"]}},
		{"pgfence, rewritten", r.pgfenceGuard, []string{"-f", r.scripts["fenced-tx-pgfence"]}},
	})
	if err != nil {
		return err
	}

	// 2c. Lock-domain cost (still token 1000, before the storm raises rows to 2000).
	if rep.domain, err = r.benchDomain(r.pgfenceGuard); err != nil {
		return err
	}

	// 3. Stale-writer storm: every row at epoch 2000, half the writers at 1000.
	logf("storm: setting every row's epoch to 2000")
	if err := r.sql("UPDATE pgbench_accounts SET fence_epoch = 2000", "VACUUM ANALYZE pgbench_accounts"); err != nil {
		return err
	}
	rep.storm, err = r.interleave("stale storm", []measurement{
		{"PgBouncer, hand-fenced", r.pgbouncer, []string{"-f", r.scripts["storm-hand"]}},
		{"pgfence, rewritten", r.pgfenceGuard, []string{"-f", r.scripts["storm-pgfence"]}},
	})
	if err != nil {
		return err
	}
	for _, mode := range modes {
		for i, res := range rep.storm[mode]["pgfence, rewritten"] {
			if res.rejects <= 0 {
				return fmt.Errorf("storm -M %s round %d: fencing_reject_total did not grow", mode, i+1)
			}
		}
	}

	// 3b. Backstop cost, on tables of its own (pgbench_accounts keeps no trigger).
	if rep.backstop, err = r.benchBackstop(); err != nil {
		return err
	}

	// 4. Idle connections: a fresh pgfence, then PgBouncer.
	logf("connections: %d through a fresh pgfence", r.conns)
	fresh, svc, err := r.startPgfence("pgfence conns", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts")
	if err != nil {
		return err
	}
	if rep.memPgfence, err = holdConns(fresh, r.conns, nil); err != nil {
		return err
	}
	svc.stop()
	time.Sleep(2 * time.Second) // let Postgres reap those backends
	logf("connections: %d over TLS through a fresh pgfence", r.conns)
	if fresh, svc, err = r.startPgfence("pgfence conns TLS", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts",
		"--tls-cert", r.tlsCert, "--tls-key", r.tlsKey); err != nil {
		return err
	}
	if rep.memPgfenceTLS, err = holdConns(overTLS(fresh), r.conns, nil); err != nil {
		return err
	}
	svc.stop()
	time.Sleep(2 * time.Second)
	logf("connections: %d through PgBouncer, plain then over TLS", r.conns)
	if rep.memPgBouncer, err = holdConns(r.pgbouncer, r.conns, nil); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	if rep.memPgBouncerTLS, err = holdConns(overTLS(r.pgbouncer), r.conns, nil); err != nil {
		return err
	}

	rep.loadAfter = loadAvg()
	rep.elapsed = time.Since(start)
	text := rep.render()
	fmt.Println(text)
	if err := os.WriteFile(filepath.Join("bench", "last-run.md"), []byte(text), 0o644); err != nil {
		logf("writing bench/last-run.md: %v", err)
	}
	return nil
}

// pgfenceVersion says which pgfence was measured: its version line and the
// checkout it was built from, with the directories that had uncommitted
// changes (others may be editing the tree while the benchmark runs).
func pgfenceVersion(bin string) string {
	v := firstLine(exec.Command(bin, "version"))
	head := firstLine(exec.Command("git", "rev-parse", "--short", "HEAD"))
	out, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	dirs := map[string]bool{}
	var list []string
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if len(line) < 4 {
			continue
		}
		d, _, _ := strings.Cut(line[3:], "/")
		if !dirs[d] {
			dirs[d] = true
			list = append(list, d)
		}
	}
	s := fmt.Sprintf("`%s`, built from commit %s", v, head)
	if len(list) > 0 {
		s += " plus uncommitted changes in " + strings.Join(list, ", ")
	}
	return s
}
