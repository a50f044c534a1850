package main

// Running pgbench against a target while measuring the proxy's CPU time.

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// run is one pgbench run.
type run struct {
	tps     float64 // without initial connection time
	txns    float64 // transactions processed
	cpuUs   float64 // proxy CPU (user+sys) per transaction, µs; 0 for direct
	pgCPUUs float64 // Postgres CPU (all its processes) per transaction, µs
	rejects float64 // growth of pgfence's fencing_reject_total
	cores   float64 // the proxy's CPU time over the run's wall time
	// loops is pgfence_loop_sessions halfway through the run ("2 2": two
	// loops with two sessions each), for targets that sample it.
	loops string
}

var (
	tpsRE    = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	txnsRE   = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	failedRE = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

// pgbench runs pgbench against t in protocol mode mode; workload is either
// ["-S"] or ["-f", script].
func (r *runner) pgbench(t target, mode string, workload []string, env ...string) (run, error) {
	return r.pgbenchClients(t, mode, r.clients, workload, env...)
}

// pgbenchClients is pgbench with clients clients (threads: at most
// r.threads, at most one per client).
func (r *runner) pgbenchClients(t target, mode string, clients int, workload []string, env ...string) (run, error) {
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(t.port), "-U", "postgres",
		"-n", "-M", mode, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(r.threads, clients)),
		"-T", strconv.Itoa(r.seconds)}
	args = append(append(args, workload...), "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.seconds+60)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.pgbenchBin, args...)
	// Plain text unless t says otherwise: libpq's default, sslmode=prefer,
	// would take the TLS that PgBouncer and pgfence offer for the TLS
	// section. (The last of a duplicated variable wins.)
	cmd.Env = append(append([]string{"PGAPPNAME=pgfence-bench", "LC_ALL=C", "PGSSLMODE=disable"}, t.env...), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out

	var rej0, cpu0, pg0 float64
	var err error
	if t.fresh != nil { // close what earlier use of t left open
		if err := t.fresh(); err != nil {
			return run{}, err
		}
	}
	if pg0, err = r.postgresCPUSeconds(); err != nil {
		return run{}, err
	}
	if t.metrics != "" {
		if rej0, err = counterSum(t.metrics, "fencing_reject_total"); err != nil {
			return run{}, err
		}
	}
	if t.pid != 0 {
		if cpu0, err = t.cpuSeconds(); err != nil {
			return run{}, err
		}

	}
	sampled := make(chan string, 1)
	if t.sampleLoops && t.metrics != "" {
		go func() {
			time.Sleep(time.Duration(r.seconds) * time.Second / 2)
			sampled <- loopSessions(t.metrics)
		}()
	} else {
		sampled <- ""
	}
	started := time.Now()
	runErr := cmd.Run()
	wall := time.Since(started).Seconds()
	if t.fresh != nil && runErr == nil {
		// Its backends end now too, as pgfence's and direct ones do when
		// pgbench disconnects, so that Postgres's CPU counts their exit
		// for every target alike.
		if err := t.fresh(); err != nil {
			return run{}, err
		}
	}
	time.Sleep(200 * time.Millisecond) // backends exit
	var res run
	pg1, err := r.postgresCPUSeconds()
	if err != nil {
		return run{}, err
	}
	res.pgCPUUs = pg1 - pg0
	res.loops = <-sampled
	if t.pid != 0 {
		cpu1, err := t.cpuSeconds()
		if err != nil {
			return run{}, fmt.Errorf("%s died? %w", t.name, err)
		}
		res.cpuUs = cpu1 - cpu0 // divided by txns below
		res.cores = res.cpuUs / wall
	}
	if t.metrics != "" {
		rej1, err := counterSum(t.metrics, "fencing_reject_total")
		if err != nil {
			return run{}, err
		}
		res.rejects = rej1 - rej0
	}
	text := out.String()
	cmdline := "pgbench " + strings.Join(args, " ")
	if runErr != nil {
		return run{}, fmt.Errorf("%s: %v\n%s", cmdline, runErr, text)
	}
	m := tpsRE.FindStringSubmatch(text)
	n := txnsRE.FindStringSubmatch(text)
	if m == nil || n == nil {
		return run{}, fmt.Errorf("%s: no tps in output:\n%s", cmdline, text)
	}
	if f := failedRE.FindStringSubmatch(text); f != nil && f[1] != "0" {
		return run{}, fmt.Errorf("%s: %s failed transactions:\n%s", cmdline, f[1], text)
	}
	res.tps, _ = strconv.ParseFloat(m[1], 64)
	res.txns, _ = strconv.ParseFloat(n[1], 64)
	if res.txns == 0 {
		return run{}, fmt.Errorf("%s: no transactions:\n%s", cmdline, text)
	}
	res.cpuUs = res.cpuUs / res.txns * 1e6
	res.pgCPUUs = res.pgCPUUs / res.txns * 1e6
	return res, nil
}

// series collects one measurement's runs, round by round.
type series []run

func (s series) tps() float64   { return median(s, func(r run) float64 { return r.tps }) }
func (s series) cpuUs() float64 { return median(s, func(r run) float64 { return r.cpuUs }) }
func (s series) pgCPUUs() float64 {
	return median(s, func(r run) float64 { return r.pgCPUUs })
}

// ratio is the median over rounds of a's tps over b's tps in the same
// round: runs of one round were taken back to back, so their ratio is
// less exposed to the machine's noise than a ratio of medians.
func ratio(a, b series) float64 {
	var rs []float64
	for i := range a {
		if i < len(b) && b[i].tps > 0 {
			rs = append(rs, a[i].tps/b[i].tps)
		}
	}
	return medianOf(rs)
}

func median(s series, f func(run) float64) float64 {
	vs := make([]float64, len(s))
	for i, r := range s {
		vs[i] = f(r)
	}
	return medianOf(vs)
}
