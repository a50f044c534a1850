package upstream

import (
	"context"
	"crypto/tls"
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

// Hosts is what a connection string says: one host or several, as libpq
// and pgx take them (host=a,b port=1,2, or postgres://a:1,b:2/db).
type Hosts struct {
	List []Host
	// RequirePrimary is set by target_session_attrs=read-write (or
	// primary): sessions go only to the host that is a writable primary,
	// which Follow follows when another takes over.
	RequirePrimary bool
}

// Host is one host: where sessions connect, and the connection settings
// pgfence's own checks of it use.
type Host struct {
	Upstream proxy.Upstream
	cfg      *pgconn.Config // this host only (its TLS attempts as fallbacks), no validation
	// logins paces Check's logins while this host refuses pgfence's role:
	// every check would otherwise try again (each scrape, each probe,
	// Follow every second).
	logins *Backoff
}

// Logins is the Backoff that paces pgfence's logins to h: Check's, and
// any other login of pgfence's role there that should take turns with
// them.
func (h Host) Logins() *Backoff { return h.logins }

// Parse reads a postgres:// URL (or key=value string), with sslmode,
// sslrootcert, target_session_attrs and friends meaning what they mean to
// libpq.
func Parse(s string) (Hosts, error) {
	cfg, err := pgconn.ParseConfig(s)
	if err != nil {
		return Hosts{}, err
	}
	var u Hosts
	switch attrs := targetSessionAttrs(s); attrs {
	case "", "any":
	case "read-write", "primary":
		u.RequirePrimary = true
	default:
		return Hosts{}, fmt.Errorf("target_session_attrs=%s: pgfence fences writes, so it can only follow a writable primary (read-write or primary)", attrs)
	}
	// pgconn lists each host once per TLS attempt, in libpq's order
	// (sslmode=prefer: TLS, then plain; allow: plain, then TLS): one
	// upstream per address, whose check makes the same attempts (see
	// Check), and whose sessions use TLS when Postgres accepts it, and
	// must when no attempt is plain (see sessionTLS).
	all := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	index := map[string]int{}
	for _, fb := range all {
		port := strconv.Itoa(int(fb.Port))
		h := Host{Upstream: proxy.Upstream{Network: "tcp", Addr: net.JoinHostPort(fb.Host, port), TLS: fb.TLSConfig, TLSRequired: fb.TLSConfig != nil}}
		if strings.HasPrefix(fb.Host, "/") {
			h.Upstream = proxy.Upstream{Network: "unix", Addr: filepath.Join(fb.Host, ".s.PGSQL."+port)}
		}
		if k, ok := index[h.Upstream.Addr]; ok {
			sessionTLS(&u.List[k].Upstream, fb.TLSConfig)
			// The check tries this attempt too, as libpq would: without
			// it, sslmode=prefer (the default) against a Postgres without
			// TLS would never be ready.
			c := u.List[k].cfg
			c.Fallbacks = append(c.Fallbacks, &pgconn.FallbackConfig{Host: fb.Host, Port: fb.Port, TLSConfig: fb.TLSConfig})
			continue
		}
		one := cfg.Copy()
		one.Host, one.Port, one.TLSConfig, one.Fallbacks, one.ValidateConnect = fb.Host, fb.Port, fb.TLSConfig, nil, nil
		h.cfg, h.logins = one, &Backoff{}
		index[h.Upstream.Addr] = len(u.List)
		u.List = append(u.List, h)
	}
	return u, nil
}

// sessionTLS folds another TLS attempt of libpq's for a host into how the
// proxy connects its sessions there. The proxy makes one attempt per
// session, as it cannot start a session over once it has relayed the
// client's startup packet: it asks for TLS when any attempt uses it, and
// goes on in plain text when Postgres declines, unless no attempt is
// plain (require, verify-ca, verify-full). So sslmode=prefer means what it
// means to libpq, and allow gets TLS where Postgres offers it (libpq's
// allow tries plain text first, then TLS when Postgres refuses that: the
// proxy's one attempt that works with both kinds of server).
func sessionTLS(up *proxy.Upstream, attempt *tls.Config) {
	if attempt == nil {
		up.TLSRequired = false
	} else if up.TLS == nil {
		up.TLS = attempt
	}
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

// State says what a check of a host found.
type State int

const (
	Down     State = iota // no answer, or not Postgres
	ReadOnly              // in recovery (a standby), or read-only
	Primary               // a writable primary
)

func (s State) String() string {
	return [...]string{"unreachable", "read-only (a standby, or default_transaction_read_only is on)", "a writable primary"}[s]
}

// Check connects to h as pgfence's own role, making the TLS attempts
// libpq's sslmode makes (prefer: TLS, then plain text), and asks whether
// it is in recovery or read-only, as libpq's target_session_attrs=read-write
// does; the error says why it could not tell. While h refuses the role's
// login it does not try again at every call but as its Backoff says, and
// reports the refusal meanwhile (a *HeldError).
func Check(ctx context.Context, h Host) (State, error) {
	if err := h.logins.Try(); err != nil {
		return Down, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, h.cfg)
	if err != nil {
		if Refused(err) {
			h.logins.Failed(err)
		} else {
			h.logins.Ended()
		}
		return Down, err
	}
	h.logins.Succeeded()
	defer c.Close(context.Background())
	res, err := c.Exec(ctx, "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only')").ReadAll()
	if err != nil {
		return Down, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return Down, fmt.Errorf("unexpected answer to pg_is_in_recovery()")
	}
	row := res[0].Rows[0]
	if string(row[0]) == "t" || string(row[1]) == "on" {
		return ReadOnly, nil
	}
	return Primary, nil
}

// Follow checks hosts every interval until ctx ends, and calls moved with
// the first that is a writable primary, in their order (as libpq's
// target_session_attrs=read-write picks), whenever that is another than
// the last one it named; current names the one sessions go to at first.
// While none is, moved is not called.
func Follow(ctx context.Context, hosts []Host, every time.Duration, current string, moved func(Host)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if h, ok := FindPrimary(ctx, hosts); ok && h.Upstream.Addr != current {
			current = h.Upstream.Addr
			moved(h)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// FindPrimary returns the first of hosts that is a writable primary.
func FindPrimary(ctx context.Context, hosts []Host) (Host, bool) {
	for _, h := range hosts {
		if st, _ := Check(ctx, h); st == Primary {
			return h, true
		}
	}
	return Host{}, false
}
