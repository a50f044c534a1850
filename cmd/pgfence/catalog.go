package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// What a database's catalog says is read by internal/catalog: here is
// only what maps the flags onto a read, and the read onto the policy and
// /readyz.

// backstopMode reads --backstop: on reports false for off.
func backstopMode(s string) (mode backstop.Mode, on bool, err error) {
	switch s {
	case "install", "true", "on", "":
		return backstop.Install, true, nil
	case "verify":
		return backstop.Verify, true, nil
	case "off", "false":
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("--backstop %q: want install, verify or off", s)
}

// configure puts in cfg what a read of the catalog found besides the
// guards: whether the database's DDL guard is in place, whether its
// backstop's helpers are, the key of the backstop's notices, and the
// server's version.
func configure(r *catalog.Found, cfg *fence.Config) {
	cfg.DDLGuard = r.Backstop != nil && r.Backstop.GuardingDDL
	cfg.StaleNotice = r.Helpers
	cfg.NoticeKey = r.NoticeKey
	cfg.ServerVersion = int(r.Version)
}

// noteUnfenceable keeps, for /readyz, the guarded tables whose writes
// are refused because they cannot be fenced.
func (d *database) noteUnfenceable(guards []sqlrewrite.Guard) {
	var tables []string
	for _, g := range guards {
		if g.Unfenceable != "" {
			tables = append(tables, "guarded table "+g.Label()+" cannot be fenced, and its writes are refused: "+g.Unfenceable)
		}
	}
	if len(tables) == 0 {
		d.unfenceable.Store(nil)
		return
	}
	u := strings.Join(tables, "\n  ")
	d.unfenceable.Store(&u)
}

// unfenceable says, when the --upstream database has guarded tables that
// cannot be fenced, that their writes are refused ("" when it has none):
// the tables and their fixes are in statusLines. /readyz answers for that
// database alone: another's state is in its body and its metrics, as a
// role that can create a table in one database must not take every
// database's sessions out of service (red team 7b).
func (i *instance) unfenceable() string {
	if i.main.unfenceable.Load() == nil {
		return ""
	}
	return "guarded tables of database " + strconv.Quote(i.main.name) + " cannot be fenced, and pgfence refuses their writes (which tables, and the fix, below)"
}
