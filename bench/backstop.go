package main

// Backstop cost (issue 25): fenced writes to a table that carries the
// database backstop (pgfence's BEFORE ROW trigger, see backstop/doc.go)
// against the same writes to an identical table without it, through
// pgfence and straight to Postgres.
//
// The section makes two pairs of tables, identical but for their names
// and made the same way at the same time: {backstop,plain}_accounts
// (pgbench_accounts' shape, 100000 rows) and {backstop,plain}_history
// (pgbench_history's shape plus fence_epoch, empty). Then it starts two
// pgfence processes that differ only in --backstop: one with
// --backstop install guarding the backstop_ tables (it creates the
// triggers at start, as `pgfence serve` does by default), one with
// --backstop off guarding the plain_ tables (which never get a trigger).
// It checks that the triggers are where they should be and nowhere else
// (pgbench_accounts, which every other section writes, included), and
// that they fence writes sent straight to Postgres.
//
// Workloads, each with a token set per transaction as in the fenced-writes
// section (SET fence.token = '1000', then the write, autocommitted):
//
//   - UPDATE through pgfence (the plain UPDATE, rewritten), -M simple,
//     extended and prepared;
//   - -M prepared only: the hand-fenced UPDATE straight to Postgres (the
//     same SQL to both tables: what the trigger itself costs), INSERT
//     through pgfence (rewritten: the epoch column stamped), and the
//     INSERT with the epoch written by hand straight to Postgres.
//
// 12 series × 3 rounds × BENCH_SECONDS: 36 runs, about 2 minutes at the
// defaults. BENCH_ONLY=backstop runs this section alone and writes its
// table to bench/last-run-backstop.md.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// backstopTrigger is backstop.RowTrigger, the row trigger's name (the
// bench does not import packages others may be editing mid-run).
const backstopTrigger = "~pgfence_backstop"

// backstopAccounts is the rows in each accounts table of the section.
const backstopAccounts = 100000

// bsWorkload is one line of the section's table.
type bsWorkload struct {
	kind  string // UPDATE or INSERT
	via   string // pgfence or direct
	modes []string
}

var bsWorkloads = []bsWorkload{
	{"UPDATE", "pgfence", modes},
	{"UPDATE", "direct", []string{"prepared"}},
	{"INSERT", "pgfence", []string{"prepared"}},
	{"INSERT", "direct", []string{"prepared"}},
}

func bsLabel(w bsWorkload, on bool) string {
	if on {
		return w.via + " " + w.kind + ", backstop"
	}
	return w.via + " " + w.kind + ", none"
}

// bsTables are the section's tables with (on) or without the trigger.
func bsTables(on bool) (accounts, history string) {
	if on {
		return "backstop_accounts", "backstop_history"
	}
	return "plain_accounts", "plain_history"
}

// bsScript is the pgbench script of w against the table pair on or off:
// through pgfence the plain write, straight to Postgres the fence written
// by hand (the same SQL to both tables).
func bsScript(w bsWorkload, on bool) string {
	accounts, history := bsTables(on)
	s := fmt.Sprintf("\\set aid random(1, %d)\n\\set tid random(1, 10)\n\\set delta random(-5000, 5000)\nSET fence.token = '1000';\n", backstopAccounts)
	switch {
	case w.kind == "UPDATE" && w.via == "pgfence":
		s += fmt.Sprintf("UPDATE %s SET abalance = abalance + :delta WHERE aid = :aid;\n", accounts)
	case w.kind == "UPDATE":
		s += fmt.Sprintf("UPDATE %s SET abalance = abalance + :delta, fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000;\n", accounts)
	case w.via == "pgfence":
		s += fmt.Sprintf("INSERT INTO %s (tid, bid, aid, delta, mtime) VALUES (:tid, 1, :aid, :delta, CURRENT_TIMESTAMP);\n", history)
	default:
		s += fmt.Sprintf("INSERT INTO %s (tid, bid, aid, delta, mtime, fence_epoch) VALUES (:tid, 1, :aid, :delta, CURRENT_TIMESTAMP, 1000);\n", history)
	}
	return s
}

// backstopResult is the section's runs, by mode and label.
type backstopResult struct {
	runs map[string]map[string]series
}

// benchBackstop makes the tables, starts the two pgfence processes and
// runs the section.
func (r *runner) benchBackstop() (*backstopResult, error) {
	logf("backstop: making %s, %s (%d rows each), %s, %s",
		"backstop_accounts", "plain_accounts", backstopAccounts, "backstop_history", "plain_history")
	for _, on := range []bool{true, false} {
		accounts, history := bsTables(on)
		if err := r.sql(
			"CREATE TABLE "+accounts+" (LIKE pgbench_accounts INCLUDING ALL)",
			fmt.Sprintf("INSERT INTO %s (aid, bid, abalance, filler, fence_epoch) SELECT g, (g - 1) / 100000 + 1, 0, '', 0 FROM generate_series(1, %d) g",
				accounts, backstopAccounts),
			"CREATE TABLE "+history+" (LIKE pgbench_history INCLUDING ALL, fence_epoch bigint NOT NULL DEFAULT 0)",
			"VACUUM ANALYZE "+accounts+", "+history,
		); err != nil {
			return nil, err
		}
	}
	onAcc, onHist := bsTables(true)
	offAcc, offHist := bsTables(false)
	logf("backstop: starting pgfence twice: --backstop install on %s, %s; --backstop off on %s, %s", onAcc, onHist, offAcc, offHist)
	pfOn, _, err := r.startPgfence("pgfence backstop", r.pgfenceBin, "--guard", onAcc, "--guard", onHist, "--backstop", "install")
	if err != nil {
		return nil, err
	}
	pfOff, _, err := r.startPgfence("pgfence backstop off", r.pgfenceBin, "--guard", offAcc, "--guard", offHist, "--backstop", "off")
	if err != nil {
		return nil, err
	}
	if err := r.checkTriggers(true); err != nil {
		return nil, err
	}
	if err := r.checkBackstopFences(); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		t     target
		table string
	}{{pfOn, onAcc}, {pfOff, offAcc}} {
		if err := r.checkFencingOn(c.t, c.table, 3); err != nil {
			return nil, err
		}
	}

	// One interleave per set of modes: the UPDATE through pgfence in all
	// three, the rest in -M prepared.
	byModes := map[string][]measurement{}
	var keys []string
	for _, w := range bsWorkloads {
		for _, on := range []bool{true, false} {
			t := r.direct
			if w.via == "pgfence" {
				t = pfOff
				if on {
					t = pfOn
				}
			}
			name := fmt.Sprintf("backstop-%s-%s-%v", strings.ToLower(w.kind), w.via, on)
			p := filepath.Join(r.tmp, name+".sql")
			if err := os.WriteFile(p, []byte(bsScript(w, on)), 0o644); err != nil {
				return nil, err
			}
			key := strings.Join(w.modes, ",")
			if _, ok := byModes[key]; !ok {
				keys = append(keys, key)
			}
			byModes[key] = append(byModes[key], measurement{bsLabel(w, on), t, []string{"-f", p}})
		}
	}
	res := &backstopResult{runs: map[string]map[string]series{}}
	for _, m := range modes {
		res.runs[m] = map[string]series{}
	}
	for _, key := range keys {
		out, err := r.interleaveModes("backstop", strings.Split(key, ","), byModes[key])
		if err != nil {
			return nil, err
		}
		for m, s := range out {
			for l, runs := range s {
				res.runs[m][l] = runs
			}
		}
	}

	// No write was fenced (every token is 1000, every row below it), the
	// writes landed and were stamped on both sides, and the triggers are
	// still only where they were.
	for m, s := range res.runs {
		for l, runs := range s {
			for i, x := range runs {
				if x.rejects != 0 {
					return nil, fmt.Errorf("backstop -M %s %s round %d: %.0f fenced writes, want 0", m, l, i+1, x.rejects)
				}
			}
		}
	}
	for _, table := range []string{onAcc, offAcc} {
		if n, err := r.queryInt("SELECT count(*) FROM " + table + " WHERE fence_epoch = 1000"); err != nil || n == 0 {
			return nil, fmt.Errorf("after the backstop runs no row of %s has epoch 1000 (%d, %v)", table, n, err)
		}
	}
	for _, table := range []string{onHist, offHist} {
		if n, err := r.queryInt("SELECT count(*) FROM " + table + " WHERE fence_epoch = 1000"); err != nil || n == 0 {
			return nil, fmt.Errorf("after the backstop runs %s has no row with epoch 1000 (%d, %v)", table, n, err)
		}
		if n, err := r.queryInt("SELECT count(*) FROM " + table + " WHERE fence_epoch <> 1000"); err != nil || n != 0 {
			return nil, fmt.Errorf("after the backstop runs %s has %d rows not stamped with the token (%v)", table, n, err)
		}
	}
	if err := r.checkTriggers(true); err != nil {
		return nil, err
	}
	return res, nil
}

// checkTriggers checks that the backstop's row trigger is on the
// backstop_ tables, enabled, and that the plain_ tables and
// pgbench_accounts (which the other sections write) have no trigger at
// all; with backstopTables false, only the latter.
func (r *runner) checkTriggers(backstopTables bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, r.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	count := func(table string) (n int64, err error) {
		err = c.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal", table).Scan(&n)
		return n, err
	}
	none := []string{"pgbench_accounts"}
	if backstopTables {
		a, h := bsTables(false)
		none = append(none, a, h)
		a, h = bsTables(true)
		if err := awaitTriggers(ctx, c, a, h); err != nil {
			return err
		}
	}
	for _, table := range none {
		n, err := count(table)
		if err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%s has %d triggers, want none (a pgfence without --backstop off?)", table, n)
		}
	}
	return nil
}

// awaitTriggers waits until each table has the backstop's row trigger,
// enabled: pgfence installs it at start, maybe after /healthz answers.
func awaitTriggers(ctx context.Context, c *pgx.Conn, tables ...string) error {
	for _, table := range tables {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var enabled string
			err := c.QueryRow(ctx, "SELECT tgenabled::text FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2",
				table, backstopTrigger).Scan(&enabled)
			if err == nil && enabled == "O" {
				break
			}
			if err != nil && err != pgx.ErrNoRows {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("30 s after pgfence --backstop install started, %s has no enabled trigger %q (tgenabled %q)", table, backstopTrigger, enabled)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// checkBackstopFences proves, straight to Postgres, that the trigger
// fences backstop_accounts and that plain_accounts is unfenced: the same
// unfenced UPDATE with token 5, then 4, on a row at epoch 0.
func (r *runner) checkBackstopFences() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, r.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for _, on := range []bool{true, false} {
		table, _ := bsTables(on)
		for _, step := range []struct {
			token     string
			rows, off int64 // want with the trigger, without
		}{{"5", 1, 1}, {"4", 0, 1}} {
			if _, err := c.Exec(ctx, "SET fence.token = '"+step.token+"'"); err != nil {
				return err
			}
			tag, err := c.Exec(ctx, "UPDATE "+table+" SET abalance = abalance WHERE aid = 2")
			if err != nil {
				return err
			}
			want := step.off
			if on {
				want = step.rows
			}
			if tag.RowsAffected() != want {
				return fmt.Errorf("backstop check straight to Postgres, %s: token %s updated %d rows, want %d", table, step.token, tag.RowsAffected(), want)
			}
		}
		var epoch int64
		if err := c.QueryRow(ctx, "SELECT fence_epoch FROM "+table+" WHERE aid = 2").Scan(&epoch); err != nil {
			return err
		}
		if want := map[bool]int64{true: 5, false: 0}[on]; epoch != want {
			return fmt.Errorf("backstop check straight to Postgres, %s: epoch %d after the writes, want %d", table, epoch, want)
		}
	}
	if _, err := c.Exec(ctx, "RESET fence.token"); err != nil {
		return err
	}
	table, _ := bsTables(true)
	_, err = c.Exec(ctx, "UPDATE "+table+" SET abalance = abalance WHERE aid = 2")
	if pe, ok := err.(*pgconn.PgError); !ok || pe.Code != "55000" {
		return fmt.Errorf("backstop check straight to Postgres, %s without a token: %v, want SQLSTATE 55000", table, err)
	}
	return nil
}

// benchBackstopOnly is BENCH_ONLY=backstop.
func (r *runner) benchBackstopOnly() error {
	start := time.Now()
	load := loadAvg()
	if err := r.setup(); err != nil {
		return err
	}
	res, err := r.benchBackstop()
	if err != nil {
		return err
	}
	r.sectionReport("backstop", fmt.Sprintf("pgbench -c %d -j %d -T %d per run", r.clients, r.threads, r.seconds), start, load, renderBackstop(res))
	return nil
}

func renderBackstop(res *backstopResult) string {
	var b strings.Builder
	b.WriteString("### Backstop cost (fenced writes, the backstop's trigger on the table vs none)\n\n")
	var t table
	t.add("write", "via", "mode", "no backstop tps", "backstop tps", "backstop/none",
		"pgfence CPU µs/txn: none", "backstop", "Postgres CPU µs/txn: none", "backstop", "added")
	var raw []string
	for _, w := range bsWorkloads {
		for _, mode := range w.modes {
			on, off := res.runs[mode][bsLabel(w, true)], res.runs[mode][bsLabel(w, false)]
			pfOff, pfOn := "—", "—"
			if w.via == "pgfence" {
				pfOff, pfOn = f1(off.cpuUs()), f1(on.cpuUs())
			}
			via := "pgfence (rewritten)"
			if w.via == "direct" {
				via = "direct (hand-fenced)"
			}
			t.add(w.kind, via, mode, f0(off.tps()), f0(on.tps()), f2(ratio(on, off)),
				pfOff, pfOn, f1(off.pgCPUUs()), f1(on.pgCPUUs()), fmt.Sprintf("%+.1f", on.pgCPUUs()-off.pgCPUUs()))
			for _, l := range []string{bsLabel(w, false), bsLabel(w, true)} {
				var parts []string
				for _, x := range res.runs[mode][l] {
					parts = append(parts, fmt.Sprintf("%.0f/%.1f/%.1f", x.tps, x.cpuUs, x.pgCPUUs))
				}
				raw = append(raw, fmt.Sprintf("%-9s %-26s %s", mode, l, strings.Join(parts, "  ")))
			}
		}
	}
	b.WriteString(t.String())
	b.WriteString("\nEach transaction: `SET fence.token = '1000'`, then one write to a table with the backstop's row trigger " +
		"(installed by a pgfence with `--backstop install`) or to an identical table without it (pgfence with `--backstop off`); " +
		"through pgfence the plain statement, straight to Postgres the fence written by hand, the same SQL to both tables. " +
		"\"added\" is the Postgres CPU per transaction the trigger adds (backstop minus none).\n")
	b.WriteString("\n<details><summary>Every backstop run, in round order (tps/pgfence CPU µs/txn/Postgres CPU µs/txn)</summary>\n\n```\n")
	b.WriteString(strings.Join(raw, "\n"))
	b.WriteString("\n```\n</details>\n\n")
	return b.String()
}
