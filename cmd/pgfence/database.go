package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
	"github.com/pgfence/pgfence/upstream"
)

// database is pgfence's fencing of one database: the policy its sessions
// get, made of the flags and what its own catalog says (discovered tables,
// lock-domain membership, the backstop), and the reads of that catalog
// that keep it so: at its first session (at start-up for the --upstream
// database), every --discover-interval, on SIGHUP, and after DDL seen in
// one of its sessions.
//
// Each database has a goroutine of its own for its reads (run), rather
// than one loop over all: a read after DDL waits for nothing but its own
// database's read (a session holds its next statement for it), a database
// whose reads hang (a lock, an unreachable pooler database) or fail holds
// up no other, and its state needs no more than the loop the --upstream
// database always had. What it costs is a goroutine and a ticker per
// database, and reads of several databases at once at each interval (one
// connection each, for the read's length).
type database struct {
	name string
	// main is set for the --upstream URL's database: read from start-up,
	// retried until a read works (as retry paces it), never forgotten.
	main bool
	log  *slog.Logger // names the database on every line
	// policy is nil until a read of the catalog has worked (the main
	// database's is made at start-up, so that its series exist from then).
	policy atomic.Pointer[fence.Policy]
	// known is set once a read of the catalog has worked: until then
	// pgfence cannot tell which of its tables to fence (discovered ones,
	// partitions), and refuses its sessions (see admit).
	known atomic.Bool
	// first is closed once the first read is done, worked or not; firstErr
	// is why it did not work.
	first    chan struct{}
	firstErr error
	// retry paces the main database's reads until one works: a refused
	// login (a wrong password) is not tried every second. With one
	// --upstream host it is that host's, which paces /readyz's checks too:
	// the reads and the checks take turns, one login per wait. retryIn is
	// the wait the last failed read set, and lastErr why it failed (what a
	// refused client is told the SQLSTATE of).
	retry   *upstream.Backoff
	retryIn atomic.Int64 // a time.Duration
	lastErr atomic.Pointer[error]
	// ddl takes the requests of readAfterDDL; stopped is closed when run
	// returns, after which no read is coming.
	ddl     chan chan struct{}
	stopped chan struct{}
	status  atomic.Pointer[string]

	mu          sync.Mutex // serialises reads, and guards what follows
	metrics     *fence.DatabaseMetrics
	lastGood    *catalog.Found // the last read that worked
	notWatching string         // why the backstop's event trigger is not in place, as last logged
	notGuarding string         // why the DDL guard is not in place, as last logged
	exposed     string         // the tables whose owners can switch their backstop off, as last logged
	// gap, when set, is why the database is not ready: a guarded table
	// lacks its backstop (see /readyz and --ready-without-backstop).
	gap atomic.Pointer[string]
	// unfenceable, when set, names the guarded tables that cannot be
	// fenced (their writes are refused): not ready either.
	unfenceable atomic.Pointer[string]
	// retrySoon says the last read could not install a table's backstop
	// without waiting behind open transactions: run reads again soon.
	retrySoon atomic.Bool
	// gone is set, and goneCh closed, once a read finds that the database
	// no longer exists: run stops, and a session of its name starts over
	// (see instance.database).
	gone     atomic.Bool
	goneCh   chan struct{}
	goneOnce sync.Once
}

func newDatabase(name string, main bool, log *slog.Logger) *database {
	return &database{name: name, main: main, log: log.With("database", name), retry: &upstream.Backoff{},
		first: make(chan struct{}), ddl: make(chan chan struct{}), stopped: make(chan struct{}), goneCh: make(chan struct{})}
}

// load reads the catalog of the database and applies the options in force,
// extended with what it says. When the catalog cannot be read it keeps
// the guards of the last good read (fail closed): a failover or a full
// connection table must not unguard the tables only discovery finds.
func (d *database) load(ctx context.Context, i *instance) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.main {
		defer i.serving() // once the first read has worked
	}
	o := i.options() // under d.mu: a read never applies options older than the last one's
	cfg, apply, err := o.policyConfig()
	if err != nil { // checked before they were put in force: not expected
		d.log.Error("configuration not reloaded", "err", err)
		return
	}
	read, err := i.readCatalog(ctx, d.name, o, cfg.Guards, apply)
	switch {
	case err != nil && !d.main && isNoDatabase(err):
		// Dropped (or renamed): it has no sessions left, and none can
		// start. A database of its name made later starts over.
		d.retry.Ended()
		d.firstErr = err
		d.gone.Store(true)
		d.goneOnce.Do(func() { close(d.goneCh) })
		if d.known.Load() {
			d.log.Info("the database is gone: pgfence forgets it", "err", err)
		} else {
			d.log.Info("no such database: its session gets Postgres's own error", "err", err)
		}
		return
	case err != nil && d.lastGood != nil:
		d.metrics.DiscoveryOK(false)
		cfg.Guards = keepGuards(d.lastGood.Guards, cfg.Guards, apply)
		configure(d.lastGood, &cfg)
		d.log.Error("cannot read the catalog: keeping the guarded tables of the last good read; retrying",
			"upstream", i.upstream, "err", err, "kept", len(cfg.Guards))
		d.setStatus(fmt.Sprintf("catalog: last read failed (%v); guarding the tables of the last good read", err))
	case err != nil && d.main:
		d.metrics.DiscoveryOK(false)
		d.lastErr.Store(&err)
		wait := d.retry.Failed(err)
		d.retryIn.Store(int64(wait))
		hint := "pgfence tries again, waiting longer each time (SIGHUP tries at once)"
		if upstream.Refused(err) {
			hint = "Postgres refused pgfence's own role (the --upstream URL's user): check its password (PGPASSWORD, or the passfile), pg_hba.conf, and its CONNECT privilege; " + hint
		}
		d.log.Error("cannot read the catalog, and it never has been: clients are refused until it works, as pgfence cannot tell which tables to fence",
			"upstream", i.upstream, "err", err, "retry_in", wait.Round(time.Millisecond), "hint", hint)
		d.setStatus(fmt.Sprintf("catalog: never read (%v); clients refused until it is; next try in %v", err, wait.Round(time.Millisecond)))
	case err != nil:
		// Its sessions are refused, saying why; the next one tries again.
		// Nothing is kept of it meanwhile: a client may name any database.
		d.log.Error("cannot read the catalog: the database's sessions are refused until a read works; its next session tries again",
			"upstream", i.upstream, "err", err,
			"hint", "pgfence's role (the --upstream URL's user) must be able to connect to every database clients use through pgfence; or exclude this one with --exclude-database")
		d.firstErr = err
		d.retry.Failed(err) // paces the reads its next sessions would make (see instance.database)
		i.failedReads.Store(d.name, err)
		return
	default:
		if d.metrics == nil {
			d.metrics = i.metrics.Database(d.name)
		}
		d.retry.Succeeded()
		d.metrics.DiscoveryOK(true)
		i.failedReads.Delete(d.name)
		if !d.main {
			i.dbMu.Lock()
			delete(i.paces, d.name)
			i.dbMu.Unlock()
		}
		d.lastGood = read
		d.known.Store(true)
		for _, p := range read.Problems {
			d.log.Error("guarded table problem", "problem", p)
		}
		cfg.Guards = read.Guards
		configure(read, &cfg)
		d.reportBackstop(read, i.options())
		d.noteUnfenceable(read.Guards)
	}
	policy := d.policy.Load()
	if policy == nil {
		if policy, err = i.router.New(d.name, cfg, d.log); err != nil {
			d.log.Error("configuration not loaded", "err", err)
			d.firstErr = err
			d.known.Store(false)
			return
		}
		policy.SetDDLHook(d.readAfterDDL)
		d.policy.Store(policy)
	} else if reflect.DeepEqual(cfg, policy.Config()) {
		// Nothing changed: keep the rewrite caches and the sessions'
		// prepared statements (a reload would plan them again).
		return
	} else if err := policy.Reload(cfg); err != nil {
		d.log.Error("configuration not reloaded", "err", err)
		return
	}
	names := make([]string, len(cfg.Guards))
	for k, g := range cfg.Guards {
		names[k] = g.Name() + ":" + g.Rollout.String()
	}
	d.log.Info("guarded tables", "count", len(names), "tables", strings.Join(names, ","))
}

// isNoDatabase reports whether err says the database does not exist.
func isNoDatabase(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "3D000"
}

// keepGuards is the last good read's guards with the flags' settings now,
// and the explicit guards it lacks. The lock domain the database gave a
// table stays unless the flags now give it one.
func keepGuards(last, explicit []sqlrewrite.Guard, apply func(sqlrewrite.Guard) sqlrewrite.Guard) []sqlrewrite.Guard {
	out := make([]sqlrewrite.Guard, 0, len(last)+len(explicit))
	seen := map[[2]string]bool{}
	for _, g := range last {
		n := apply(g)
		if n.Domain == "" {
			n.Domain = g.Domain
		}
		n.Backstop = g.Backstop
		out = append(out, n)
		seen[[2]string{g.Schema, g.Table}] = true
	}
	for _, g := range explicit {
		if !seen[[2]string{g.Schema, g.Table}] {
			out = append(out, g)
		}
	}
	return out
}

// reportBackstop puts the backstop's state in the metrics, the log and
// /readyz's body (and what makes it not ready: see gap).
func (d *database) reportBackstop(read *catalog.Found, o serveOptions) {
	d.retrySoon.Store(false)
	if read.Backstop == nil {
		d.metrics.Backstop(nil)
		d.metrics.BackstopExposure(nil)
		d.metrics.BackstopDifferences(0)
		d.gap.Store(nil)
		d.setStatus("backstop: off (--backstop=off): only writes pgfence sees in the SQL text are fenced")
		return
	}
	rep := read.Backstop
	installed := map[string]bool{}
	for _, t := range rep.Tables {
		installed[t.Guard.Name()] = t.OK
		if t.Changed != "" {
			d.log.Info("backstop", "table", t.Guard.Name(), "did", t.Changed)
		}
	}
	d.metrics.Backstop(installed)
	if len(rep.DroppedFunctions) > 0 {
		d.log.Info("backstop: dropped the trigger functions no trigger runs any more", "functions", strings.Join(rep.DroppedFunctions, ","))
	}
	d.retrySoon.Store(rep.Retry())
	var lines []string
	// Who can switch it off unseen: without the DDL guard, the owner of
	// each table pgfence's role does not own.
	exposed := map[string]string{}
	if !rep.GuardingDDL {
		for _, t := range rep.Tables {
			if t.Owner != "" && t.Owner != rep.Role {
				exposed[t.Guard.Name()] = t.Owner
			}
		}
	}
	d.metrics.BackstopExposure(exposed)
	if w := rep.NotGuardingDDL; w != d.notGuarding {
		d.notGuarding = w
		if w != "" {
			d.log.Warn("backstop: DDL that would weaken it is not refused straight to Postgres", "why", w)
		} else {
			d.log.Info("backstop: DDL that would weaken it is refused, but for pgfence's role and the exempt ones", "event_triggers", backstop.GuardTrigger+","+backstop.DropGuardTrigger+","+backstop.RewriteGuardTrigger)
		}
	}
	if len(exposed) > 0 {
		var owned []string
		for table, owner := range exposed {
			owned = append(owned, table+" (owner "+owner+")")
		}
		slices.Sort(owned)
		if e := strings.Join(owned, ", "); e != d.exposed {
			d.exposed = e
			d.log.Warn("backstop: guarded tables owned by another role than pgfence's, which can switch their backstop off unseen until pgfence's next read (pgfence's role is not a superuser, so the DDL guard is not in place)",
				"tables", e, "pgfence_role", rep.Role)
		}
		lines = append(lines, "owners other than pgfence's role ("+rep.Role+") can switch the backstop off unseen on: "+strings.Join(owned, ", "))
	} else {
		d.exposed = ""
	}
	d.metrics.BackstopDifferences(len(rep.Differences))
	if len(rep.Differences) > 0 {
		d.log.Warn("backstop: this instance's configuration differs from the one the database records, which stays",
			"differences", strings.Join(rep.Differences, "; "), "how", backstop.RolloutHint)
		lines = append(lines, "configuration differs from the database's (which stays; "+backstop.RolloutHint+"): "+strings.Join(rep.Differences, "; "))
	}
	if w := rep.NotWatchingDDL; w != d.notWatching {
		d.notWatching = w
		if w != "" {
			d.log.Warn("backstop: tables created outside pgfence are not fenced by Postgres at once", "why", w)
		} else {
			d.log.Info("backstop: the event trigger puts it on tables as DDL gives them the epoch column", "event_trigger", backstop.EventTrigger)
		}
	}
	if read.Counts != nil {
		d.metrics.BackstopCounts(read.Counts.Rejects, read.Counts.Exempt)
	}
	if n := rep.Missing(); n > 0 {
		var missing []string
		for _, t := range rep.Tables {
			if !t.OK {
				missing = append(missing, t.Problem)
			}
		}
		gap := fmt.Sprintf("backstop: missing on %d of %d guarded tables (pgfence fences what it sees; writes it cannot see are not fenced there):\n  %s",
			n, len(rep.Tables), strings.Join(missing, "\n  "))
		if !o.readyWithoutBackstop {
			d.gap.Store(&gap)
		}
		d.setStatus(strings.Join(append([]string{gap}, lines...), "\n  "))
		return
	}
	d.gap.Store(nil)
	d.setStatus(strings.Join(append([]string{fmt.Sprintf("backstop: in place on all %d guarded tables", len(rep.Tables))}, lines...), "\n  "))
}

// setStatus sets the catalog's and backstop's state that /readyz reports.
func (d *database) setStatus(s string) { d.status.Store(&s) }

// statusLine is the state setStatus set last.
func (d *database) statusLine() string {
	if s := d.status.Load(); s != nil {
		return *s
	}
	return "catalog: not read yet"
}

// readAfterDDL is the policy's DDL hook (see fence.Policy.SetDDLHook): it
// asks run for a read that starts after the call, and returns a channel
// closed once that read is done, or at once if no read is coming (the
// database was forgotten). It never blocks the relay.
func (d *database) readAfterDDL() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		select {
		case d.ddl <- done:
		case <-d.stopped:
			close(done)
		}
	}()
	return done
}

// run reads the catalog first, then again every interval (0: never), when
// a session's DDL asks for it (readAfterDDL), and, for the main database
// until a read works, as its retry paces it. It returns when ctx ends, when the
// first read of a database other than the main one fails, or when the
// database is gone; i then forgets the database.
func (d *database) run(ctx context.Context, i *instance, every time.Duration) {
	var waiting []chan struct{}
	defer func() {
		close(d.stopped)
		for _, w := range waiting {
			close(w)
		}
		if !d.main {
			i.forget(d)
		}
	}()
	if !d.main { // the main database's first read is start's
		d.load(ctx, i)
	}
	close(d.first)
	if !d.known.Load() && !d.main || d.gone.Load() {
		return
	}
	var tick, retry, soon <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	// A backstop Install could not put in place without waiting behind
	// open transactions is tried again after a second, then twice as long
	// each time, up to the interval.
	var backoff time.Duration
	again := func() {
		if !d.retrySoon.Load() {
			backoff, soon = 0, nil
			return
		}
		limit := every
		if limit <= 0 {
			limit = time.Minute
		}
		backoff = min(max(2*backoff, time.Second), max(limit, time.Second))
		soon = time.After(backoff)
	}
	again()
	// Clients wait for the first read that works: try again after the wait
	// the last failed read set.
	rearm := func() {
		retry = nil
		if !d.known.Load() {
			wait := time.Duration(d.retryIn.Load())
			var held *upstream.HeldError
			if errors.As(d.retry.Held(), &held) {
				// A check's turn: look again when its wait ends, or soon
				// while it is under way.
				wait = held.Left
				if held.Trying {
					wait = upstream.BackoffBase
				}
			}
			retry = time.After(wait)
		}
	}
	rearm()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.goneCh: // a read of reload's found it gone
			return
		case <-tick:
		case <-soon:
		case <-retry:
			if d.known.Load() {
				retry = nil
				continue
			}
		case w := <-d.ddl:
			waiting = append(waiting, w)
		}
		if !d.known.Load() && d.retry.Try() != nil {
			// A check has been refused since, or is trying (see retry):
			// wait for the turn. load ends the turn taken here.
			rearm()
			continue
		}
		for more := true; more; { // every request so far is served by this read
			select {
			case w := <-d.ddl:
				waiting = append(waiting, w)
			default:
				more = false
			}
		}
		d.load(ctx, i)
		again()
		rearm()
		for _, w := range waiting {
			close(w)
		}
		waiting = waiting[:0]
		if d.gone.Load() {
			return
		}
	}
}

// firstReadWait bounds how long a session's first statement waits for
// the first read of its database's catalog (with --startup-timeout: see
// admissionWait).
const firstReadWait = 10 * time.Second

// admissionWait is how long a session's first statement may wait for its
// database's first read (see awaitFirstRead): firstReadWait, and at most
// half of --startup-timeout, as a client that waits that long to connect
// should not wait longer for its first answer.
func admissionWait(startupTimeout time.Duration) time.Duration {
	if startupTimeout <= 0 {
		startupTimeout = 30 * time.Second // proxy.Config's default
	}
	return min(firstReadWait, startupTimeout/2)
}

// admit is proxy.Config.Admit: a session is refused while a pooler nobody
// told pgfence of answers at the upstream, when its database is excluded,
// and, for the --upstream database, until a read of its catalog has
// worked. Another database's catalog is first read only once Postgres has
// authenticated a client of it (see awaitFirstRead): a client that cannot
// log in makes pgfence read, and set up, no database.
func (i *instance) admit(c *proxy.Client) error {
	if why := i.pooler.Load(); why != nil {
		return errors.New(*why) // the proxy says "pgfence: " itself
	}
	name := c.Database
	switch {
	case name == "" && c.Replication:
		// A physical replication connection: no database, no table to
		// fence. It is served once the main database's catalog is read,
		// as it always was.
		name = i.main.name
	case name == "":
		return errors.New("it cannot tell which database the session connects to (it does not read the startup packet of this protocol version), so it cannot tell which tables to fence: connect with protocol 3.0 or 3.2")
	case i.excluded(name):
		return fmt.Errorf("database %q is excluded from fencing (--exclude-database), so pgfence does not serve its sessions: connect to Postgres directly for it, or drop it from --exclude-database and reload pgfence (SIGHUP) to have it fenced", name)
	}
	if name == i.main.name && !i.main.known.Load() {
		return errors.New(i.main.notReady())
	}
	return nil
}

// notReady is what a client of the main database is told while its
// catalog has never been read: that pgfence is not ready, to see its log,
// and the SQLSTATE its last read failed with. Never the failure itself:
// that is pgfence's own login, which names pgfence's role (and would have
// the client look for a fault in its own).
func (d *database) notReady() string {
	why := "it cannot tell which tables to fence until it has read Postgres's catalog"
	if e := d.lastErr.Load(); e != nil {
		if code := upstream.SQLState(*e); code != "" {
			why += "; its last try failed with SQLSTATE " + code
		}
	}
	return "not ready: see its log (" + why + "); connect again shortly"
}

// awaitFirstRead is fence.Databases's Await, for a session of a database
// pgfence has no policy for: the first statement of the session waits for
// it, once Postgres has authenticated the client. It starts the reads of
// the database's catalog unless they have started, and returns a channel
// closed once the first is done, or admissionWait has passed; the session
// gets the database's policy then, or has every statement refused, saying
// so, until a read works (and a statement after that gets it).
func (i *instance) awaitFirstRead(c *proxy.Client) <-chan struct{} {
	done := make(chan struct{})
	d := i.database(c.Database)
	if d == nil { // closing
		close(done)
		return done
	}
	go func() {
		t := time.NewTimer(i.admissionWait)
		defer t.Stop()
		select {
		case <-d.first:
		case <-t.C:
			d.log.Warn("a session's first statement waited for the first read of the database's catalog as long as it may: it is refused, as pgfence cannot tell which tables to fence yet", "waited", i.admissionWait)
		}
		close(done)
	}()
	return done
}

// whyNoPolicy is fence.Databases's Why: why the session's database has
// no policy, for the refusal of its statements.
func (i *instance) whyNoPolicy(c *proxy.Client) string {
	if err, ok := i.failedReads.Load(c.Database); ok {
		// Not the failure itself (see notReady): its SQLSTATE.
		code := ""
		if sqlstate := upstream.SQLState(err.(error)); sqlstate != "" {
			code = " (SQLSTATE " + sqlstate + ")"
		}
		var held *upstream.HeldError
		if errors.As(err.(error), &held) && !held.Trying {
			return fmt.Sprintf("pgfence is not ready for it: its read of the database's catalog failed%s: see pgfence's log; pgfence reads it again at a session that starts in %v or later",
				code, held.Left.Round(100*time.Millisecond))
		}
		return fmt.Sprintf("pgfence is not ready for it: its read of the database's catalog failed%s: see pgfence's log; reconnect to retry", code)
	}
	return fmt.Sprintf("the first read of its catalog did not finish within %v; try again shortly", i.admissionWait)
}

// route is fence.Databases's: the policy of the session's database, nil
// if pgfence has none (yet: see awaitFirstRead).
func (i *instance) route(c *proxy.Client) *fence.Policy {
	name := c.Database
	if name == "" && c.Replication {
		name = i.main.name
	}
	i.dbMu.Lock()
	d := i.dbs[name]
	i.dbMu.Unlock()
	if d == nil {
		return nil
	}
	return d.policy.Load()
}

// database returns the database of that name, starting its reads if it is
// new, or if the one of its name is gone (dropped, and maybe made again
// since); nil once pgfence is closing.
func (i *instance) database(name string) *database {
	i.dbMu.Lock()
	defer i.dbMu.Unlock()
	if d := i.dbs[name]; d != nil && !d.gone.Load() {
		return d
	}
	if i.ctx.Err() != nil {
		return nil
	}
	d := newDatabase(name, false, i.log)
	pace := i.paces[name]
	if pace == nil {
		pace = &upstream.Backoff{}
		i.paces[name] = pace
	}
	if err := pace.Try(); err != nil {
		// Its last read was refused, and the wait that set is not over (or
		// another session's read is under way): a login now would be
		// refused the same way, each one a FATAL line in Postgres's log
		// that tools policing failed logins count against pgfence. The
		// session is refused without one, saying when pgfence tries again.
		i.failedReads.Store(name, err)
		close(d.first)
		return d
	}
	d.retry = pace
	i.dbs[name] = d
	go d.run(i.ctx, i, i.discoverEvery)
	return d
}

// forget drops d, whose reads have stopped: a later session of its name
// starts over. Its series go with it, unless a database of its name has
// taken its place already (and its series).
func (i *instance) forget(d *database) {
	// Under dbMu, so that no successor makes its series before they go.
	i.dbMu.Lock()
	defer i.dbMu.Unlock()
	if i.dbs[d.name] != d {
		return
	}
	delete(i.dbs, d.name)
	if d.known.Load() && i.ctx.Err() == nil { // a database never read made no series
		i.metrics.Database(d.name).Retire()
	}
}

// databases lists the databases pgfence fences, the main one first.
func (i *instance) databases() []*database {
	i.dbMu.Lock()
	defer i.dbMu.Unlock()
	out := make([]*database, 0, len(i.dbs))
	for _, d := range i.dbs {
		if d != i.main {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b *database) int { return strings.Compare(a.name, b.name) })
	return append([]*database{i.main}, out...)
}

// backstopGap says whether the --upstream database has guarded tables
// without their backstop, "" when it has none (or with
// --ready-without-backstop); another database's gap is in /readyz's body
// and its metrics (see unfenceable).
func (i *instance) backstopGap() string {
	if g := i.main.gap.Load(); g != nil {
		return fmt.Sprintf("database %q: %s", i.main.name, *g)
	}
	return ""
}

// statusLines is each known database's state, for /readyz's body.
func (i *instance) statusLines() string {
	var b strings.Builder
	for _, d := range i.databases() {
		if !d.main && !d.known.Load() {
			continue // its first read is under way
		}
		what := ""
		if d.main {
			what = " (--upstream)"
		}
		fmt.Fprintf(&b, "database %q%s: %s\n", d.name, what, d.statusLine())
		if u := d.unfenceable.Load(); u != nil {
			fmt.Fprintf(&b, "  %s\n", *u)
		}
	}
	return b.String()
}

// excluded reports whether --exclude-database names the database.
func (i *instance) excluded(name string) bool {
	return (*i.exclude.Load())[name]
}

// upstreamDatabase is the database the --upstream URL connects to: its
// dbname, else its user name, as Postgres picks it.
func upstreamDatabase(url string) (string, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", fmt.Errorf("--upstream: %w", err)
	}
	if cfg.Database != "" {
		return cfg.Database, nil
	}
	return cfg.User, nil
}

// exclusions checks --exclude-database against the --upstream database.
func exclusions(o serveOptions, main string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, name := range o.excludeDatabases {
		if name == main {
			return nil, fmt.Errorf("--exclude-database %q: that is the --upstream database, which pgfence fences (its catalog tells it which tables are guarded); exclude other databases only", name)
		}
		if name == "" {
			return nil, errors.New("--exclude-database: an empty name")
		}
		out[name] = true
	}
	return out, nil
}
