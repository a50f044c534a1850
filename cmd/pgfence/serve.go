package main

import (
	"cmp"
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
	"slices"
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

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/internal/cores"
	"github.com/pgfence/pgfence/internal/pgversion"
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
	eventLoops       int
	coreGovernor     bool
	forwardTokenSets bool
	upstreamPooling  string
	drainTimeout     time.Duration
	staleLogInterval time.Duration
	tlsCert          string
	tlsKey           string
	clientTLS        string
	initDomains      bool
	backstop         string
	exemptRoles      []string
	pooledRoles      []string
	excludeDatabases []string
	// readyWithoutBackstop has /readyz answer 200 while a guarded table
	// lacks its backstop.
	readyWithoutBackstop bool
	logLevel             string
	logFormat            string
}

func (o *serveOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "YAML file with the same keys as these flags (flags win)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:6432", "address clients connect to: host:port, or the absolute path of a Unix socket (e.g. /run/pgfence/.s.PGSQL.6432, which clients reach with host=/run/pgfence port=6432)")
	f.StringVar(&o.unixSocketDir, "unix-socket-dir", "", "also listen on a Unix socket in this directory, named as Postgres names its own (.s.PGSQL.<--listen's port>), so that clients connect with host=DIR")
	f.StringVar(&o.upstream, "upstream", "", "postgres:// URL of the real server; its user and password serve only pgfence's own queries")
	f.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:"+defaultMetricsPort, "address of /metrics, /healthz and /readyz (\"\" to disable)")
	o.policyOptions.addFlags(cmd)
	f.BoolVar(&o.discover, "discover", true, "guard every table that has a bigint --discover-column, in each database clients use (partitions and children of guarded tables are always guarded)")
	f.StringVar(&o.discoverColumn, "discover-column", "fence_epoch", "epoch column name that discovery looks for")
	f.DurationVar(&o.discoverInterval, "discover-interval", time.Minute, "how often each database's catalog is read again (also on SIGHUP); 0 for only at its first session and on SIGHUP")
	f.BoolVar(&o.readyWithoutBackstop, "ready-without-backstop", false, "let /readyz answer 200 while a guarded table lacks its database backstop (by default it answers 503: writes pgfence cannot see in the SQL text would not be fenced there)")
	f.StringArrayVar(&o.excludeDatabases, "exclude-database", nil, "a database pgfence does not fence: its sessions are refused, saying so (repeatable; not the --upstream database). Every other database is fenced by its own catalog from its first session")
	f.IntVar(&o.maxMessageSize, "max-message-size", 256<<20, "largest client message in bytes; a larger one ends that client's session")
	f.DurationVar(&o.startupTimeout, "startup-timeout", 30*time.Second, "how long a new client may take to send its startup packet")
	f.IntVar(&o.maxClientConns, "max-client-conns", 1000, "client connections open at once, counted from accept (sessions, and connections in startup or bringing a cancel request); more are refused at once with SQLSTATE 53300 (0: no limit)")
	f.IntVar(&o.eventLoops, "event-loops", 0, "event loops relaying the sessions, each on a core of its own at most; each new session goes to the loop holding the fewest (0: one per usable core, GOMAXPROCS)")
	f.BoolVar(&o.coreGovernor, "core-governor", true, "size the Go runtime's Ps (threads running pgfence's code at once) to the load, from one up to the usable cores (GOMAXPROCS), so that the event loops share a core while one is enough; false keeps a P for every usable core")
	f.BoolVar(&o.forwardTokenSets, "forward-token-sets", false, "send every SET of the fencing token to Postgres as the client sent it; by default pgfence answers a plain one at once and sets the token ahead of the next statement, in the same transaction when that is a fenced write (saves a round trip per transaction)")
	f.StringVar(&o.upstreamPooling, "upstream-pooling", "none", "what stands at --upstream: none (Postgres itself; pgfence checks, and refuses clients if a pooler answers), session (a pooler that gives each session a server connection of its own, such as PgBouncer with pool_mode = session), or transaction (a pooler that shares server connections between transactions, such as PgBouncer with pool_mode = transaction: pgfence then sets the token in each transaction and leaves nothing on the server connection)")
	f.BoolVar(&o.initDomains, "init-domains", true, "create the lock-domain table (pgfence.domains) and its rows when missing; false for teams that forbid runtime DDL (run 'pgfence init' instead)")
	f.StringVar(&o.backstop, "backstop", "install", "the database backstop: triggers on every guarded table that enforce the fence inside Postgres, for writes pgfence cannot see (views, functions, cascades, direct connections): install (and keep it installed), verify (only check and report; install it with 'pgfence init'), or off")
	f.StringArrayVar(&o.exemptRoles, "backstop-exempt-role", nil, "a role whose writes the backstop lets through unfenced (migrations), counted and logged in the server log (repeatable)")
	f.StringArrayVar(&o.pooledRoles, "backstop-pooled-role", nil, "a login role that reaches Postgres only through pgfence behind a transaction pooler (the pooler's user for its server connections): the backstop counts its sessions' fencing token only in a transaction pgfence set it in, so that a token one client left on a shared server connection (in a function) never fences another's write (repeatable)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate (chain) for client TLS; with --tls-key, pgfence accepts sslmode=require/verify-full clients and terminates their TLS")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key for --tls-cert")
	f.StringVar(&o.clientTLS, "client-tls", clientTLSAllow, "allow (clients may use TLS, with --tls-cert, or plain text) or require (a client that does not use TLS is refused with SQLSTATE 28000; needs --tls-cert; cancel requests and Unix-socket clients are exempt)")
	f.DurationVar(&o.drainTimeout, "drain-timeout", defaultDrainTimeout, "on SIGTERM, how long open transactions may go on before their sessions are closed; the runtime must give pgfence this plus 5s before it kills it (podman's and docker's stop timeout, 10s by default; Kubernetes' terminationGracePeriodSeconds)")
	f.DurationVar(&o.staleLogInterval, "stale-log-interval", time.Second, "least time between two log lines of stale writes to one table (of one kind, path and mode): the first gets a line at once, then at most one per interval, which says how many it stands for (unlogged=N); the metrics count every one; 0 logs every stale write")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
}

// defaultMetricsPort is --metrics-listen's port. Not 9187, which is
// postgres_exporter's, nor any other port of Postgres's usual neighbours
// (exporters, poolers, Patroni, etcd, backup servers: docs/operations.md
// lists them); outside Prometheus's exporter range 9100-9999, all of which
// is allocated, and outside Linux's ephemeral range (32768-60999), where a
// client's source port could take it. It ends as pgfence's client port,
// 6432, does.
const defaultMetricsPort = "16432"

// defaultDrainTimeout is --drain-timeout's default: what is left of
// podman's and docker's default stop timeout (10 s, which podman-compose
// and a plain `podman stop` give) once pgfence has taken up to 5 s to
// close: writing out its log lines (2 s at most), stopping its HTTP
// server (1 s), and a margin. A longer drain is cut short by SIGKILL
// there, and the open transactions with it, unannounced.
const defaultDrainTimeout = 5 * time.Second

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
			inst.announce()
			reloads := startReloader(func(fresh serveOptions) { inst.reload(cmd.Context(), fresh) })
			defer reloads.stop()
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
					if fresh.upstream != o.upstream || fresh.listen != o.listen || fresh.metricsListen != o.metricsListen || fresh.eventLoops != o.eventLoops || fresh.coreGovernor != o.coreGovernor {
						log.Warn("SIGHUP: --upstream, --listen, --metrics-listen, --event-loops and --core-governor take effect only after a restart")
					}
					if fresh.clientTLS != o.clientTLS {
						log.Warn("SIGHUP: --client-tls takes effect only after a restart: clients are still held to the one pgfence started with", "client_tls", o.clientTLS)
					}
					warnShrunk(log, inst.options(), fresh)
					reloads.request(fresh)
				}
			}
		},
	}
	o.addFlags(cmd)
	return cmd
}

// reloader runs reloads one at a time on a goroutine of its own, so that a
// slow one (a database whose catalog read waits on a lock: each database
// is read in turn) never keeps the signal loop from a SIGTERM (red team
// 7b: a drain began 10-17 s late). Requests that come while one runs are
// folded into one more, with the newest options.
type reloader struct {
	next chan serveOptions
	done chan struct{} // closed once the goroutine has ended
}

func startReloader(run func(serveOptions)) *reloader {
	r := &reloader{next: make(chan serveOptions, 1), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for o := range r.next {
			run(o)
		}
	}()
	return r
}

// request asks for a reload with o, replacing one asked for before that
// has not started. Only the signal loop calls it, so the send after the
// drain never waits.
func (r *reloader) request(o serveOptions) {
	select {
	case <-r.next:
	default:
	}
	r.next <- o
}

// stop ends the goroutine once a reload under way, if any, is done; it
// does not wait for that.
func (r *reloader) stop() { close(r.next) }

// warnShrunk warns when a reload from was to guards less than before: a
// --guard it no longer names, or discovery turned off or pointed at
// another column. Such a change may be meant, but one a half-written file
// made would unguard tables silently (with --backstop off, unfenced).
func warnShrunk(log *slog.Logger, was, now serveOptions) {
	var gone []string
	for _, g := range was.guards {
		if !slices.Contains(now.guards, g) {
			gone = append(gone, g)
		}
	}
	if len(gone) > 0 {
		log.Warn("SIGHUP: the new configuration no longer names guarded tables the old one did: their writes are no longer fenced by --guard", "no_longer_guarded", strings.Join(gone, ","))
	}
	if was.discover && (!now.discover || now.discoverColumn != was.discoverColumn) {
		log.Warn("SIGHUP: the new configuration turns discovery off or looks for another epoch column: tables discovery guarded are no longer fenced unless named otherwise", "discover", now.discover, "discover_column", now.discoverColumn)
	}
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
	ctx         context.Context // ends with stop: reads of the catalog stop
	stop        context.CancelFunc

	mu   sync.Mutex // guards opts
	opts serveOptions
	// main is the --upstream URL's database; dbs has it and every other
	// database a session has connected to since, while its catalog reads.
	main *database
	dbMu sync.Mutex
	dbs  map[string]*database
	// failedReads is why the last first read of a database failed, by
	// name, until one works: what its sessions' statements are told.
	failedReads sync.Map
	// paces paces the first reads of databases other than the main one
	// while pgfence's login to them is refused, by name, under dbMu (see
	// instance.database); a database's goes once a read of it works.
	paces map[string]*upstream.Backoff
	// router fences each session with its database's policy.
	router *fence.Databases
	// exclude is --exclude-database, as last loaded.
	exclude atomic.Pointer[map[string]bool]
	// admissionWait bounds a session's wait for its database's first read.
	admissionWait time.Duration
	// discoverEvery is --discover-interval as at start: every database is
	// read that often (a reload does not change it).
	discoverEvery time.Duration
	// pooler, when set, is why client sessions are refused: a pooler
	// nobody told pgfence of answers at the upstream (see checkPooler).
	pooler atomic.Pointer[string]
	// resetsChecked is set once checkResets has asked a transaction
	// pooler whether it resets server connections.
	resetsChecked atomic.Bool
	// verdict is readiness's last verdict on the upstream.
	verdict verdictCache
	// hosts are --upstream's hosts; with more than one, sessions go to
	// the writable primary among them (see followPrimary).
	hosts []upstream.Host
	// announced is set once serve has logged its start-up line, and
	// servingLogged once it has said "pgfence serving" (see serving).
	announced, servingLogged atomic.Bool

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

// --client-tls's values.
const (
	clientTLSAllow   = "allow"
	clientTLSRequire = "require"
)

// requireClientTLS reads --client-tls: whether clients must use TLS, which
// needs a certificate to offer them.
func requireClientTLS(mode string, serverTLS *tls.Config) (bool, error) {
	switch mode {
	case clientTLSAllow, "": // "": an embedder's or a test's serveOptions
		return false, nil
	case clientTLSRequire:
		if serverTLS == nil {
			return false, errors.New("--client-tls=require needs --tls-cert and --tls-key: pgfence cannot require TLS of clients without a certificate to offer them")
		}
		return true, nil
	}
	return false, fmt.Errorf("--client-tls %q: want allow or require", mode)
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
	requireTLS, err := requireClientTLS(o.clientTLS, serverTLS)
	if err != nil {
		return nil, err
	}
	cfg, _, err := o.policyConfig()
	if err != nil {
		return nil, err
	}
	_, backstopOn, err := backstopMode(o.backstop)
	if err != nil {
		return nil, err
	}
	if o.eventLoops < 0 {
		return nil, fmt.Errorf("--event-loops %d: want 0 (one per usable core) or more", o.eventLoops)
	}
	txPool, err := o.transactionPooling()
	if err != nil {
		return nil, err
	}
	if serverTLS != nil && !requireTLS && up.TLS != nil {
		log.Warn("plaintext clients are accepted (--client-tls=allow) while pgfence reaches Postgres over TLS where it can (the --upstream URL's sslmode): Postgres's hostssl rules then see pgfence's connection, not the client's; set --client-tls=require to refuse plaintext clients")
	}
	if txPool && backstopOn && len(o.pooledRoles) == 0 {
		log.Warn("behind a transaction pooler without --backstop-pooled-role: a fencing token one client leaves on a shared server connection (set in a function) fences the next client's writes that pgfence cannot see in the text; name the pooler's login role with --backstop-pooled-role (and run pgfence init with it)")
	}
	mainDB, err := upstreamDatabase(o.upstream)
	if err != nil {
		return nil, err
	}
	exclude, err := exclusions(o, mainDB)
	if err != nil {
		return nil, err
	}
	var inst *instance // for Admit and Route, which run only once sessions do
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfo())
	built, err := server.New(server.Config{Route: &fence.Routes{
		Policy: func(c *proxy.Client) *fence.Policy { return inst.route(c) },
		Await:  func(c *proxy.Client) <-chan struct{} { return inst.awaitFirstRead(c) },
		Why:    func(c *proxy.Client) string { return inst.whyNoPolicy(c) },
	}, Logger: log, Registry: reg, Proxy: proxy.Config{
		Upstream:            addr,
		UpstreamNetwork:     up.Network,
		UpstreamTLS:         up.TLS,
		UpstreamTLSRequired: up.TLSRequired,
		RequirePrimary:      ups.RequirePrimary,
		TLS:                 serverTLS,
		RequireClientTLS:    requireTLS,
		MaxMessageSize:      o.maxMessageSize,
		StartupTimeout:      o.startupTimeout,
		MaxClientConns:      o.maxClientConns,
		EventLoops:          cmp.Or(o.eventLoops, cores.Usable()),
		ForwardSettings:     o.forwardTokenSets,
		TransactionPooling:  txPool,
		TokenSetting:        cfg.TokenSetting,
		Admit:               func(c *proxy.Client) error { return inst.admit(c) },
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
	srv, metrics := built.Server, built.Metrics
	main := newDatabase(mainDB, true, log)
	if len(ups.List) == 1 {
		main.retry = ups.List[0].Logins()
	}
	// The main database's series exist from start-up, and its policy
	// fences its sessions with the explicit guards until a read works
	// (which admit waits for).
	main.metrics = metrics.Database(mainDB)
	policy, err := built.Databases.New(mainDB, cfg, main.log)
	if err != nil {
		return nil, err
	}
	main.policy.Store(policy)
	policy.SetDDLHook(main.readAfterDDL)
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
		log: log, metrics: metrics, proxy: srv, ln: ln,
		served: make(chan struct{}), ctx: ctx, stop: cancel,
		opts: o, main: main, dbs: map[string]*database{mainDB: main}, paces: map[string]*upstream.Backoff{}, router: built.Databases,
		admissionWait: admissionWait(o.startupTimeout), discoverEvery: o.discoverInterval,
	}
	inst.exclude.Store(&exclude)
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
			if ok && !inst.main.known.Load() {
				ok, what = false, "pgfence has not read the catalog yet"
			}
			if ok {
				if gap := inst.backstopGap(); gap != "" {
					ok, what = false, gap+" (--ready-without-backstop serves anyway)"
				}
			}
			if u := inst.unfenceable(); ok && u != "" {
				ok, what = false, u
			}
			if !ok {
				http.Error(w, "not ready: "+what+"\n"+inst.statusLines(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, "ready: %s\n%s", what, inst.statusLines())
		})
		inst.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go inst.http.Serve(inst.httpLn)
	}
	inst.hosts = ups.List
	reg.MustRegister(newUpstreamCollector(inst))
	if len(inst.hosts) > 1 {
		inst.followPrimary(ctx, time.Second)
	}
	// The main database's catalog is read before clients are served, so
	// discovered tables are guarded from the first statement when Postgres
	// is up. Each other database's is read at its first session.
	main.load(ctx, inst)
	inst.unixLn = unixLn
	// A server pgfence does not support is refused at start, naming its
	// version (one that cannot be reached yet is read later, and refused
	// the same way at each read: no session is served meanwhile).
	if err := main.lastErr.Load(); err != nil && pgversion.IsUnsupported(*err) {
		close(inst.served) // nothing was served
		inst.Close()
		return nil, *err
	}
	if unixLn != nil {
		go srv.Serve(unixLn)
	}
	go func() { srv.Serve(ln); close(inst.served) }()
	go main.run(ctx, inst, inst.discoverEvery)
	if o.coreGovernor {
		go cores.Run(ctx, cores.Options{})
	}
	return inst, nil
}

// announce logs the start-up line: "pgfence serving" when the --upstream
// database's catalog is read, else that clients are refused until it is
// (and "pgfence serving" once a read works): never "serving" while every
// client is refused.
func (i *instance) announce() {
	i.announced.Store(true)
	if !i.main.known.Load() {
		i.log.Warn("pgfence started, but refuses clients until it has read the catalog of the --upstream database, as it cannot tell which tables to fence before: see the error above; it tries again, waiting longer each time",
			"listen", i.Addr(), "upstream", i.upstream, "database", i.main.name, "metrics", i.MetricsAddr(), "version", buildVersion())
	}
	i.serving()
}

// serving logs "pgfence serving", once, when serve has announced itself
// and the --upstream database's catalog has been read. Both announce and
// the read that works call it, each after setting what it sets, so that
// whichever comes last logs it.
func (i *instance) serving() {
	if !i.announced.Load() || !i.main.known.Load() || !i.servingLogged.CompareAndSwap(false, true) {
		return
	}
	guards := 0
	if p := i.main.policy.Load(); p != nil {
		guards = len(p.Config().Guards)
	}
	i.log.Info("pgfence serving", "listen", i.Addr(), "upstream", i.upstream, "database", i.main.name, "metrics", i.MetricsAddr(),
		"guards", guards, "token_setting", i.options().tokenSetting, "version", buildVersion())
}

// options are the options in force.
func (i *instance) options() serveOptions {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.opts
}

// reload puts o in force and reads the catalog of every database again
// (one after the other) with it. Options that do not hold together are
// not put in force.
func (i *instance) reload(ctx context.Context, o serveOptions) {
	i.verdict.forget()
	if _, _, err := o.policyConfig(); err != nil {
		i.log.Error("configuration not reloaded", "err", err)
		return
	}
	if _, _, err := backstopMode(o.backstop); err != nil {
		i.log.Error("configuration not reloaded", "err", err)
		return
	}
	exclude, err := exclusions(o, i.main.name)
	if err != nil {
		i.log.Error("configuration not reloaded", "err", err)
		return
	}
	i.mu.Lock()
	i.opts = o
	i.mu.Unlock()
	i.exclude.Store(&exclude)
	// A reload is when an operator has changed something: a database whose
	// reads were refused is read again at its next session.
	i.dbMu.Lock()
	for _, b := range i.paces {
		b.Succeeded()
	}
	i.dbMu.Unlock()
	for _, d := range i.databases() {
		if d.main || d.known.Load() {
			d.load(ctx, i)
		}
	}
}

// readCatalog reads the catalog of database db (see catalog.Read), on a
// connection of its own with the --upstream URL's settings.
func (i *instance) readCatalog(ctx context.Context, db string, o serveOptions, explicit []sqlrewrite.Guard, apply func(sqlrewrite.Guard) sqlrewrite.Guard) (*catalog.Found, error) {
	co, err := o.catalogOptions()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connectUpstream(ctx, i.upstreamURL, db, o.upstreamPooling)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if err := i.checkPooler(ctx, conn, o.upstreamPooling); err != nil {
		return nil, err
	}
	if o.upstreamPooling == poolingTransaction {
		i.checkResets(ctx, conn)
	}
	return catalog.Read(ctx, conn, co, explicit, apply)
}

// catalogOptions are the flags that say what a read of the catalog does.
func (o serveOptions) catalogOptions() (catalog.Options, error) {
	mode, on, err := backstopMode(o.backstop)
	if err != nil {
		return catalog.Options{}, err
	}
	return catalog.Options{
		Discover: o.discover, DiscoverColumn: o.discoverColumn, InitDomains: o.initDomains,
		Backstop: on, BackstopMode: mode, ExemptRoles: o.exemptRoles, PooledRoles: o.pooledRoles,
		TokenSetting: o.tokenSetting, AllowTruncate: o.allowTruncate,
	}, nil
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
