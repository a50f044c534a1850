package main

// Transaction pooling: what pgfence costs behind a transaction pooler
// (--upstream-pooling=transaction, PgBouncer with pool_mode =
// transaction), against the same PgBouncer alone with the fence written
// by hand. pgfence then sets the session's token in each transaction that
// writes and prepares nothing for reuse, so Postgres parses every fenced
// write. Select-only, fenced writes (SET then UPDATE) and fenced writes in
// a block (SET LOCAL), at -M simple and -M extended (PgBouncer 1.18 keeps
// no prepared statements in this mode, so -M prepared cannot run).
//
// BENCH_ONLY=pooling runs this section alone and writes its table to
// bench/last-run-pooling.md.

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/pgbouncer"
)

var poolingModes = []string{"simple", "extended"}

// poolingWorkloads are the section's workloads: label, the script through
// PgBouncer alone (fence by hand), and through pgfence.
var poolingWorkloads = []workload{
	{label: "select-only", hand: "", pgfence: ""},
	{label: "fenced write", hand: "fenced-hand", pgfence: "fenced-pgfence"},
	{label: "fenced write in a block", hand: "fenced-tx-hand", pgfence: "fenced-tx-pgfence"},
}

// benchPoolingOnly is BENCH_ONLY=pooling.
func (r *runner) benchPoolingOnly() error {
	start := time.Now()
	load := loadAvg()
	if err := r.setup(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A pool half the clients: a transaction pooler's point.
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: fmt.Sprintf("127.0.0.1:%d", r.pg.Port), PoolMode: "transaction", PoolSize: max(r.clients/2, 1)})
	if err != nil {
		return err
	}
	r.onCleanup(b.Stop)
	bouncer := target{name: "PgBouncer (transaction)", port: b.Port, pid: b.PID()}
	logf("starting pgfence --upstream-pooling=transaction in front of PgBouncer")
	pf, _, err := r.startPgfence("pgfence pooled", r.pgfenceBin, "--backstop", "off", "--guard", "pgbench_accounts",
		"--upstream", fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", b.Addr()), "--upstream-pooling", "transaction")
	if err != nil {
		return err
	}
	if err := r.checkFencing(pf); err != nil {
		return err
	}
	var ms []measurement
	for _, w := range poolingWorkloads {
		hand, fenced := []string{"-S"}, []string{"-S"}
		if w.hand != "" {
			hand, fenced = []string{"-f", r.scripts[w.hand]}, []string{"-f", r.scripts[w.pgfence]}
		}
		ms = append(ms, measurement{"PgBouncer: " + w.label, bouncer, hand}, measurement{"pgfence: " + w.label, pf, fenced})
	}
	res, err := r.interleaveModes("transaction pooling", poolingModes, ms)
	if err != nil {
		return err
	}
	r.sectionReport("pooling", fmt.Sprintf("pgbench -c %d -j %d -T %d per run, PgBouncer pool of %d", r.clients, r.threads, r.seconds, max(r.clients/2, 1)), start, load, renderPooling(res))
	return nil
}

func renderPooling(res map[string]map[string]series) string {
	return renderAgainst("### Behind a transaction pooler (pgfence --upstream-pooling=transaction → PgBouncer, against PgBouncer alone with the fence by hand)",
		[2]string{"PgBouncer tps", "pgfence → PgBouncer tps"}, poolingModes, poolingWorkloads, res)
}
