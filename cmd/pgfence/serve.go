package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// serveOptions are the flags of 'pgfence serve' (and keys of its YAML file).
type serveOptions struct {
	configFile     string
	listen         string
	upstream       string
	metricsListen  string
	guards         []string
	tokenSetting   string
	maxMessageSize int
	startupTimeout time.Duration
	logLevel       string
	logFormat      string
}

func (o *serveOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "YAML file with the same keys as these flags (flags win)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:6432", "address clients connect to")
	f.StringVar(&o.upstream, "upstream", "", "postgres:// URL of the real server; its user and password serve only pgfence's own queries")
	f.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9187", "address of /metrics and /healthz (\"\" to disable)")
	f.StringArrayVar(&o.guards, "guard", nil, "guarded table as TABLE[:COLUMN] or SCHEMA.TABLE[:COLUMN] (repeatable; COLUMN defaults to fence_epoch)")
	f.StringVar(&o.tokenSetting, "token-setting", "fence.token", "session setting that holds the fencing token")
	f.IntVar(&o.maxMessageSize, "max-message-size", 256<<20, "largest client message in bytes; a larger one ends that client's session")
	f.DurationVar(&o.startupTimeout, "startup-timeout", 30*time.Second, "how long a new client may take to send its startup packet")
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
			if err := loadConfigFile(cmd, o.configFile); err != nil {
				return err
			}
			log, err := newLogger(o.logLevel, o.logFormat)
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
				"guards", strings.Join(o.guards, ","), "token_setting", o.tokenSetting, "version", version)
			<-cmd.Context().Done()
			log.Info("shutting down")
			return inst.Close()
		},
	}
	o.addFlags(cmd)
	return cmd
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// instance is a running proxy with its metrics endpoint.
type instance struct {
	upstream string // host:port or socket path, never with credentials
	policy   *fence.Policy
	proxy    *proxy.Server
	ln       net.Listener
	httpLn   net.Listener
	http     *http.Server
	done     chan error
}

// upstreamAddr finds where to dial from a postgres:// URL (or key=value
// string).
func upstreamAddr(url string) (network, addr string, err error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return "", "", fmt.Errorf("--upstream: %w", err)
	}
	port := strconv.Itoa(int(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		return "unix", filepath.Join(cfg.Host, ".s.PGSQL."+port), nil
	}
	return "tcp", net.JoinHostPort(cfg.Host, port), nil
}

func parseGuards(specs []string) ([]sqlrewrite.Guard, error) {
	var out []sqlrewrite.Guard
	for _, spec := range specs {
		for _, s := range strings.Split(spec, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			g, err := sqlrewrite.ParseGuard(s)
			if err != nil {
				return nil, fmt.Errorf("--guard: %w", err)
			}
			out = append(out, g)
		}
	}
	return out, nil
}

// start builds and starts the proxy and its metrics endpoint.
func start(o serveOptions, log *slog.Logger) (*instance, error) {
	network, addr, err := upstreamAddr(o.upstream)
	if err != nil {
		return nil, err
	}
	guards, err := parseGuards(o.guards)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	policy, err := fence.New(fence.Config{Guards: guards, TokenSetting: o.tokenSetting}, fence.NewMetrics(reg), log)
	if err != nil {
		return nil, err
	}
	srv, err := proxy.New(proxy.Config{
		Upstream:        addr,
		UpstreamNetwork: network,
		Interceptor:     policy,
		Logger:          log,
		MaxMessageSize:  o.maxMessageSize,
		StartupTimeout:  o.startupTimeout,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	inst := &instance{upstream: addr, policy: policy, proxy: srv, ln: ln, done: make(chan error, 1)}
	if o.metricsListen != "" {
		if inst.httpLn, err = net.Listen("tcp", o.metricsListen); err != nil {
			ln.Close()
			return nil, fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			if err := srv.CheckUpstream(r.Context()); err != nil {
				http.Error(w, fmt.Sprintf("proxy up; Postgres at %s unreachable: %v\n", addr, err), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, "ok: proxy up, Postgres at %s reachable\n", addr)
		})
		inst.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go inst.http.Serve(inst.httpLn)
	}
	go func() { inst.done <- srv.Serve(ln) }()
	return inst, nil
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
	i.ln.Close()
	err := i.proxy.Close()
	if i.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		i.http.Shutdown(ctx)
	}
	<-i.done
	return err
}
