package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/netfault"
	"github.com/pgfence/pgfence/internal/patroni"
	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/lease/leasetest"
)

// config is one torture session: a pgfence run and a direct run.
type config struct {
	Duration       time.Duration // the pgfence run
	DirectDuration time.Duration // the direct run
	// FailoverDuration is how long each failover run (synchronous, then
	// asynchronous replication) injects faults; 0 skips them.
	FailoverDuration time.Duration
	Writers          int
	Pgfences         int // pgfence instances in the pgfence run, writers spread over them
	Rows             int
	RowsPerTx        int
	TxPerHold        int
	TTL              time.Duration
	Margin           time.Duration
	Freeze           time.Duration
	ComputeMin       time.Duration
	ComputeMax       time.Duration
	SlowDelay        time.Duration
	SlowFor          time.Duration
	Gap              time.Duration // between faults
	PartitionFor     time.Duration // kill-leader: how long the standby gets no WAL before the leader dies
	Seed             uint64
	Verbose          bool
	Dir              string // logs; "" means a temporary directory
	Keep             bool   // keep Dir
	Out              io.Writer
	Exe              string // this binary, re-executed as the writers
}

func defaultConfig() config {
	return config{
		Duration:         60 * time.Second,
		DirectDuration:   30 * time.Second,
		FailoverDuration: 45 * time.Second,
		Writers:          8,
		Pgfences:         2,
		Rows:             10,
		RowsPerTx:        3,
		TxPerHold:        3,
		TTL:              2 * time.Second,
		Margin:           500 * time.Millisecond,
		Freeze:           4 * time.Second,
		ComputeMin:       50 * time.Millisecond,
		ComputeMax:       150 * time.Millisecond,
		SlowDelay:        25 * time.Millisecond,
		SlowFor:          4 * time.Second,
		Gap:              time.Second,
		PartitionFor:     1500 * time.Millisecond,
		Out:              os.Stdout,
	}
}

type mode string

const (
	modePgfence mode = "pgfence"
	modeDirect  mode = "direct"
	// Through pgfence to a Patroni cluster (a primary and a streaming
	// standby) that fails over mid-run, with synchronous or asynchronous
	// replication.
	modeSync  mode = "failover-sync"
	modeAsync mode = "failover-async"
)

// failover reports whether m runs against a Patroni cluster.
func (m mode) failover() bool { return m == modeSync || m == modeAsync }

// env is what both runs share: Postgres and etcd.
type env struct {
	cfg  config
	dir  string
	pg   *pgserver.Server
	etcd *leasetest.Etcd
}

func setup(ctx context.Context, cfg config) (_ *env, err error) {
	e := &env{cfg: cfg, dir: cfg.Dir}
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "pgfence-torture-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.pg, err = pgserver.Start(ctx, pgserver.Options{}); err != nil {
		return nil, err
	}
	if e.etcd, err = leasetest.StartEtcd(ctx, leasetest.EtcdOptions{}); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	if e.etcd != nil {
		e.etcd.Stop()
	}
	if e.pg != nil {
		e.pg.Stop()
	}
	if !e.cfg.Keep && e.cfg.Dir == "" {
		os.RemoveAll(e.dir)
	}
}

func (e *env) logf(format string, args ...any) {
	if e.cfg.Verbose {
		fmt.Fprintf(e.cfg.Out, "  "+format+"\n", args...)
	}
}

// writerProc is one writer process.
type writerProc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{}
	frozen atomic.Bool
}

func (p *writerProc) freeze() {
	p.frozen.Store(true)
	p.cmd.Process.Signal(syscall.SIGSTOP)
}

func (p *writerProc) thaw() {
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.frozen.Store(false)
}

// run is one run in mode m for d.
type run struct {
	*env
	mode    mode
	table   string
	prefix  string
	pfs     []*pgfence        // the pgfence run's instances, each in front of the same Postgres
	cluster *patroni.Cluster  // a failover run's Postgres
	relays  []*netfault.Relay // one per instance (or one to Postgres): the slow link
	procs   []*writerProc
	rng     *rand.Rand
	armed   atomic.Bool
	trigger chan *writerProc
	faults  map[string]int
	start   time.Time
}

func (e *env) run(ctx context.Context, m mode, d time.Duration) (*result, error) {
	r := &run{
		env:     e,
		mode:    m,
		table:   "torture_" + strings.ReplaceAll(string(m), "-", "_"),
		prefix:  "/torture/" + string(m),
		rng:     rand.New(rand.NewPCG(e.cfg.Seed, uint64(len(m)))),
		trigger: make(chan *writerProc, 1),
		faults:  map[string]int{},
	}
	upstreamURL := e.pg.URL("postgres")
	if m.failover() {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		c, err := patroni.Start(cctx, e.etcd.Endpoints(), patroni.Options{Synchronous: m == modeSync, ReplicationLink: true})
		cancel()
		if err != nil {
			return nil, err
		}
		defer c.Stop()
		r.cluster = c
		upstreamURL = c.HostsURL("postgres")
	}
	if err := r.createTable(ctx); err != nil {
		return nil, err
	}
	targets := []string{e.pg.Addr()}
	if m == modePgfence || m.failover() {
		targets = targets[:0]
		for i := range max(e.cfg.Pgfences, 1) {
			logf, err := os.Create(filepath.Join(e.dir, fmt.Sprintf("%s-pgfence-%d.log", m, i+1)))
			if err != nil {
				return nil, err
			}
			defer logf.Close()
			pf, err := startPgfence(upstreamURL, r.table, logf)
			if err != nil {
				return nil, err
			}
			defer pf.close(time.Second)
			r.pfs = append(r.pfs, pf)
			targets = append(targets, pf.Addr())
		}
	}
	for _, target := range targets {
		relay, err := netfault.NewRelay(target)
		if err != nil {
			return nil, err
		}
		defer relay.Close()
		r.relays = append(r.relays, relay)
	}

	if err := r.startWriters(); err != nil {
		r.stopWriters()
		return nil, err
	}
	r.start = time.Now()
	r.nemesis(ctx, d)
	r.stopWriters()
	elapsed := time.Since(r.start)
	rejects := -1.0
	var each []float64
	if len(r.pfs) > 0 {
		rejects = 0
		for _, pf := range r.pfs {
			pf.close(time.Second)
			each = append(each, pf.rejects())
			rejects += each[len(each)-1]
		}
	}

	res, err := r.check(ctx)
	if err != nil {
		return nil, err
	}
	res.Mode, res.Elapsed, res.Faults, res.PgfenceRejects, res.RejectsEach = m, elapsed, r.faults, rejects, each
	return res, nil
}

// dbURL connects straight to the run's Postgres: its primary now, in a
// failover run.
func (r *run) dbURL() string {
	if r.cluster != nil {
		return r.cluster.HostsURL("postgres")
	}
	return r.pg.URL("postgres")
}

func (r *run) createTable(ctx context.Context) error {
	c, err := pgx.Connect(ctx, r.dbURL())
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s;
		CREATE TABLE %[1]s (
			id int PRIMARY KEY,
			counter bigint NOT NULL DEFAULT 0,
			hist_tok bigint[] NOT NULL DEFAULT '{}',     -- tokens of the writes that landed, in order
			hist_at timestamptz[] NOT NULL DEFAULT '{}', -- when each was executed
			hist_op text[] NOT NULL DEFAULT '{}',        -- which transaction wrote it
			fence_epoch bigint NOT NULL DEFAULT 0
		);
		INSERT INTO %[1]s (id) SELECT generate_series(1, %[2]d);`, r.table, r.cfg.Rows))
	return err
}

func (r *run) startWriters() error {
	for i := 1; i <= r.cfg.Writers; i++ {
		wc := writerConfig{
			ID:         i,
			Endpoints:  r.etcd.Endpoints(),
			Prefix:     r.prefix,
			PGURL:      "postgres://postgres@" + r.relays[i%len(r.relays)].Addr() + "/postgres?sslmode=disable&application_name=torture-writer",
			Table:      r.table,
			Rows:       r.cfg.Rows,
			RowsPerTx:  r.cfg.RowsPerTx,
			TxPerHold:  r.cfg.TxPerHold,
			TTL:        r.cfg.TTL,
			Margin:     r.cfg.Margin,
			ComputeMin: r.cfg.ComputeMin,
			ComputeMax: r.cfg.ComputeMax,
			LogPath:    r.logPath(i),
			Seed:       r.cfg.Seed,
		}
		os.Remove(wc.LogPath)
		b, _ := json.Marshal(wc)
		cmd := exec.Command(r.cfg.Exe, "-writer", string(b))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stderr, err := os.Create(filepath.Join(r.dir, fmt.Sprintf("%s-writer-%d.stderr", r.mode, i)))
		if err != nil {
			return err
		}
		cmd.Stderr = stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting writer %d: %w", i, err)
		}
		stderr.Close()
		p := &writerProc{id: i, cmd: cmd, stdin: stdin, done: make(chan struct{})}
		r.procs = append(r.procs, p)
		go r.readEvents(p, stdout)
	}
	return nil
}

func (r *run) logPath(i int) string {
	return filepath.Join(r.dir, fmt.Sprintf("%s-writer-%d.jsonl", r.mode, i))
}

// readEvents follows a writer's stdout; when a freeze of the holder is
// armed, the first writer to report "C" (lease checked, about to write)
// is frozen on the spot.
func (r *run) readEvents(p *writerProc, out io.Reader) {
	defer func() {
		p.cmd.Wait()
		close(p.done)
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		ev, _, ok := parseEvent(sc.Text())
		if ok && ev == "C" && r.armed.CompareAndSwap(true, false) {
			p.freeze()
			r.trigger <- p
		}
	}
}

func (r *run) stopWriters() {
	for _, p := range r.procs {
		p.thaw()
		p.stdin.Close()
	}
	deadline := time.After(20 * time.Second)
	for _, p := range r.procs {
		select {
		case <-p.done:
		case <-deadline:
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// nemesis injects faults for d, one at a time (a slow link lasts a while
// in the background), in a fixed rotation so that even a short run sees
// each kind: freezes of the lock holder between its lease check
// and its write (the zombie maker), a slow link, restarts of pgfence,
// Postgres and etcd, and freezes of a random writer.
func (r *run) nemesis(ctx context.Context, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	rotation := []string{"freeze-holder", "restart-pgfence", "slow-link", "restart-etcd", "freeze-holder", "restart-postgres", "freeze-holder", "freeze-random"}
	if r.mode.failover() {
		// etcd is Patroni's too, and Postgres restarts are failovers here.
		rotation = []string{"freeze-holder", "kill-leader", "freeze-holder", "switchover", "freeze-random", "restart-pgfence", "slow-link"}
	}
	var slow sync.WaitGroup
	defer slow.Wait()
	if !sleep(ctx, r.cfg.Gap) {
		return
	}
	for i := 0; ctx.Err() == nil; i++ {
		f := rotation[i%len(rotation)]
		if f == "restart-pgfence" && len(r.pfs) == 0 {
			continue // nothing to restart in the direct run
		}
		at := time.Since(r.start).Round(10 * time.Millisecond)
		switch f {
		case "freeze-holder":
			r.armed.Store(true)
			var p *writerProc
			select {
			case p = <-r.trigger:
			case <-time.After(3 * time.Second):
				if r.armed.CompareAndSwap(true, false) {
					f = "freeze-random" // nobody got to write: freeze anyone
					p = r.procs[r.rng.IntN(len(r.procs))]
					p.freeze()
				} else {
					p = <-r.trigger
				}
			case <-ctx.Done():
				if !r.armed.CompareAndSwap(true, false) {
					p = <-r.trigger
					p.thaw()
				}
				return
			}
			r.logf("[%8v] %s: writer %d frozen for %v", at, f, p.id, r.cfg.Freeze)
			sleep(context.Background(), r.cfg.Freeze) // always thaw after the full freeze
			p.thaw()
		case "freeze-random":
			p := r.procs[r.rng.IntN(len(r.procs))]
			p.freeze()
			r.logf("[%8v] %s: writer %d frozen for %v", at, f, p.id, r.cfg.Freeze)
			sleep(context.Background(), r.cfg.Freeze)
			p.thaw()
		case "slow-link":
			r.logf("[%8v] %s: +%v per chunk for %v", at, f, r.cfg.SlowDelay, r.cfg.SlowFor)
			r.setDelay(r.cfg.SlowDelay)
			slow.Add(1)
			go func() {
				defer slow.Done()
				time.Sleep(r.cfg.SlowFor)
				r.setDelay(0)
			}()
		case "restart-pgfence":
			start := time.Now()
			k := r.faults[f] % len(r.pfs) // each instance in turn
			if err := r.pfs[k].restart(300 * time.Millisecond); err != nil {
				r.logf("[%8v] %s %d failed: %v", at, f, k+1, err)
			}
			r.logf("[%8v] %s %d: down %v", at, f, k+1, time.Since(start).Round(time.Millisecond))
		case "restart-postgres":
			start := time.Now()
			rctx, c := context.WithTimeout(context.Background(), time.Minute)
			if err := r.pg.Restart(rctx); err != nil {
				r.logf("[%8v] %s failed: %v", at, f, err)
			}
			c()
			r.logf("[%8v] %s: down %v", at, f, time.Since(start).Round(time.Millisecond))
		case "switchover":
			start := time.Now()
			fctx, c := context.WithTimeout(context.Background(), 2*time.Minute)
			leader, err := r.cluster.Failover(fctx)
			c()
			if err != nil {
				r.logf("[%8v] %s failed: %v", at, f, err)
			} else {
				r.logf("[%8v] %s: %s leads after %v", at, f, leader, time.Since(start).Round(time.Millisecond))
			}
		case "kill-leader":
			// The standby stops getting WAL, writes go on for a moment
			// (with synchronous replication their commits wait instead),
			// then the leader dies: what it had not sent is gone.
			start := time.Now()
			r.cluster.PartitionReplication()
			sleep(context.Background(), r.cfg.PartitionFor)
			fctx, c := context.WithTimeout(context.Background(), 2*time.Minute)
			leader, err := r.cluster.KillLeader(fctx)
			c()
			if err != nil {
				r.logf("[%8v] %s failed: %v", at, f, err)
			} else {
				r.logf("[%8v] %s: replication cut for %v, leader killed; %s leads after %v", at, f, r.cfg.PartitionFor, leader, time.Since(start).Round(time.Millisecond))
			}
		case "restart-etcd":
			start := time.Now()
			rctx, c := context.WithTimeout(context.Background(), time.Minute)
			if err := r.etcd.Restart(rctx); err != nil {
				r.logf("[%8v] %s failed: %v", at, f, err)
			}
			c()
			r.logf("[%8v] %s: down %v", at, f, time.Since(start).Round(time.Millisecond))
		}
		r.faults[f]++
		jitter := time.Duration(r.rng.Int64N(int64(r.cfg.Gap) + 1))
		if !sleep(ctx, r.cfg.Gap/2+jitter) {
			return
		}
	}
}

// setDelay slows (or, with 0, restores) every link to the database.
func (r *run) setDelay(d time.Duration) {
	for _, relay := range r.relays {
		relay.SetDelay(d)
	}
}

// faultSummary renders the fault counts.
func faultSummary(f map[string]int) string {
	var keys []string
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, f[k]))
	}
	return strings.Join(parts, ", ")
}
