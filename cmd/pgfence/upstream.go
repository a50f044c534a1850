package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/proxy"
)

// upstreams is what --upstream says: one host or several, as libpq and
// pgx take them (host=a,b port=1,2, or postgres://a:1,b:2/db).
type upstreams struct {
	hosts []upstreamHost
	// requirePrimary is set by target_session_attrs=read-write (or
	// primary): pgfence connects sessions only to the host that is a
	// writable primary, and follows it when another takes over.
	requirePrimary bool
}

// upstreamHost is one host: where sessions connect, and the connection
// settings pgfence's own checks of it use.
type upstreamHost struct {
	up  proxy.Upstream
	cfg *pgconn.Config // this host only, no fallbacks, no validation
}

// parseUpstream reads a postgres:// URL (or key=value string), with
// sslmode, sslrootcert, target_session_attrs and friends meaning what they
// mean to libpq.
func parseUpstream(s string) (upstreams, error) {
	cfg, err := pgconn.ParseConfig(s)
	if err != nil {
		return upstreams{}, fmt.Errorf("--upstream: %w", err)
	}
	var u upstreams
	switch attrs := targetSessionAttrs(s); attrs {
	case "", "any":
	case "read-write", "primary":
		u.requirePrimary = true
	default:
		return upstreams{}, fmt.Errorf("--upstream: target_session_attrs=%s: pgfence fences writes, so it can only follow a writable primary (read-write or primary)", attrs)
	}
	// pgconn lists each host once per TLS attempt (sslmode=prefer tries
	// TLS, then plain): one upstream per address, TLS optional if any
	// attempt is plain.
	all := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	index := map[string]int{}
	for _, fb := range all {
		port := strconv.Itoa(int(fb.Port))
		h := upstreamHost{up: proxy.Upstream{Network: "tcp", Addr: net.JoinHostPort(fb.Host, port), TLS: fb.TLSConfig, TLSRequired: fb.TLSConfig != nil}}
		if strings.HasPrefix(fb.Host, "/") {
			h.up = proxy.Upstream{Network: "unix", Addr: filepath.Join(fb.Host, ".s.PGSQL."+port)}
		}
		if k, ok := index[h.up.Addr]; ok {
			if fb.TLSConfig == nil {
				u.hosts[k].up.TLSRequired = false // sslmode=prefer or allow
			} else if u.hosts[k].up.TLS == nil {
				u.hosts[k].up.TLS = fb.TLSConfig
			}
			continue
		}
		one := cfg.Copy()
		one.Host, one.Port, one.TLSConfig, one.Fallbacks, one.ValidateConnect = fb.Host, fb.Port, fb.TLSConfig, nil, nil
		h.cfg = one
		index[h.up.Addr] = len(u.hosts)
		u.hosts = append(u.hosts, h)
	}
	return u, nil
}

// targetSessionAttrs is the target_session_attrs s (a URL or key=value
// string) or PGTARGETSESSIONATTRS gives, lower case.
func targetSessionAttrs(s string) string {
	v := os.Getenv("PGTARGETSESSIONATTRS")
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		if u, err := url.Parse(s); err == nil && u.Query().Has("target_session_attrs") {
			v = u.Query().Get("target_session_attrs")
		}
	} else if m := dsnTargetAttrs.FindStringSubmatch(s); m != nil {
		v = strings.Trim(m[1], "'")
	}
	return strings.ToLower(v)
}

var dsnTargetAttrs = regexp.MustCompile(`(?:^|\s)target_session_attrs\s*=\s*('[^']*'|\S+)`)

// primaryState says what a check of a host found.
type primaryState int

const (
	hostDown    primaryState = iota // no answer, or not Postgres
	hostStandby                     // in recovery: a standby
	hostPrimary                     // a writable primary
)

func (s primaryState) String() string {
	return [...]string{"unreachable", "read-only (a standby, or default_transaction_read_only is on)", "a writable primary"}[s]
}

// checkHost connects to h as pgfence's own role and asks whether it is in
// recovery; the error says why it could not tell.
func checkHost(ctx context.Context, h upstreamHost) (primaryState, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, h.cfg)
	if err != nil {
		return hostDown, err
	}
	defer c.Close(context.Background())
	res, err := c.Exec(ctx, "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only')").ReadAll()
	if err != nil {
		return hostDown, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return hostDown, fmt.Errorf("unexpected answer to pg_is_in_recovery()")
	}
	row := res[0].Rows[0]
	if string(row[0]) == "t" || string(row[1]) == "on" {
		return hostStandby, nil
	}
	return hostPrimary, nil
}

// followPrimary checks the hosts every interval (until ctx ends) and
// points the proxy at the first that is a writable primary, in --upstream's
// order, as libpq's target_session_attrs=read-write picks. While none is,
// sessions go where they went, and those on a standby are ended by the
// proxy (proxy.Config.RequirePrimary).
func (i *instance) followPrimary(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		i.pickPrimary(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pickPrimary points the proxy at the first host that is a writable
// primary, if any is.
func (i *instance) pickPrimary(ctx context.Context) {
	for _, h := range i.hosts {
		if st, _ := checkHost(ctx, h); st == hostPrimary {
			if i.proxy.Upstream().Addr != h.up.Addr {
				i.proxy.SetUpstream(h.up)
			}
			return
		}
	}
}

// readiness is /readyz's verdict on the upstream sessions now go to: ok
// only when it is a writable primary.
func (i *instance) readiness(ctx context.Context) (bool, string) {
	up := i.proxy.Upstream()
	if err := i.proxy.CheckUpstream(ctx); err != nil {
		return false, fmt.Sprintf("Postgres at %s unreachable: %v", up.Addr, err)
	}
	for _, h := range i.hosts {
		if h.up.Addr != up.Addr {
			continue
		}
		st, err := checkHost(ctx, h)
		switch {
		case err != nil:
			return false, fmt.Sprintf("Postgres at %s does not answer pgfence's role: %v", up.Addr, err)
		case st != hostPrimary:
			return false, fmt.Sprintf("Postgres at %s is %s: writes would fail", up.Addr, st)
		}
		return true, fmt.Sprintf("Postgres at %s is %s", up.Addr, st)
	}
	return true, fmt.Sprintf("Postgres at %s reachable", up.Addr)
}
