package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/server"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
	"github.com/pgfence/pgfence/upstream"
)

// pgfence is pgfence serving in this process (the proxy and fence
// packages, as `pgfence serve` wires them), restartable on the same
// address. With several upstream hosts it follows the writable primary
// among them, as serve does.
type pgfence struct {
	hosts      upstream.Hosts
	guard      sqlrewrite.Guard
	log        *slog.Logger
	stopFollow context.CancelFunc

	mu       sync.Mutex
	up       proxy.Upstream // where sessions go: the primary last found
	addr     string
	ln       net.Listener
	srv      *proxy.Server
	served   chan struct{}
	registry []*prometheus.Registry // one per start, for the reject count
}

// startPgfence starts pgfence in front of upstreamURL (one host or
// several), guarding table.
func startPgfence(upstreamURL, table string, logw io.Writer) (*pgfence, error) {
	g, err := sqlrewrite.ParseGuard(table)
	if err != nil {
		return nil, err
	}
	hosts, err := upstream.Parse(upstreamURL)
	if err != nil {
		return nil, err
	}
	p := &pgfence{
		hosts: hosts,
		guard: g,
		log:   slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelInfo})),
		addr:  "127.0.0.1:0",
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	if len(hosts.List) > 1 {
		ctx, cancel := context.WithCancel(context.Background())
		p.stopFollow = cancel
		go upstream.Follow(ctx, hosts.List, 500*time.Millisecond, "", func(h upstream.Host) {
			p.mu.Lock()
			p.up = h.Upstream
			if p.srv != nil {
				p.srv.SetUpstream(h.Upstream)
			}
			p.mu.Unlock()
		})
	}
	return p, nil
}

func (p *pgfence) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up.Addr == "" {
		p.up = p.hosts.List[0].Upstream
	}
	built, err := server.New(server.Config{Logger: p.log,
		Fence: fence.Config{Guards: []sqlrewrite.Guard{p.guard}, TokenSetting: "fence.token"},
		Proxy: proxy.Config{Upstream: p.up.Addr, UpstreamNetwork: p.up.Network, RequirePrimary: p.hosts.RequirePrimary}})
	if err != nil {
		return err
	}
	srv, reg := built.Server, built.Registry
	// On a restart the address is the one clients know; the port was just
	// released by our own listener, so retry briefly.
	var ln net.Listener
	for i := 0; ; i++ {
		ln, err = net.Listen("tcp", p.addr)
		if err == nil {
			break
		}
		if i == 50 {
			return fmt.Errorf("pgfence: listen %s: %w", p.addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.addr = ln.Addr().String()
	p.ln, p.srv, p.served = ln, srv, make(chan struct{})
	p.registry = append(p.registry, reg)
	go func(done chan struct{}) {
		srv.Serve(ln)
		close(done)
	}(p.served)
	return nil
}

// stop drains like SIGTERM: stop accepting, end idle sessions, give the
// rest up to drain, then close them.
func (p *pgfence) stop(drain time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return
	}
	p.ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	p.srv.Shutdown(ctx)
	cancel()
	p.srv.Close()
	<-p.served
	p.ln = nil
}

// close stops pgfence for good, and its following of the primary.
func (p *pgfence) close(drain time.Duration) {
	if p.stopFollow != nil {
		p.stopFollow()
	}
	p.stop(drain)
}

// restart stops pgfence, leaves it down for down, and starts it again on
// the same address.
func (p *pgfence) restart(down time.Duration) error {
	p.stop(500 * time.Millisecond)
	time.Sleep(down)
	return p.start()
}

func (p *pgfence) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// rejects sums fencing_reject_total over every start.
func (p *pgfence) rejects() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum float64
	for _, reg := range p.registry {
		mfs, err := reg.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() != "fencing_reject_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
