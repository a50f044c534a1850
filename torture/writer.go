package main

// The writer process: one competitor for the lock. The orchestrator starts
// N of them (this binary, re-executed with -writer) and freezes them with
// SIGSTOP at will.
//
// Each writer loops: take the lock through etcd; then a few times: in a
// transaction with its token, read some rows, check its lease ("am I
// still the holder?"), compute for a moment, and write each row back
// (counter + 1, its token appended to the row's history); release. It
// behaves like a correct lease holder: it acts only after checking its
// lease, and it stops when a write is fenced (0 rows). What it cannot
// help is a pause between the check and the write: that is a zombie.
//
// It tells the orchestrator what it does on stdout, one line per event:
//   A <token>   acquired the lock
//   C <token>   checked its lease (valid) and is computing before it writes
//   R <token>   released the lock
// and logs every write attempt and lease event as JSON lines to its log
// file. A closed stdin tells it to finish its transaction, release and exit.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/pgfence/pgfence/lease"
)

// writerConfig is passed to a writer process as JSON.
type writerConfig struct {
	ID         int           `json:"id"`
	Endpoints  []string      `json:"endpoints"`
	Prefix     string        `json:"prefix"`
	PGURL      string        `json:"pg_url"`
	Table      string        `json:"table"`
	Rows       int           `json:"rows"`
	RowsPerTx  int           `json:"rows_per_tx"`
	TxPerHold  int           `json:"tx_per_hold"`
	TTL        time.Duration `json:"ttl"`
	Margin     time.Duration `json:"margin"`
	ComputeMin time.Duration `json:"compute_min"`
	ComputeMax time.Duration `json:"compute_max"`
	LogPath    string        `json:"log_path"`
	Seed       uint64        `json:"seed"`
}

// record is one line of a writer's log.
type record struct {
	Kind   string `json:"kind"` // "write" or "lease"
	Writer int    `json:"writer"`
	Token  int64  `json:"token"`

	// kind "write": one UPDATE of one row.
	Tx            string `json:"tx,omitempty"`  // transaction id, also stored in the row's history
	Row           int    `json:"row,omitempty"` // row id
	BelievedValid bool   `json:"believed_valid,omitempty"`
	ValidAtSend   bool   `json:"valid_at_send,omitempty"`
	Sent          int64  `json:"sent,omitempty"` // unix ns, just before the statement was sent
	Done          int64  `json:"done,omitempty"` // unix ns, when its result arrived
	Rows          int64  `json:"rows"`           // rows affected (-1: error)
	Err           string `json:"err,omitempty"`
	Commit        string `json:"commit,omitempty"` // committed, rolled_back, unknown

	// kind "lease"
	Event string `json:"event,omitempty"` // acquired, lost, released, acquire_failed
	At    int64  `json:"at,omitempty"`
	Cause string `json:"cause,omitempty"`
}

func writerMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: torture -writer CONFIG_JSON")
		return 2
	}
	var cfg writerConfig
	if err := json.Unmarshal([]byte(args[0]), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "torture writer: bad config:", err)
		return 2
	}
	w, err := newWriter(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "torture writer %d: %v\n", cfg.ID, err)
		return 1
	}
	defer w.close()
	// Closed stdin: stop.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		w.stopping.Store(true)
	}()
	w.run()
	return 0
}

type writer struct {
	cfg      writerConfig
	rng      *rand.Rand
	etcd     *clientv3.Client
	lock     *lease.Etcd
	conn     *pgx.Conn
	log      *bufio.Writer
	logFile  *os.File
	out      *bufio.Writer
	outMu    sync.Mutex
	stopping atomic.Bool
	txSeq    int
}

func newWriter(cfg writerConfig) (*writer, error) {
	f, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return &writer{
		cfg:     cfg,
		rng:     rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.ID))),
		etcd:    cli,
		lock:    &lease.Etcd{Client: cli, Prefix: cfg.Prefix, TTL: cfg.TTL, SafetyMargin: cfg.Margin},
		log:     bufio.NewWriter(f),
		logFile: f,
		out:     bufio.NewWriter(os.Stdout),
	}, nil
}

func (w *writer) close() {
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		w.conn.Close(ctx)
		cancel()
	}
	w.etcd.Close()
	w.log.Flush()
	w.logFile.Close()
}

func (w *writer) emit(ev string, token int64) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	fmt.Fprintf(w.out, "%s %d\n", ev, token)
	w.out.Flush()
}

func (w *writer) record(r record) {
	r.Writer = w.cfg.ID
	b, _ := json.Marshal(r)
	w.log.Write(b)
	w.log.WriteByte('\n')
}

func (w *writer) run() {
	for !w.stopping.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := w.lock.Acquire(ctx)
		cancel()
		if err != nil {
			w.record(record{Kind: "lease", Event: "acquire_failed", At: now(), Cause: err.Error()})
			w.log.Flush()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		w.record(record{Kind: "lease", Event: "acquired", Token: l.Token, At: now()})
		w.emit("A", l.Token)
		w.hold(l)
		cause := ""
		if err := l.Err(); err != nil {
			cause = err.Error()
			w.record(record{Kind: "lease", Event: "lost", Token: l.Token, At: now(), Cause: cause})
		}
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		l.Release(ctx)
		cancel()
		w.record(record{Kind: "lease", Event: "released", Token: l.Token, At: now()})
		w.log.Flush()
		w.emit("R", l.Token)
	}
}

// hold runs up to TxPerHold transactions under l, stopping when l is no
// longer valid or a write was fenced.
func (w *writer) hold(l *lease.Lease) {
	for i := 0; i < w.cfg.TxPerHold && !w.stopping.Load(); i++ {
		if !l.Valid() {
			return
		}
		if err := w.ensureConn(l); err != nil {
			continue
		}
		fenced := w.transaction(l)
		w.log.Flush()
		if fenced {
			return // a newer holder has written: stop acting as the holder
		}
	}
}

// ensureConn (re)connects to Postgres (through pgfence or not) while the
// lease is valid.
func (w *writer) ensureConn(l *lease.Lease) error {
	if w.conn != nil && !w.conn.IsClosed() {
		return nil
	}
	for l.Valid() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, w.cfg.PGURL)
		cancel()
		if err == nil {
			w.conn = c
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("lease lost while connecting")
}

// transaction is one read-modify-write of RowsPerTx rows; it reports
// whether a write was fenced.
func (w *writer) transaction(l *lease.Lease) (fenced bool) {
	w.txSeq++
	txID := fmt.Sprintf("w%d.%d", w.cfg.ID, w.txSeq)
	rows := w.pickRows()
	// Generous: a frozen writer must still be able to send its zombie
	// writes when it wakes up (a wall-clock deadline would cancel them).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var attempts []record
	defer func() {
		for _, a := range attempts {
			w.record(a)
		}
	}()

	tx, err := w.conn.Begin(ctx)
	if err != nil {
		w.dropConn()
		return false
	}
	if err := (lease.Fencer{}).SetToken(ctx, tx, l.Token); err != nil {
		tx.Rollback(ctx)
		w.dropConn()
		return false
	}
	counters := map[int]int64{}
	res, err := tx.Query(ctx, fmt.Sprintf("SELECT id, counter FROM %s WHERE id = ANY($1)", w.cfg.Table), rows)
	if err == nil {
		for res.Next() {
			var id int
			var n int64
			if err := res.Scan(&id, &n); err == nil {
				counters[id] = n
			}
		}
		res.Close()
		err = res.Err()
	}
	if err != nil {
		tx.Rollback(ctx)
		w.dropConn()
		return false
	}

	// The check: am I still the holder?
	believed := l.Valid()
	if !believed {
		tx.Rollback(ctx)
		return false
	}
	w.emit("C", l.Token)
	compute := w.cfg.ComputeMin
	if span := w.cfg.ComputeMax - w.cfg.ComputeMin; span > 0 {
		compute += time.Duration(w.rng.Int64N(int64(span)))
	}
	time.Sleep(compute) // a pause here (GC, VM freeze, SIGSTOP) makes a zombie

	update := fmt.Sprintf(`UPDATE %s SET counter = $2,
		hist_tok = hist_tok || $3::bigint,
		hist_at = hist_at || clock_timestamp(),
		hist_op = hist_op || $4::text
		WHERE id = $1`, w.cfg.Table)
	failed := false
	for _, id := range rows {
		a := record{Kind: "write", Tx: txID, Row: id, Token: l.Token, BelievedValid: believed, ValidAtSend: l.Valid(), Sent: now()}
		tag, err := tx.Exec(ctx, update, id, counters[id]+1, l.Token, txID)
		a.Done = now()
		if err != nil {
			a.Rows, a.Err = -1, err.Error()
			attempts = append(attempts, a)
			failed = true
			break
		}
		a.Rows = tag.RowsAffected()
		attempts = append(attempts, a)
		if a.Rows == 0 {
			fenced = true // checked once the batch is sent, like most code does
		}
	}

	outcome := "rolled_back"
	switch {
	case failed || fenced:
		tx.Rollback(ctx)
		if failed {
			w.dropConn()
		}
	default:
		err := tx.Commit(ctx)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			outcome = "committed"
		case errors.As(err, &pgErr):
			outcome = "rolled_back" // the server answered: not committed
			w.dropConn()
		default:
			outcome = "unknown" // the connection broke: it may or may not have committed
			w.dropConn()
		}
		if err != nil {
			for i := range attempts {
				if attempts[i].Err == "" {
					attempts[i].Err = "commit: " + err.Error()
				}
			}
		}
	}
	for i := range attempts {
		attempts[i].Commit = outcome
	}
	return fenced
}

func (w *writer) dropConn() {
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		w.conn.Close(ctx)
		cancel()
		w.conn = nil
	}
}

// pickRows picks RowsPerTx distinct row ids, sorted (a fixed lock order
// keeps concurrent writers from deadlocking).
func (w *writer) pickRows() []int {
	perm := w.rng.Perm(w.cfg.Rows)
	n := min(w.cfg.RowsPerTx, w.cfg.Rows)
	rows := make([]int, n)
	for i := range rows {
		rows[i] = perm[i] + 1
	}
	sort.Ints(rows)
	return rows
}

func now() int64 { return time.Now().UnixNano() }

// parseEvent parses a writer's stdout line "X token".
func parseEvent(line string) (ev string, token int64, ok bool) {
	if len(line) < 3 || line[1] != ' ' {
		return "", 0, false
	}
	t, err := strconv.ParseInt(line[2:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return line[:1], t, true
}
