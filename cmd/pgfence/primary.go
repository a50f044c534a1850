package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/upstream"
)

// parseUpstream reads --upstream (see upstream.Parse).
func parseUpstream(s string) (upstream.Hosts, error) {
	h, err := upstream.Parse(s)
	if err != nil {
		return h, fmt.Errorf("--upstream: %w", err)
	}
	return h, nil
}

// followPrimary points the proxy at the writable primary among the
// --upstream hosts, now and then every interval until ctx ends.
func (i *instance) followPrimary(ctx context.Context, every time.Duration) {
	moved := func(h upstream.Host) { i.proxy.SetUpstream(h.Upstream) }
	if h, ok := upstream.FindPrimary(ctx, i.hosts); ok && h.Upstream.Addr != i.proxy.Upstream().Addr {
		moved(h) // before the first client
	}
	go upstream.Follow(ctx, i.hosts, every, i.proxy.Upstream().Addr, moved)
}

// readiness is /readyz's verdict on the upstream sessions now go to: ok
// only when it answers pgfence's role and is a writable primary.
func (i *instance) readiness(ctx context.Context) (bool, string) {
	up := i.proxy.Upstream()
	if err := i.proxy.CheckUpstream(ctx); err != nil {
		return false, fmt.Sprintf("Postgres at %s unreachable: %v", up.Addr, err)
	}
	for _, h := range i.hosts {
		if h.Upstream.Addr != up.Addr {
			continue
		}
		st, err := upstream.Check(ctx, h)
		switch {
		case err != nil:
			return false, fmt.Sprintf("Postgres at %s does not answer pgfence's role: %v", up.Addr, err)
		case st != upstream.Primary:
			return false, fmt.Sprintf("Postgres at %s is %s: writes would fail", up.Addr, st)
		}
		return true, fmt.Sprintf("Postgres at %s is %s", up.Addr, st)
	}
	return true, fmt.Sprintf("Postgres at %s reachable", up.Addr)
}
