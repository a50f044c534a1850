// Command torture is a Jepsen-style check of pgfence's promise: with real
// leases from a real etcd, real process pauses and real restarts, no
// stale write lands.
//
// It starts a throwaway Postgres and etcd, then does two runs. In each, N
// writer processes (this binary re-executed with -writer) compete for one
// etcd lock (lease.Etcd) and read-modify-write rows of a table in
// transactions carrying their fencing token, while faults are injected:
// the lock holder frozen with SIGSTOP between its lease check and its write
// for longer than the lease TTL, random writers frozen, a slow link (a
// delaying TCP relay in front of the database), and restarts of pgfence,
// Postgres and etcd. Every write is logged with its token, the writer's
// belief about its lease, and its outcome; each row keeps the tokens of the
// writes that landed, in order.
//
//   - Run 1 goes through pgfence: the check must find 0 violations (a
//     row's accepted tokens never go backwards; no write below a token the
//     row had already accepted landed) and stale writes rejected.
//   - Run 2 goes straight to Postgres: the same zombies must now land
//     (violations > 0), proof that the check can fail.
//
// It exits 0 only if both hold. Usage:
//
//	go run ./torture [-duration 60s] [-direct-duration 30s] [-writers 8] [-v] [-keep]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-writer" {
		os.Exit(writerMain(os.Args[2:]))
	}
	os.Exit(cliMain(os.Args[1:], os.Stdout))
}

func cliMain(args []string, out io.Writer) int {
	cfg := defaultConfig()
	cfg.Out = out
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the pgfence run injects faults (longer for a soak)")
	fs.DurationVar(&cfg.DirectDuration, "direct-duration", cfg.DirectDuration, "how long the direct run (no pgfence) injects faults; it only has to show violations")
	fs.DurationVar(&cfg.FailoverDuration, "failover-duration", cfg.FailoverDuration, "how long each failover run (a Patroni primary and standby, synchronous then asynchronous replication) injects faults; 0 skips them")
	fs.IntVar(&cfg.Writers, "writers", cfg.Writers, "writer processes")
	fs.IntVar(&cfg.Pgfences, "pgfences", cfg.Pgfences, "pgfence instances in front of the one Postgres in the pgfence run; the writers are spread over them")
	fs.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows in the guarded table")
	fs.IntVar(&cfg.RowsPerTx, "rows-per-tx", cfg.RowsPerTx, "rows each transaction reads and writes")
	fs.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "etcd lease TTL (whole seconds)")
	fs.DurationVar(&cfg.Margin, "margin", cfg.Margin, "lease safety margin")
	fs.DurationVar(&cfg.Freeze, "freeze", cfg.Freeze, "how long a frozen writer stays frozen (must exceed -ttl)")
	fs.DurationVar(&cfg.SlowDelay, "slow-delay", cfg.SlowDelay, "delay per chunk on the slow link")
	var seed int64
	fs.Int64Var(&seed, "seed", 0, "random seed (0: from the clock)")
	fs.BoolVar(&cfg.Verbose, "v", false, "print each fault as it is injected")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for the writers' logs (default: a temporary one, removed)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the logs directory")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: torture [flags]   (torture -writer CONFIG is the writer process, started by torture itself)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Freeze <= cfg.TTL {
		fmt.Fprintln(os.Stderr, "torture: -freeze must exceed -ttl, or frozen writers never lose their lease")
		return 2
	}
	cfg.Seed = uint64(seed)
	if seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		return 1
	}
	cfg.Exe = exe

	rs, err := session(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		return 1
	}
	if ok, _ := verdict(rs); !ok {
		return 1
	}
	return 0
}

// runs are a session's results; a failover run is nil when skipped.
type runs struct {
	fenced, direct, sync, async *result
}

// session sets up Postgres and etcd and does the runs, printing each
// run's report as it ends.
func session(ctx context.Context, cfg config) (rs runs, err error) {
	out := cfg.Out
	fmt.Fprintf(out, "pgfence torture: %d writer processes, %d rows (%d per transaction), etcd lease TTL %v (safety margin %v), freezes of %v, seed %d\n",
		cfg.Writers, cfg.Rows, cfg.RowsPerTx, cfg.TTL, cfg.Margin, cfg.Freeze, cfg.Seed)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	e, err := setup(sctx, cfg)
	cancel()
	if err != nil {
		return rs, err
	}
	defer e.close()
	if cfg.Keep {
		fmt.Fprintf(out, "logs: %s\n", e.dir)
	}

	fmt.Fprintf(out, "\n== run 1: writers -> relay -> pgfence ×%d -> Postgres, %v ==\n", max(cfg.Pgfences, 1), cfg.Duration)
	if rs.fenced, err = e.run(ctx, modePgfence, cfg.Duration); err != nil {
		return rs, fmt.Errorf("pgfence run: %w", err)
	}
	report(out, rs.fenced)

	fmt.Fprintf(out, "\n== run 2: writers -> relay -> Postgres (no pgfence), %v ==\n", cfg.DirectDuration)
	if rs.direct, err = e.run(ctx, modeDirect, cfg.DirectDuration); err != nil {
		return rs, fmt.Errorf("direct run: %w", err)
	}
	report(out, rs.direct)

	if cfg.FailoverDuration > 0 {
		fmt.Fprintf(out, "\n== run 3: writers -> relay -> pgfence ×%d -> Patroni primary + standby, synchronous replication, failovers, %v ==\n", max(cfg.Pgfences, 1), cfg.FailoverDuration)
		if rs.sync, err = e.run(ctx, modeSync, cfg.FailoverDuration); err != nil {
			return rs, fmt.Errorf("failover run (synchronous): %w", err)
		}
		report(out, rs.sync)
		fmt.Fprintf(out, "\n== run 4: the same with asynchronous replication, %v ==\n", cfg.FailoverDuration)
		if rs.async, err = e.run(ctx, modeAsync, cfg.FailoverDuration); err != nil {
			return rs, fmt.Errorf("failover run (asynchronous): %w", err)
		}
		report(out, rs.async)
	}

	_, text := verdict(rs)
	fmt.Fprintf(out, "\n%s\n", text)
	return rs, nil
}

func report(out io.Writer, r *result) {
	fmt.Fprintf(out, "faults: %s\n", faultSummary(r.Faults))
	fmt.Fprintf(out, "leases: %d granted (tokens %d..%d), %d lost while held\n", r.LeasesGranted, r.TokenMin, r.TokenMax, r.LeasesLost)
	fmt.Fprintf(out, "writes attempted: %d (landed %d, 0 rows %d, errors %d, rolled back %d)\n", r.Attempts, r.Landed, r.Fenced, r.Failed, r.RolledBack)
	fmt.Fprintf(out, "stale writes (token below the row's accepted max when sent): %d; rejected %d, landed %d, errors %d, rolled back %d\n",
		r.Stale, r.StaleRejected, r.StaleLanded, r.StaleFailed, r.StaleRolledBack)
	fmt.Fprintf(out, "  sent after the writer checked its lease and found it valid: %d; its lease was past its deadline when sent: %d\n", r.StaleBelieved, r.StaleExpired)
	if r.PgfenceRejects >= 0 {
		fmt.Fprintf(out, "pgfence fencing_reject_total: %.0f (by instance: %v)\n", r.PgfenceRejects, r.RejectsEach)
	}
	if r.LostIncrements > 0 {
		fmt.Fprintf(out, "note: %d counter increments lost (a write that landed on a value another holder had changed since it was read; not a token violation)\n", r.LostIncrements)
	}
	if r.Mode.failover() {
		fmt.Fprintf(out, "acknowledged writes lost in failovers: %d; writes that then landed below a lost token: %d\n", r.LostCommitted, r.LandedBelowLost)
		for _, ex := range r.LostExamples {
			fmt.Fprintf(out, "  %s\n", ex)
		}
	}
	fmt.Fprintf(out, "violations (a row accepted a token below one it had already accepted): %d\n", r.Violations)
	for _, ex := range r.ViolationExamples {
		fmt.Fprintf(out, "  %s\n", ex)
	}
	if r.Mismatches > 0 {
		fmt.Fprintf(out, "logs and database disagree: %d\n", r.Mismatches)
		for _, ex := range r.MismatchExamples {
			fmt.Fprintf(out, "  %s\n", ex)
		}
	}
	switch {
	case r.Mode == modeAsync && r.LostCommitted+r.LandedBelowLost > 0:
		fmt.Fprintf(out, "verdict: as expected without synchronous replication, the failover lost %d acknowledged writes, and with them the epochs that fence later writes\n", r.LostCommitted)
	case r.Mode == modeAsync:
		fmt.Fprintln(out, "verdict: this failover happened to lose nothing; asynchronous replication does not promise that")
	case r.Mode == modeSync && r.failoverSafe():
		fmt.Fprintf(out, "verdict: PASS — %d stale writes, all kept out; no acknowledged write lost; 0 violations\n", r.Stale)
	case r.Mode == modeSync:
		fmt.Fprintf(out, "verdict: FAIL — %d violations, %d stale writes landed, %d acknowledged writes lost, %d landed below a lost token, %d mismatches\n",
			r.Violations, r.StaleLanded, r.LostCommitted, r.LandedBelowLost, r.Mismatches)
	case r.Mode == modePgfence && r.Violations == 0 && r.StaleLanded == 0 && r.Mismatches == 0 && r.StaleRejected > 0:
		fmt.Fprintf(out, "verdict: PASS — %d stale writes, all kept out; 0 violations\n", r.Stale)
	case r.Mode == modePgfence && r.Violations == 0 && r.StaleLanded == 0 && r.Mismatches == 0:
		fmt.Fprintln(out, "verdict: INCONCLUSIVE — no stale write was attempted, so nothing was proven (run longer)")
	case r.Mode == modePgfence:
		fmt.Fprintf(out, "verdict: FAIL — %d violations, %d log/database mismatches\n", r.Violations, r.Mismatches)
	case r.Violations > 0:
		fmt.Fprintf(out, "verdict: violations found, as they must be without pgfence: the check can fail\n")
	default:
		fmt.Fprintln(out, "verdict: NO VIOLATIONS without pgfence — the check did not show it can fail (run longer)")
	}
}

// failoverSafe reports whether a failover run kept the fence: nothing
// acknowledged was lost, no stale write landed, the logs agree.
func (r *result) failoverSafe() bool {
	return r.Violations == 0 && r.StaleLanded == 0 && r.LostCommitted == 0 && r.LandedBelowLost == 0 && r.Mismatches == 0
}

// verdict is the session's outcome: the pgfence run has no violations and
// rejected stale writes, the direct run has violations, and the failover
// run with synchronous replication (if any) kept the fence. The
// asynchronous one is reported, not judged: it shows what such a failover
// can lose.
func verdict(rs runs) (bool, string) {
	fenced, direct := rs.fenced, rs.direct
	var problems []string
	if fenced.Violations > 0 {
		problems = append(problems, fmt.Sprintf("pgfence run: %d violations", fenced.Violations))
	}
	if fenced.StaleLanded > 0 {
		problems = append(problems, fmt.Sprintf("pgfence run: %d stale writes landed", fenced.StaleLanded))
	}
	if fenced.Mismatches > 0 {
		problems = append(problems, fmt.Sprintf("pgfence run: %d log/database mismatches", fenced.Mismatches))
	}
	if fenced.StaleRejected == 0 {
		problems = append(problems, "pgfence run: no stale write was rejected (nothing was tested)")
	}
	if direct.Violations == 0 {
		problems = append(problems, "direct run: no violations (the check did not show it can fail)")
	}
	if rs.sync != nil && !rs.sync.failoverSafe() {
		problems = append(problems, fmt.Sprintf("synchronous failover run: %d violations, %d stale landed, %d acknowledged writes lost, %d landed below a lost token, %d mismatches",
			rs.sync.Violations, rs.sync.StaleLanded, rs.sync.LostCommitted, rs.sync.LandedBelowLost, rs.sync.Mismatches))
	}
	if len(problems) > 0 {
		return false, "RESULT: FAIL: " + strings.Join(problems, "; ")
	}
	text := fmt.Sprintf("RESULT: PASS: through pgfence %d writes, %d stale, all rejected, 0 violations; without pgfence %d violations in %d writes",
		fenced.Attempts, fenced.Stale, direct.Violations, direct.Attempts)
	if rs.sync != nil {
		text += fmt.Sprintf("; synchronous failovers: %d writes, %d stale, all rejected, nothing acknowledged lost; asynchronous failovers: %d acknowledged writes lost, %d stale writes landed below them",
			rs.sync.Attempts, rs.sync.Stale, rs.async.LostCommitted, rs.async.LandedBelowLost)
	}
	return true, text
}
