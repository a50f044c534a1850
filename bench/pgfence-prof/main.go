// Command pgfence-prof is a profiling build of `pgfence serve` for the
// benchmark: the same proxy and policy packages, wired the same way, plus
// net/http/pprof on the metrics address. It takes the subset of serve's
// flags the benchmark uses; everything else is serve's default.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/server"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

type guards []string

func (g *guards) String() string     { return strings.Join(*g, ",") }
func (g *guards) Set(s string) error { *g = append(*g, s); return nil }

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("pgfence-prof", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:6432", "")
	upstream := fs.String("upstream", "", "postgres:// URL")
	metricsListen := fs.String("metrics-listen", "127.0.0.1:9187", "/metrics, /healthz and /debug/pprof")
	maxConns := fs.Int("max-client-conns", 1000, "")
	fs.Bool("discover", false, "ignored: never discovers")
	fs.String("discover-interval", "", "ignored: never discovers")
	fs.String("backstop", "", "ignored: installs no backstop")
	loops := fs.Int("event-loops", 0, "event loops (0: one per core)")
	lockProfiles := fs.Bool("lock-profiles", false, "record every contended lock and every blocking event (/debug/pprof/mutex and /debug/pprof/block)")
	var gs guards
	fs.Var(&gs, "guard", "guarded table (repeatable)")
	fs.Parse(args)
	if *lockProfiles {
		runtime.SetMutexProfileFraction(1)
		runtime.SetBlockProfileRate(1)
	}
	if err := run(*listen, *upstream, *metricsListen, *maxConns, *loops, gs); err != nil {
		fmt.Fprintln(os.Stderr, "pgfence-prof:", err)
		os.Exit(1)
	}
}

func run(listen, upstream, metricsListen string, maxConns, loops int, specs []string) error {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return fmt.Errorf("--upstream %q: want a postgres:// URL", upstream)
	}
	var cfg fence.Config
	for _, s := range specs {
		for _, one := range strings.Split(s, ",") {
			g, err := sqlrewrite.ParseGuard(one)
			if err != nil {
				return err
			}
			cfg.Guards = append(cfg.Guards, g)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(server.Config{Fence: cfg, Logger: log, Registry: reg,
		Proxy: proxy.Config{Upstream: u.Host, MaxClientConns: maxConns, EventLoops: loops}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	mln, err := net.Listen("tcp", metricsListen)
	if err != nil {
		return err
	}
	http.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	http.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	go http.Serve(mln, nil) // DefaultServeMux: net/http/pprof registered there
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-stop; ln.Close(); srv.Close() }()
	log.Info("pgfence-prof serving", "listen", ln.Addr(), "upstream", u.Host, "guards", len(cfg.Guards))
	err = srv.Serve(ln)
	if err != nil && strings.Contains(err.Error(), "use of closed") {
		return nil
	}
	return err
}
