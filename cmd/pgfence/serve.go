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
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// serveOptions are the flags of 'pgfence serve' (and keys of its YAML file).
type serveOptions struct {
	policyOptions
	configFile       string
	listen           string
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
	drainTimeout     time.Duration
	tlsCert          string
	tlsKey           string
	initDomains      bool
	logLevel         string
	logFormat        string
}

func (o *serveOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "YAML file with the same keys as these flags (flags win)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:6432", "address clients connect to")
	f.StringVar(&o.upstream, "upstream", "", "postgres:// URL of the real server; its user and password serve only pgfence's own queries")
	f.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9187", "address of /metrics and /healthz (\"\" to disable)")
	o.policyOptions.addFlags(cmd)
	f.BoolVar(&o.discover, "discover", true, "guard every table of the upstream database that has a bigint --discover-column (partitions and children of guarded tables are always guarded)")
	f.StringVar(&o.discoverColumn, "discover-column", "fence_epoch", "epoch column name that discovery looks for")
	f.DurationVar(&o.discoverInterval, "discover-interval", time.Minute, "how often the catalog is read again (also on SIGHUP); 0 for only at start and on SIGHUP")
	f.IntVar(&o.maxMessageSize, "max-message-size", 256<<20, "largest client message in bytes; a larger one ends that client's session")
	f.DurationVar(&o.startupTimeout, "startup-timeout", 30*time.Second, "how long a new client may take to send its startup packet")
	f.IntVar(&o.maxClientConns, "max-client-conns", 1000, "client sessions open at once; more are refused with SQLSTATE 53300 (0: no limit)")
	f.BoolVar(&o.goroutineRelay, "goroutine-relay", false, "relay every session with goroutines of its own instead of the event loop (slower; the event loop is Linux-only)")
	f.BoolVar(&o.forwardTokenSets, "forward-token-sets", false, "send every SET of the fencing token to Postgres as the client sent it; by default pgfence answers a plain one at once and sets the token ahead of the next statement, in the same transaction when that is a fenced write (saves a round trip per transaction)")
	f.BoolVar(&o.initDomains, "init-domains", true, "create the lock-domain table (pgfence.domains) and its rows when missing; false for teams that forbid runtime DDL (run 'pgfence init' instead)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate (chain) for client TLS; with --tls-key, pgfence accepts sslmode=require/verify-full clients and terminates their TLS")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key for --tls-cert")
	f.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long open transactions may go on before their sessions are closed")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
}

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
			log.Info("pgfence serving", "listen", inst.Addr(), "upstream", inst.upstream, "metrics", inst.MetricsAddr(),
				"guards", len(inst.policy.Config().Guards), "token_setting", o.tokenSetting, "version", version)
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

// rereadOptions builds serve's options again from the command line and the
// config file as it is now.
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

	mu   sync.Mutex // serialises reloads
	opts serveOptions

	policy *fence.Policy
	proxy  *proxy.Server
	ln     net.Listener
	httpLn net.Listener
	http   *http.Server
	served chan struct{} // closed when Serve returns
}

// upstream is where and how pgfence reaches Postgres.
type upstream struct {
	network, addr string
	tls           *tls.Config // nil: plain
	tlsRequired   bool        // sslmode require/verify-*: no plain-text fallback
}

// parseUpstream reads a postgres:// URL (or key=value string), with
// sslmode, sslrootcert and friends meaning what they mean to libpq.
func parseUpstream(url string) (upstream, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return upstream{}, fmt.Errorf("--upstream: %w", err)
	}
	port := strconv.Itoa(int(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		return upstream{network: "unix", addr: filepath.Join(cfg.Host, ".s.PGSQL."+port)}, nil
	}
	u := upstream{network: "tcp", addr: net.JoinHostPort(cfg.Host, port), tls: cfg.TLSConfig, tlsRequired: cfg.TLSConfig != nil}
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig == nil {
			u.tlsRequired = false // sslmode=prefer or allow
		}
	}
	return u, nil
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
	up, err := parseUpstream(o.upstream)
	if err != nil {
		return nil, err
	}
	addr := up.addr
	serverTLS, err := clientTLS(o.tlsCert, o.tlsKey)
	if err != nil {
		return nil, err
	}
	cfg, _, err := o.policyOptions.config()
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := fence.NewMetrics(reg)
	policy, err := fence.New(cfg, metrics, log)
	if err != nil {
		return nil, err
	}
	srv, err := proxy.New(proxy.Config{
		Upstream:            addr,
		UpstreamNetwork:     up.network,
		UpstreamTLS:         up.tls,
		UpstreamTLSRequired: up.tlsRequired,
		TLS:                 serverTLS,
		Interceptor:         policy,
		Logger:              log,
		MaxMessageSize:      o.maxMessageSize,
		StartupTimeout:      o.startupTimeout,
		MaxClientConns:      o.maxClientConns,
		GoroutineRelay:      o.goroutineRelay,
		ForwardSettings:     o.forwardTokenSets,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst := &instance{
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
		// (restarting a sidecar because Postgres is down helps nobody).
		// /readyz is readiness: Postgres accepts connections.
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			if err := srv.CheckUpstream(r.Context()); err != nil {
				fmt.Fprintf(w, "ok: proxy up; Postgres at %s unreachable: %v\n", addr, err)
				return
			}
			fmt.Fprintf(w, "ok: proxy up; Postgres at %s reachable\n", addr)
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			if err := srv.CheckUpstream(r.Context()); err != nil {
				http.Error(w, fmt.Sprintf("not ready: Postgres at %s unreachable: %v\n", addr, err), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, "ready: Postgres at %s reachable\n", addr)
		})
		inst.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go inst.http.Serve(inst.httpLn)
	}
	// The catalog is read before clients are served, so discovered tables
	// are guarded from the first statement when Postgres is up.
	inst.reload(ctx, o)
	go func() { srv.Serve(ln); close(inst.served) }()
	if o.discoverInterval > 0 {
		go inst.rediscoverEvery(ctx, o.discoverInterval)
	}
	return inst, nil
}

// reload applies o's policy, extended with what the catalog says.
func (i *instance) reload(ctx context.Context, o serveOptions) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.opts = o
	cfg, apply, err := o.policyOptions.config()
	if err != nil {
		i.log.Error("configuration not reloaded", "err", err)
		return
	}
	if d, err := i.readCatalog(ctx, o, cfg.Guards, apply); err != nil {
		i.metrics.DiscoveryOK(false)
		i.log.Error("cannot read the catalog: tables found by discovery and partitions of guarded tables are not guarded until it works; retrying",
			"upstream", i.upstream, "err", err)
	} else {
		i.metrics.DiscoveryOK(true)
		for _, p := range d.Problems {
			i.log.Error("guarded table problem", "problem", p)
		}
		cfg.Guards = d.Guards
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

func (i *instance) readCatalog(ctx context.Context, o serveOptions, explicit []sqlrewrite.Guard, apply func(sqlrewrite.Guard) sqlrewrite.Guard) (*fence.Discovery, error) {
	if !o.discover && len(explicit) == 0 {
		return &fence.Discovery{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, i.upstreamURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	d, err := fence.Discover(ctx, conn, explicit, o.discover, o.discoverColumn, apply)
	if err != nil {
		return nil, err
	}
	if err := prepareDomains(ctx, conn, domainsOf(d.Guards), o.initDomains); err != nil {
		// Writes to a domain whose row is missing change nothing (fail
		// closed), so say loudly what to do.
		d.Problems = append(d.Problems, err.Error())
	}
	return d, nil
}

func domainsOf(guards []sqlrewrite.Guard) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range guards {
		if g.Domain != "" && !seen[g.Domain] {
			seen[g.Domain] = true
			out = append(out, g.Domain)
		}
	}
	return out
}

// prepareDomains makes sure the lock-domain table has a row per domain
// (creating the table too when create is set).
func prepareDomains(ctx context.Context, conn *pgx.Conn, domains []string, create bool) error {
	if len(domains) == 0 {
		return nil
	}
	if create {
		if _, err := conn.Exec(ctx, sqlrewrite.DomainTableDDL()); err != nil {
			return fmt.Errorf("cannot create %s (writes to lock domains change nothing until it exists; run 'pgfence init' as a role that may create it): %w", sqlrewrite.DomainTable, err)
		}
	}
	for _, d := range domains {
		if _, err := conn.Exec(ctx, sqlrewrite.DomainRowSQL(), d); err != nil {
			return fmt.Errorf("cannot add lock domain %q to %s (writes to it change nothing until its row exists; run 'pgfence init'): %w", d, sqlrewrite.DomainTable, err)
		}
	}
	return nil
}

func (i *instance) rediscoverEvery(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			i.mu.Lock()
			o := i.opts
			i.mu.Unlock()
			i.reload(ctx, o)
		}
	}
}

// Shutdown stops accepting clients and drains the sessions for up to
// timeout, then closes what is left.
func (i *instance) Shutdown(timeout time.Duration) error {
	i.stop()
	i.ln.Close()
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
	i.ln.Close()
	err := i.proxy.Close()
	if i.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		i.http.Shutdown(ctx)
	}
	<-i.served
	return err
}
