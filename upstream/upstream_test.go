package upstream

import (
	"fmt"
	"strings"
	"testing"
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
