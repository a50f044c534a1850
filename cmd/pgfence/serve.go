package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/server"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
	"github.com/pgfence/pgfence/upstream"
)

// serveOptions are the flags of 'pgfence serve' (and keys of its YAML file).
type serveOptions struct {
	policyOptions
	configFile       string
	listen           string
	unixSocketDir    string
	upstream         string
	metricsListen    string
	discover         bool
	discoverColumn   string
	discoverInterval time.Duration
	maxMessageSize   int
	startupTimeout   time.Duration
	maxClientConns   int
	goroutineRelay   bool
	forwardTokenSets bool
	upstreamPooling  string
	drainTimeout     time.Duration
	staleLogInterval time.Duration
	tlsCert          string
	tlsKey           string
	initDomains      bool
	backstop         string
	exemptRoles      []string
	logLevel         string
	logFormat        string
}

func (o *serveOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "YAML file with the same keys as these flags (flags win)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:6432", "address clients connect to: host:port, or the absolute path of a Unix socket (e.g. /run/pgfence/.s.PGSQL.6432, which clients reach with host=/run/pgfence port=6432)")
	f.StringVar(&o.unixSocketDir, "unix-socket-dir", "", "also listen on a Unix socket in this directory, named as Postgres names its own (.s.PGSQL.<--listen's port>), so that clients connect with host=DIR")
	f.StringVar(&o.upstream, "upstream", "", "postgres:// URL of the real server; its user and password serve only pgfence's own queries")
	f.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9187", "address of /metrics, /healthz and /readyz (\"\" to disable)")
	o.policyOptions.addFlags(cmd)
	f.BoolVar(&o.discover, "discover", true, "guard every table of the upstream database that has a bigint --discover-column (partitions and children of guarded tables are always guarded)")
	f.StringVar(&o.discoverColumn, "discover-column", "fence_epoch", "epoch column name that discovery looks for")
	f.DurationVar(&o.discoverInterval, "discover-interval", time.Minute, "how often the catalog is read again (also on SIGHUP); 0 for only at start and on SIGHUP")
	f.IntVar(&o.maxMessageSize, "max-message-size", 256<<20, "largest client message in bytes; a larger one ends that client's session")
	f.DurationVar(&o.startupTimeout, "startup-timeout", 30*time.Second, "how long a new client may take to send its startup packet")
	f.IntVar(&o.maxClientConns, "max-client-conns", 1000, "client sessions open at once; more are refused with SQLSTATE 53300 (0: no limit)")
	f.BoolVar(&o.goroutineRelay, "goroutine-relay", false, "relay every session with goroutines of its own instead of the event loop (slower; the event loop is Linux-only)")
	f.BoolVar(&o.forwardTokenSets, "forward-token-sets", false, "send every SET of the fencing token to Postgres as the client sent it; by default pgfence answers a plain one at once and sets the token ahead of the next statement, in the same transaction when that is a fenced write (saves a round trip per transaction)")
	f.StringVar(&o.upstreamPooling, "upstream-pooling", "none", "what stands at --upstream: none (Postgres itself; pgfence checks, and refuses clients if a pooler answers), session (a pooler that gives each session a server connection of its own, such as PgBouncer with pool_mode = session), or transaction (a pooler that shares server connections between transactions, such as PgBouncer with pool_mode = transaction: pgfence then sets the token in each transaction and leaves nothing on the server connection)")
	f.BoolVar(&o.initDomains, "init-domains", true, "create the lock-domain table (pgfence.domains) and its rows when missing; false for teams that forbid runtime DDL (run 'pgfence init' instead)")
	f.StringVar(&o.backstop, "backstop", "install", "the database backstop: triggers on every guarded table that enforce the fence inside Postgres, for writes pgfence cannot see (views, functions, cascades, direct connections): install (and keep it installed), verify (only check and report; install it with 'pgfence init'), or off")
	f.StringArrayVar(&o.exemptRoles, "backstop-exempt-role", nil, "a role whose writes the backstop lets through unfenced (migrations), counted and logged in the server log (repeatable)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate (chain) for client TLS; with --tls-key, pgfence accepts sslmode=require/verify-full clients and terminates their TLS")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key for --tls-cert")
	f.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long open transactions may go on before their sessions are closed")
	f.DurationVar(&o.staleLogInterval, "stale-log-interval", time.Second, "least time between two log lines of stale writes to one table (of one kind, path and mode): the first gets a line at once, then at most one per interval, which says how many it stands for (unlogged=N); the metrics count every one; 0 logs every stale write")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
}

// serving, if set, is told of each instance serve starts: tests learn from
// it where --listen 127.0.0.1:0 listens.
var serving func(*instance)

func serveCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the proxy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cli := commandLine(cmd) // before the file fills in the rest
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			stop := make(chan os.Signal, 2)
			signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
			defer signal.Stop(stop)
			if err := loadEnv(cmd); err != nil {
				return err
			}
			if err := loadConfigFile(cmd, o.configFile); err != nil {
				return err
			}
			// Lines go to stderr through a logWriter, so that a log
			// destination that stops reading cannot stop the relay.
			var log *slog.Logger
			lw := newLogWriter(os.Stderr, func(lines int) {
				log.Warn("log lines dropped: stderr took nothing while they came", "lines", lines, "kept_at_most_bytes", maxPendingLog)
			})
			defer lw.Close()
			log, err := newLogger(lw, o.logLevel, o.logFormat)
			if err != nil {
				return err
			}
			if o.upstream == "" {
				return errors.New("--upstream is required: the postgres:// URL of the server to protect, e.g. --upstream postgres://pgfence@127.0.0.1:5432/postgres")
			}
			inst, err := start(o, log)
			if err != nil {
				return err
			}
			if serving != nil {
				serving(inst)
			}
			log.Info("pgfence serving", "listen", inst.Addr(), "upstream", inst.upstream, "metrics", inst.MetricsAddr(),
				"guards", len(inst.policy.Config().Guards), "token_setting", o.tokenSetting, "version", buildVersion())
			var drained chan error // non-nil while draining
			for {
				select {
				case <-cmd.Context().Done():
					log.Info("shutting down")
					return inst.Close()
				case sig := <-stop:
					if sig != syscall.SIGTERM || drained != nil {
						log.Info("shutting down now", "signal", sig.String())
						return inst.Close()
					}
					log.Info("SIGTERM: draining; a second signal closes every session now", "drain_timeout", o.drainTimeout)
					drained = make(chan error, 1)
					go func() { drained <- inst.Shutdown(o.drainTimeout) }()
				case err := <-drained:
					if err != nil {
						log.Warn("drain timeout reached; remaining sessions were closed")
					}
					log.Info("drained; bye")
					return nil
				case <-hup:
					fresh, err := rereadOptions(cli)
					if err != nil {
						log.Error("SIGHUP: configuration not reloaded", "err", err)
						continue
					}
					log.Info("SIGHUP: reloading the guard configuration")
					if fresh.upstream != o.upstream || fresh.listen != o.listen || fresh.metricsListen != o.metricsListen {
						log.Warn("SIGHUP: --upstream, --listen and --metrics-listen take effect only after a restart")
					}
					inst.reload(cmd.Context(), fresh)
				}
			}
		},
	}
	o.addFlags(cmd)
	return cmd
}

// commandLine records the flags given on the command line.
func commandLine(cmd *cobra.Command) map[string][]string {
	cli := map[string][]string{}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			cli[f.Name] = sv.GetSlice()
		} else {
			cli[f.Name] = []string{f.Value.String()}
		}
	})
	return cli
}

// rereadOptions builds serve's options again from the command line, the
// environment and the config file as it is now.
func rereadOptions(cli map[string][]string) (serveOptions, error) {
	var o serveOptions
	cmd := &cobra.Command{Use: "serve"}
	o.addFlags(cmd)
	for name, vals := range cli {
		f := cmd.Flags().Lookup(name)
		var err error
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			err = sv.Replace(vals)
			f.Changed = true
		} else {
			err = cmd.Flags().Set(name, vals[0])
		}
		if err != nil {
			return o, err
		}
	}
	if err := loadEnv(cmd); err != nil {
		return o, err
	}
	return o, loadConfigFile(cmd, o.configFile)
}

func newLogger(out io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// instance is a running proxy with its metrics endpoint.
type instance struct {
	upstream    string // host:port or socket path, never with credentials
	upstreamURL string // for pgfence's own catalog queries; never logged
	log         *slog.Logger
	metrics     *fence.Metrics
	stop        context.CancelFunc

	mu       sync.Mutex // serialises reloads
	opts     serveOptions
	lastGood *catalogRead // the last catalog read that worked
	// known is set once a catalog read has worked: until then pgfence
	// cannot tell which tables to fence (discovered ones, partitions), and
	// refuses clients (see admit).
	known atomic.Bool
	// notWatching is why the backstop's event trigger is not in place, as
	// last logged.
	notWatching string
	ddl         chan chan struct{} // DDL seen: read the catalog again, then close it
	status      atomic.Pointer[string]
	// pooler, when set, is why client sessions are refused: a pooler
	// nobody told pgfence of answers at the upstream (see checkPooler).
	pooler atomic.Pointer[string]
	// hosts are --upstream's hosts; with more than one, sessions go to
	// the writable primary among them (see followPrimary).
	hosts []upstream.Host

	policy *fence.Policy
	proxy  *proxy.Server
	ln     net.Listener
	unixLn net.Listener // --unix-socket-dir, or nil
	httpLn net.Listener
	http   *http.Server
	served chan struct{} // closed when Serve returns
}

// clientTLS loads --tls-cert and --tls-key.
func clientTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// start builds and starts the proxy and its metrics endpoint, and reads the
// catalog (then every --discover-interval) in the background.
func start(o serveOptions, log *slog.Logger) (*instance, error) {
	ups, err := parseUpstream(o.upstream)
	if err != nil {
		return nil, err
	}
	up := ups.List[0].Upstream
	addr := up.Addr
	serverTLS, err := clientTLS(o.tlsCert, o.tlsKey)
	if err != nil {
		return nil, err
	}
	cfg, _, err := o.policyConfig()
	if err != nil {
		return nil, err
	}
	if _, _, err := backstopMode(o.backstop); err != nil {
		return nil, err
	}
	txPool, err := o.transactionPooling()
	if err != nil {
		return nil, err
	}
	var inst *instance // for Admit, which runs only once sessions do
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfo())
	built, err := server.New(server.Config{Fence: cfg, Logger: log, Registry: reg, Proxy: proxy.Config{
		Upstream:            addr,
		UpstreamNetwork:     up.Network,
		UpstreamTLS:         up.TLS,
		UpstreamTLSRequired: up.TLSRequired,
		RequirePrimary:      ups.RequirePrimary,
		TLS:                 serverTLS,
		MaxMessageSize:      o.maxMessageSize,
		StartupTimeout:      o.startupTimeout,
		MaxClientConns:      o.maxClientConns,
		GoroutineRelay:      o.goroutineRelay,
		ForwardSettings:     o.forwardTokenSets,
		TransactionPooling:  txPool,
		TokenSetting:        cfg.TokenSetting,
		Admit:               func(*proxy.Client) error { return inst.admit() },
		Hints: proxy.Hints{
			TooManyClients:  "try again later, or raise --max-client-conns",
			CannotConnect:   "check that Postgres is running and --upstream is right; try again",
			MessageTooLarge: "send smaller messages, or raise --max-message-size",
			Pooler:          "run pgfence with transaction pooling declared (pgfence serve --upstream-pooling=transaction), or connect it to Postgres directly",
		},
	}})
	if err != nil {
		return nil, err
	}
	srv, policy, metrics := built.Server, built.Policy, built.Metrics
	ln, err := listen(o.listen)
	if err != nil {
		return nil, err
	}
	unixLn, err := listenUnix(o.unixSocketDir, ln.Addr())
	if err != nil {
		ln.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst = &instance{
		upstream: addr, upstreamURL: o.upstream,
		log: log, metrics: metrics, policy: policy, proxy: srv, ln: ln,
		served: make(chan struct{}), stop: cancel,
	}
	if o.metricsListen != "" {
		if inst.httpLn, err = net.Listen("tcp", o.metricsListen); err != nil {
			ln.Close()
			cancel()
			return nil, fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// /healthz is liveness: the proxy answers, whatever Postgres does
		// (restarting a sidecar because Postgres is down helps nobody), and
		// within a liveness probe's default 1 s timeout even when Postgres's
		// address swallows packets: its note on Postgres waits 500 ms at most.
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			addr := srv.Upstream().Addr
			ctx, cancel := context.WithTimeout(r.Context(), healthzUpstreamWait)
			defer cancel()
			if err := srv.CheckUpstream(ctx); err != nil {
				fmt.Fprintf(w, "ok: proxy up; Postgres at %s unreachable: %v\n", addr, err)
				return
			}
			fmt.Fprintf(w, "ok: proxy up; Postgres at %s reachable\n", addr)
		})
		// /readyz is readiness: the upstream sessions go to is a writable
		// primary that answers pgfence's role, and no undeclared pooler
		// stands in front of it.
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			if why := inst.pooler.Load(); why != nil {
				http.Error(w, "not ready: "+*why+"\n", http.StatusServiceUnavailable)
				return
			}
			ok, what := inst.readiness(r.Context())
			if ok && !inst.known.Load() {
				ok, what = false, "pgfence has not read the catalog yet"
			}
			if !ok {
				http.Error(w, "not ready: "+what+"\n"+inst.statusLine()+"\n", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, "ready: %s\n%s\n", what, inst.statusLine())
		})
		inst.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go inst.http.Serve(inst.httpLn)
	}
	inst.hosts = ups.List
	reg.MustRegister(newUpstreamCollector(inst))
	if len(inst.hosts) > 1 {
		inst.followPrimary(ctx, time.Second)
	}
	// The catalog is read before clients are served, so discovered tables
	// are guarded from the first statement when Postgres is up.
	inst.reload(ctx, o)
	inst.unixLn = unixLn
	if unixLn != nil {
		go srv.Serve(unixLn)
	}
	go func() { srv.Serve(ln); close(inst.served) }()
	// DDL seen in a session has the catalog read again before that
	// session's next statement.
	inst.ddl = make(chan chan struct{}, 64)
	policy.SetDDLHook(func() <-chan struct{} {
		done := make(chan struct{})
		select {
		case inst.ddl <- done:
		default:
			go func() { inst.ddl <- done }() // never block the relay
		}
		return done
	})
	go inst.rediscover(ctx, o.discoverInterval)
	return inst, nil
}

// reload applies o's policy, extended with what the catalog says. When
// the catalog cannot be read it keeps the guards of the last good read
// (fail closed): a failover or a full connection table must not unguard
// the tables only discovery finds.
func (i *instance) reload(ctx context.Context, o serveOptions) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.opts = o
	cfg, apply, err := o.policyConfig()
	if err != nil {
		i.log.Error("configuration not reloaded", "err", err)
		return
	}
	read, err := i.readCatalog(ctx, o, cfg.Guards, apply)
	switch {
	case err != nil && i.lastGood != nil:
		i.metrics.DiscoveryOK(false)
		cfg.Guards = keepGuards(i.lastGood.guards, cfg.Guards, apply)
		i.log.Error("cannot read the catalog: keeping the guarded tables of the last good read; retrying",
			"upstream", i.upstream, "err", err, "kept", len(cfg.Guards))
		i.setStatus(fmt.Sprintf("catalog: last read failed (%v); guarding the tables of the last good read", err))
	case err != nil:
		i.metrics.DiscoveryOK(false)
		i.log.Error("cannot read the catalog, and it never has been: clients are refused until it works, as pgfence cannot tell which tables to fence; retrying every second",
			"upstream", i.upstream, "err", err)
		i.setStatus(fmt.Sprintf("catalog: never read (%v); clients refused until it is", err))
	default:
		i.metrics.DiscoveryOK(true)
		i.lastGood = read
		i.known.Store(true)
		for _, p := range read.problems {
			i.log.Error("guarded table problem", "problem", p)
		}
		cfg.Guards = read.guards
		i.reportBackstop(read)
	}
	if reflect.DeepEqual(cfg, i.policy.Config()) {
		// Nothing changed: keep the rewrite caches and the sessions'
		// prepared statements (a reload would plan them again).
		return
	}
	if err := i.policy.Reload(cfg); err != nil {
		i.log.Error("configuration not reloaded", "err", err)
		return
	}
	names := make([]string, len(cfg.Guards))
	for k, g := range cfg.Guards {
		names[k] = g.Name() + ":" + g.Rollout.String()
	}
	i.log.Info("guarded tables", "count", len(names), "tables", strings.Join(names, ","))
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
// /readyz's body.
func (i *instance) reportBackstop(read *catalogRead) {
	if read.backstop == nil {
		i.metrics.Backstop(nil)
		i.setStatus("backstop: off (--backstop=off): only writes pgfence sees in the SQL text are fenced")
		return
	}
	installed := map[string]bool{}
	for _, t := range read.backstop.Tables {
		installed[t.Guard.Name()] = t.OK
		if t.Changed != "" {
			i.log.Info("backstop", "table", t.Guard.Name(), "did", t.Changed)
		}
	}
	i.metrics.Backstop(installed)
	if w := read.backstop.NotWatchingDDL; w != i.notWatching {
		i.notWatching = w
		if w != "" {
			i.log.Warn("backstop: tables created outside pgfence are not fenced by Postgres at once", "why", w)
		} else {
			i.log.Info("backstop: the event trigger puts it on tables as DDL gives them the epoch column", "event_trigger", backstop.EventTrigger)
		}
	}
	if read.counts != nil {
		i.metrics.BackstopCounts(read.counts.Rejects, read.counts.Exempt)
	}
	if n := read.backstop.Missing(); n > 0 {
		var missing []string
		for _, t := range read.backstop.Tables {
			if !t.OK {
				missing = append(missing, t.Problem)
			}
		}
		i.setStatus(fmt.Sprintf("backstop: missing on %d of %d guarded tables (pgfence fences what it sees; writes it cannot see are not fenced there):\n  %s",
			n, len(read.backstop.Tables), strings.Join(missing, "\n  ")))
		return
	}
	i.setStatus(fmt.Sprintf("backstop: in place on all %d guarded tables", len(read.backstop.Tables)))
}

// setStatus sets the catalog's and backstop's state that /readyz reports.
func (i *instance) setStatus(s string) { i.status.Store(&s) }

// statusLine is the state setStatus set last.
func (i *instance) statusLine() string {
	if s := i.status.Load(); s != nil {
		return *s
	}
	return "catalog: not read yet"
}

func (i *instance) readCatalog(ctx context.Context, o serveOptions, explicit []sqlrewrite.Guard, apply func(sqlrewrite.Guard) sqlrewrite.Guard) (*catalogRead, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connectUpstream(ctx, i.upstreamURL, o.upstreamPooling)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if err := i.checkPooler(ctx, conn, o.upstreamPooling); err != nil {
		return nil, err
	}
	if _, on, _ := backstopMode(o.backstop); !o.discover && len(explicit) == 0 && !on {
		return &catalogRead{}, nil
	}
	return readCatalog(ctx, conn, o.catalogOptions(), explicit, apply)
}

// catalogOptions are the flags that say what a read of the catalog does.
func (o serveOptions) catalogOptions() catalogOptions {
	return catalogOptions{
		discover: o.discover, discoverColumn: o.discoverColumn, initDomains: o.initDomains,
		backstop: o.backstop, exemptRoles: o.exemptRoles,
		tokenSetting: o.tokenSetting, allowTruncate: o.allowTruncate,
	}
}

// rediscover reads the catalog again every interval (0: never), and when
// a session's DDL asks for it (see fence.Policy.SetDDLHook): the read
// starts after the request, and its channel is closed when the read is
// done, whether it worked or not.
func (i *instance) rediscover(ctx context.Context, every time.Duration) {
	var tick, retry <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	if !i.known.Load() {
		// Clients wait for the first read that works: try every second.
		t := time.NewTicker(time.Second)
		defer t.Stop()
		retry = t.C
	}
	var waiting []chan struct{}
	defer func() {
		for _, w := range waiting {
			close(w)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-retry:
			if i.known.Load() {
				retry = nil
				continue
			}
		case w := <-i.ddl:
			waiting = append(waiting, w)
		}
		for more := true; more; { // every request so far is served by this read
			select {
			case w := <-i.ddl:
				waiting = append(waiting, w)
			default:
				more = false
			}
		}
		i.mu.Lock()
		o := i.opts
		i.mu.Unlock()
		i.reload(ctx, o)
		for _, w := range waiting {
			close(w)
		}
		waiting = waiting[:0]
	}
}

// Shutdown stops accepting clients and drains the sessions for up to
// timeout, then closes what is left.
func (i *instance) Shutdown(timeout time.Duration) error {
	i.stop()
	i.closeListeners()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := i.proxy.Shutdown(ctx)
	if i.http != nil {
		hctx, hcancel := context.WithTimeout(context.Background(), time.Second)
		defer hcancel()
		i.http.Shutdown(hctx)
	}
	<-i.served
	return err
}

// Addr is where clients connect.
func (i *instance) Addr() string { return i.ln.Addr().String() }

// closeListeners stops accepting clients (a Unix socket's file is removed
// with its listener).
func (i *instance) closeListeners() {
	i.ln.Close()
	if i.unixLn != nil {
		i.unixLn.Close()
	}
}

// MetricsAddr is where /metrics is served ("" when disabled).
func (i *instance) MetricsAddr() string {
	if i.httpLn == nil {
		return ""
	}
	return i.httpLn.Addr().String()
}

// Close stops accepting and ends every session.
func (i *instance) Close() error {
	i.stop()
	i.closeListeners()
	err := i.proxy.Close()
	if i.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		i.http.Shutdown(ctx)
	}
	<-i.served
	return err
}
