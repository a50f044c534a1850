package main

import (
	"context"
	"fmt"
	"sync"
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
// only when it answers pgfence's role and is a writable primary. A verdict
// stands for a second, and one check runs at a time (see verdictCache).
func (i *instance) readiness(ctx context.Context) (bool, string) {
	up := i.proxy.Upstream()
	// The verdict is shared: a request that goes away must not make it
	// a failure for the others (each step has a timeout of its own).
	ctx = context.WithoutCancel(ctx)
	return i.verdict.get(time.Now(), up.Addr, func() (bool, string) { return i.checkUpstream(ctx, up.Addr) })
}

// checkUpstream logs in to the upstream at addr as pgfence's role and asks
// whether it is a writable primary.
func (i *instance) checkUpstream(ctx context.Context, addr string) (bool, string) {
	if err := i.proxy.CheckUpstream(ctx); err != nil {
		return false, fmt.Sprintf("Postgres at %s unreachable: %v", addr, err)
	}
	for _, h := range i.hosts {
		if h.Upstream.Addr != addr {
			continue
		}
		st, err := upstream.Check(ctx, h)
		switch {
		case err != nil:
			return false, fmt.Sprintf("Postgres at %s does not answer pgfence's role: %v", addr, err)
		case st != upstream.Primary:
			return false, fmt.Sprintf("Postgres at %s is %s: writes would fail", addr, st)
		}
		return true, fmt.Sprintf("Postgres at %s is %s", addr, st)
	}
	return true, fmt.Sprintf("Postgres at %s reachable", addr)
}

// verdictFor is how long a verdict on the upstream stands.
const verdictFor = time.Second

// verdictCache keeps the last verdict on the upstream for verdictFor and
// runs one check at a time: each check is a login to Postgres as
// pgfence's role, and /readyz and /metrics answer whoever asks, as often
// as they ask (red team 6b: 1,275 logins in 4 s). Callers that come while
// a check runs wait for it and take its verdict.
type verdictCache struct {
	mu   sync.Mutex
	at   time.Time // when the verdict was reached; zero for none
	addr string    // the upstream it is about
	ok   bool
	what string
}

// forget drops the verdict: the next asks again (a reload tries at once).
func (v *verdictCache) forget() {
	v.mu.Lock()
	v.at = time.Time{}
	v.mu.Unlock()
}

func (v *verdictCache) get(now time.Time, addr string, check func() (bool, string)) (bool, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.at.IsZero() && v.addr == addr && now.Sub(v.at) < verdictFor {
		return v.ok, v.what
	}
	v.ok, v.what = check()
	v.at, v.addr = time.Now(), addr
	return v.ok, v.what
}
