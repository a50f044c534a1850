package upstream

import (
	"crypto/tls"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		addrs   []string
		primary bool
		err     string
	}{
		{in: "postgres://u@a:5432/db", addrs: []string{"a:5432"}},
		{in: "postgres://u@a:5432,b:5433/db?target_session_attrs=read-write", addrs: []string{"a:5432", "b:5433"}, primary: true},
		{in: "postgres://u@a:5432,b:5433/db?sslmode=prefer&target_session_attrs=primary", addrs: []string{"a:5432", "b:5433"}, primary: true},
		{in: "host=a,b port=1,2 user=u target_session_attrs=read-write", addrs: []string{"a:1", "b:2"}, primary: true},
		{in: "host=/run/postgresql port=5432", addrs: []string{"/run/postgresql/.s.PGSQL.5432"}},
		{in: "postgres://u@a,b/db?target_session_attrs=standby", err: "writable primary"},
	} {
		u, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		var addrs []string
		for _, h := range u.List {
			addrs = append(addrs, h.Upstream.Addr)
		}
		if fmt.Sprint(addrs) != fmt.Sprint(tc.addrs) || u.RequirePrimary != tc.primary {
			t.Errorf("%s: hosts %v, requirePrimary %v; want %v, %v", tc.in, addrs, u.RequirePrimary, tc.addrs, tc.primary)
		}
	}
}

// Each sslmode gives the check libpq's TLS attempts, in libpq's order, and
// the proxy's sessions one attempt that asks for TLS unless the mode
// rules it out, and insists on it only when no attempt is plain.
func TestParseSSLMode(t *testing.T) {
	for _, tc := range []struct {
		mode     string // "" leaves sslmode out
		attempts string // the check's, in order
		tls      bool   // sessions ask for TLS
		required bool   // and fail without it
	}{
		{mode: "", attempts: "tls,plain", tls: true},
		{mode: "disable", attempts: "plain"},
		{mode: "allow", attempts: "plain,tls", tls: true},
		{mode: "prefer", attempts: "tls,plain", tls: true},
		{mode: "require", attempts: "tls", tls: true, required: true},
		{mode: "verify-ca", attempts: "tls", tls: true, required: true},
		{mode: "verify-full", attempts: "tls", tls: true, required: true},
	} {
		url := "postgres://u@db.example.com:5432/app"
		if tc.mode != "" {
			url += "?sslmode=" + tc.mode
		}
		t.Setenv("PGSSLMODE", "") // the test's own environment must not choose
		u, err := Parse(url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if len(u.List) != 1 {
			t.Fatalf("%s: %d hosts, want 1", url, len(u.List))
		}
		h := u.List[0]
		var attempts []string
		for _, c := range append([]*tls.Config{h.cfg.TLSConfig}, fallbackTLS(h.cfg)...) {
			if c == nil {
				attempts = append(attempts, "plain")
			} else {
				attempts = append(attempts, "tls")
			}
		}
		if got := strings.Join(attempts, ","); got != tc.attempts {
			t.Errorf("sslmode=%q: the check tries %s, want %s (libpq's order)", tc.mode, got, tc.attempts)
		}
		if (h.Upstream.TLS != nil) != tc.tls || h.Upstream.TLSRequired != tc.required {
			t.Errorf("sslmode=%q: sessions ask for TLS %v, require it %v; want %v, %v", tc.mode, h.Upstream.TLS != nil, h.Upstream.TLSRequired, tc.tls, tc.required)
		}
	}
}

func fallbackTLS(c *pgconn.Config) []*tls.Config {
	var out []*tls.Config
	for _, fb := range c.Fallbacks {
		out = append(out, fb.TLSConfig)
	}
	return out
}
