package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// result is what the checker found in one run.
type result struct {
	Mode           mode
	Elapsed        time.Duration
	Faults         map[string]int
	PgfenceRejects float64   // fencing_reject_total; -1 in the direct run
	RejectsEach    []float64 // fencing_reject_total of each pgfence instance

	LeasesGranted, LeasesLost int
	TokenMin, TokenMax        int64

	Attempts   int // UPDATEs sent
	Landed     int // in the database's history
	Fenced     int // 0 rows, no error
	Failed     int // error (connection cut by a restart, ...)
	RolledBack int // 1 row but its transaction did not commit

	Stale           int // token below the row's accepted max when sent
	StaleRejected   int // ... and changed nothing (0 rows)
	StaleLanded     int // ... and landed
	StaleFailed     int // ... and failed with an error
	StaleRolledBack int // ... 1 row, but its transaction rolled back
	StaleBelieved   int // stale, sent by a writer that had found its lease valid
	StaleExpired    int // stale, and the writer's lease was past its deadline when sent

	Violations        int // landed writes whose token is below an earlier accepted token of the row
	ViolationExamples []string
	Mismatches        int // logs and database disagree
	MismatchExamples  []string
	// LostCommitted, in a failover run, is writes whose COMMIT the
	// database acknowledged and the final primary does not have: lost in
	// a failover. LandedBelowLost is writes that landed with a token
	// below such a lost write's on the same row, sent after it was
	// acknowledged: stale writes the fence would have stopped had the
	// failover kept the epoch.
	LostCommitted   int
	LandedBelowLost int
	LostExamples    []string

	// LostIncrements is landed writes minus the counters' values, for
	// information. Without pgfence, zombies' writes lose increments.
	// Through pgfence a zombie can still land a write on a row between a
	// newer holder's read of it and that holder's write (its token is not
	// below the row's epoch yet), and the newer holder then writes a
	// counter computed from the old value: the tokens stay in order, but a
	// read-modify-write across holders also needs the read to lock the row
	// (SELECT ... FOR UPDATE) to be atomic. Not counted as a violation.
	LostIncrements int64
}

type entry struct {
	tok int64
	at  int64 // unix ns (microsecond precision)
	op  string
}

// check reads the final state of the table and the writers' logs.
func (r *run) check(ctx context.Context) (*result, error) {
	res := &result{}
	hist, counters, err := r.readTable(ctx)
	if err != nil {
		return nil, err
	}
	var writes []record
	for i := 1; i <= r.cfg.Writers; i++ {
		recs, err := readLog(r.logPath(i))
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			switch {
			case rec.Kind == "write":
				writes = append(writes, rec)
			case rec.Kind == "lease" && rec.Event == "acquired":
				res.LeasesGranted++
				if res.TokenMin == 0 || rec.Token < res.TokenMin {
					res.TokenMin = rec.Token
				}
				res.TokenMax = max(res.TokenMax, rec.Token)
			case rec.Kind == "lease" && rec.Event == "lost":
				res.LeasesLost++
			}
		}
	}

	// 1. The database alone: per row, accepted tokens never go backwards.
	landed := map[string]bool{} // tx/row
	for row, es := range hist {
		var maxTok int64
		var maxOp string
		for _, e := range es {
			landed[key(e.op, row)] = true
			if e.tok < maxTok {
				res.Violations++
				if len(res.ViolationExamples) < 5 {
					res.ViolationExamples = append(res.ViolationExamples,
						fmt.Sprintf("row %d: token %d (%s) landed after token %d (%s)", row, e.tok, e.op, maxTok, maxOp))
				}
			}
			if e.tok > maxTok {
				maxTok, maxOp = e.tok, e.op
			}
		}
		res.LostIncrements += int64(len(es)) - counters[row]
	}

	// Per row, entries in time order with the running max token, to find
	// a write's "accepted max when it was sent".
	type point struct {
		at     int64
		op     string
		tok    int64
		maxTok int64
	}
	timeline := map[int][]point{}
	for row, es := range hist {
		ps := make([]point, len(es))
		for i, e := range es {
			ps[i] = point{at: e.at, op: e.op, tok: e.tok}
		}
		sort.SliceStable(ps, func(a, b int) bool { return ps[a].at < ps[b].at })
		var m int64
		for i := range ps {
			m = max(m, ps[i].tok)
			ps[i].maxTok = m
		}
		timeline[row] = ps
	}
	acceptedBefore := func(row int, sent int64, op string) int64 {
		ps := timeline[row]
		i := sort.Search(len(ps), func(i int) bool { return ps[i].at >= sent })
		var m int64
		// ps[:i] were executed before the write was sent; skip the write's
		// own entry (it cannot precede its own send, but be exact).
		for j := i - 1; j >= 0; j-- {
			if ps[j].op != op {
				m = ps[j].maxTok
				break
			}
		}
		return m
	}

	// 2. The logs against the database.
	type lostWrite struct {
		tok  int64
		done int64
		op   string
	}
	lost := map[int][]lostWrite{}
	logged := map[string]bool{}
	for _, w := range writes {
		res.Attempts++
		k := key(w.Tx, w.Row)
		inDB := landed[k]
		if w.Rows == 1 {
			logged[k] = true
		}
		switch {
		case w.Rows < 0:
			res.Failed++
		case w.Rows == 0:
			res.Fenced++
		case inDB:
			res.Landed++
		case w.Commit == "committed" && r.mode.failover():
			// acknowledged, then lost in a failover: counted below
		default:
			res.RolledBack++
		}
		switch {
		case w.Rows == 1 && w.Commit == "committed" && !inDB && r.mode.failover():
			res.LostCommitted++
			lost[w.Row] = append(lost[w.Row], lostWrite{tok: w.Token, done: w.Done, op: w.Tx})
			if len(res.LostExamples) < 5 {
				res.LostExamples = append(res.LostExamples, fmt.Sprintf("row %d: token %d (%s) acknowledged, then lost in the failover", w.Row, w.Token, w.Tx))
			}
		case w.Rows == 1 && w.Commit == "committed" && !inDB:
			res.mismatch("writer %d's %s on row %d committed but is not in the row's history", w.Writer, w.Tx, w.Row)
		case inDB && w.Commit == "rolled_back":
			res.mismatch("writer %d's %s on row %d rolled back but is in the row's history", w.Writer, w.Tx, w.Row)
		}

		if w.Token < acceptedBefore(w.Row, w.Sent, w.Tx) {
			res.Stale++
			if w.BelievedValid {
				res.StaleBelieved++
			}
			if !w.ValidAtSend {
				res.StaleExpired++
			}
			switch {
			case inDB:
				res.StaleLanded++
			case w.Rows == 0:
				res.StaleRejected++
			case w.Rows < 0:
				res.StaleFailed++
			default:
				res.StaleRolledBack++
			}
		}
	}
	for _, w := range writes {
		if !landed[key(w.Tx, w.Row)] {
			continue
		}
		for _, l := range lost[w.Row] {
			if l.done < w.Sent && w.Token < l.tok {
				res.LandedBelowLost++
				if len(res.LostExamples) < 10 {
					res.LostExamples = append(res.LostExamples, fmt.Sprintf("row %d: token %d (%s) landed after token %d (%s) had been acknowledged and lost", w.Row, w.Token, w.Tx, l.tok, l.op))
				}
				break
			}
		}
	}
	for k := range landed {
		if !logged[k] {
			res.mismatch("%s is in the database but no writer logged it as written", k)
		}
	}
	return res, nil
}

func (res *result) mismatch(format string, args ...any) {
	res.Mismatches++
	if len(res.MismatchExamples) < 5 {
		res.MismatchExamples = append(res.MismatchExamples, fmt.Sprintf(format, args...))
	}
}

func key(op string, row int) string { return fmt.Sprintf("%s/row%d", op, row) }

func (r *run) readTable(ctx context.Context) (map[int][]entry, map[int]int64, error) {
	c, err := pgx.Connect(ctx, r.dbURL())
	if err != nil {
		return nil, nil, err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, fmt.Sprintf("SELECT id, counter, hist_tok, hist_at, hist_op FROM %s ORDER BY id", r.table))
	if err != nil {
		return nil, nil, err
	}
	hist := map[int][]entry{}
	counters := map[int]int64{}
	for rows.Next() {
		var id int
		var n int64
		var toks []int64
		var ats []time.Time
		var ops []string
		if err := rows.Scan(&id, &n, &toks, &ats, &ops); err != nil {
			return nil, nil, err
		}
		if len(toks) != len(ats) || len(toks) != len(ops) {
			return nil, nil, fmt.Errorf("row %d: history arrays of different lengths", id)
		}
		es := make([]entry, len(toks))
		for i := range toks {
			es[i] = entry{tok: toks[i], at: ats[i].UnixNano(), op: ops[i]}
		}
		hist[id], counters[id] = es, n
	}
	return hist, counters, rows.Err()
}

func readLog(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}
