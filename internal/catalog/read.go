package catalog

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgversion"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Options say what one read of the catalog does besides reading: serve's
// and init's flags alike.
type Options struct {
	// Discover guards every table with a bigint column named
	// DiscoverColumn (see Discover).
	Discover       bool
	DiscoverColumn string
	// InitDomains records, where the database has none yet, the lock
	// domains the guards give their tables, and a row per domain.
	InitDomains bool
	// Backstop is off when false (--backstop=off): nothing of it is read
	// or done. When on, BackstopMode says whether to install or verify it.
	Backstop     bool
	BackstopMode backstop.Mode
	ExemptRoles  []string
	PooledRoles  []string
	TokenSetting string
	// AllowTruncate lets TRUNCATE of a guarded table through the backstop.
	AllowTruncate bool
	// Replace records this configuration in the database in place of the
	// one there ('pgfence init'): see backstop.Options.Replace.
	Replace bool
}

// Found is what one read of a database's catalog found, and did.
type Found struct {
	// Guards are for the policy: the explicit guards, the discovered
	// tables, their trees, and the tables that carry the backstop, each
	// with the lock domain the database keeps for it and whether the
	// backstop covers it.
	Guards []sqlrewrite.Guard
	// Problems are what cannot be fenced as configured, each once, sorted:
	// the read goes on past them.
	Problems []string
	// Backstop is nil when Options.Backstop is off; so is Counts, and
	// Counts is nil too when the counters could not be read (a problem
	// says why).
	Backstop *backstop.Report
	Counts   *backstop.Counts
	// NoticeKey is pgfence's secret in the database, with which the
	// policy checks the backstop's notices ("" when it cannot be read).
	NoticeKey string
	// Version is the server's: the rewriter's refusals depend on it.
	Version pgversion.Version
	// Helpers says pgfence's schema objects are as this version sets them
	// up, the backstop's helpers among them, which rewrites may then call
	// (see fence.Config.StaleNotice).
	Helpers bool
}

// readVersion reads the server's version and refuses one pgfence does not
// support (see pgversion): before anything else, so that what fails on
// an old server is said as its version, not as the first statement that
// does not parse there.
func readVersion(ctx context.Context, conn *pgx.Conn) (pgversion.Version, error) {
	v, err := pgversion.Read(ctx, conn)
	if err != nil {
		return 0, err
	}
	return v, v.Supported()
}

// untested is the problem of a server newer than any pgfence was tested
// on, "" for the others.
func untested(v pgversion.Version) string {
	if !v.Untested() {
		return ""
	}
	return fmt.Sprintf("the server runs %s, newer than any pgfence was tested on (PostgreSQL %d to %d): pgfence serves it, and refuses (0A000) "+
		"what may write a guarded table and its parser cannot read; run a pgfence release tested on PostgreSQL %d", v, pgversion.Oldest, pgversion.Newest, v.Major())
}

// Read reads the server's version, discovers the guarded tables, applies
// the lock-domain membership the database keeps, and installs or verifies
// the backstop, as o says; apply gives a guard the flags' rollout, lock
// domain and missing-token policy. With nothing to guard (no explicit
// guard, no discovery) and the backstop off, it reads the version alone.
// An error means the catalog could not be read at all (or the server's
// version is not supported); what goes wrong with one table or one part
// is a problem in the result.
func Read(ctx context.Context, conn *pgx.Conn, o Options, explicit []sqlrewrite.Guard, apply func(sqlrewrite.Guard) sqlrewrite.Guard) (*Found, error) {
	v, err := readVersion(ctx, conn)
	if err != nil {
		return nil, err
	}
	if !o.Discover && len(explicit) == 0 && !o.Backstop {
		return &Found{Version: v}, nil
	}
	d, err := Discover(ctx, conn, explicit, o.Discover, o.DiscoverColumn, apply)
	if err != nil {
		return nil, err
	}
	r := &Found{Guards: d.Guards, Problems: d.Problems, Version: v}
	if p := untested(v); p != "" {
		r.Problems = append(r.Problems, p)
	}
	tables := d.Tables
	if o.Backstop {
		// A table that carries the backstop stays guarded under the name
		// it has now: renamed or moved, it keeps its triggers, and the
		// rewrite follows them (with --discover=false it would otherwise
		// lose its guard for good).
		carriers, err := backstop.Carriers(ctx, conn)
		if err != nil {
			return nil, err
		}
		for _, c := range carriers {
			if slices.ContainsFunc(tables, func(t sqlrewrite.Guard) bool { return t.Schema == c.Schema && t.Table == c.Table }) {
				continue
			}
			g := apply(c)
			r.Guards = append(r.Guards, g)
			tables = append(tables, g)
			r.Problems = append(r.Problems, fmt.Sprintf("table %s carries pgfence's backstop but no --guard or discovery names it "+
				"(renamed or moved since?): guarded as it is; name it in --guard, or, as pgfence's role or an exempt one, DROP TRIGGER %q ON %s to stop guarding it",
				g.Name(), backstop.RowTrigger, g.Name()))
		}
	}
	domains := Domains(tables)
	install := o.Backstop && o.BackstopMode == backstop.Install
	setUp := true
	if install || o.InitDomains && len(domains) > 0 {
		if err := backstop.Setup(ctx, conn); err != nil {
			setUp = false
			if !install { // Reconcile reports it otherwise, with what to grant
				r.Problems = append(r.Problems, fmt.Sprintf("%v (run 'pgfence init' as a role that may create the pgfence schema)", err))
			}
		}
		r.Helpers = setUp
	} else if r.Helpers, err = backstop.IsSetUp(ctx, conn); err != nil {
		return nil, err
	}
	// Without the schema, the domains' rows would fail for the same reason.
	if o.InitDomains && setUp {
		if err := AddDomains(ctx, conn, domains); err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
		if err := addMembers(ctx, conn, tables); err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
	}
	members, err := readMembers(ctx, conn)
	if err != nil {
		return nil, err
	}
	r.Problems = append(r.Problems, applyMembers(r.Guards, members)...)
	applyMembers(tables, members)
	r.Problems = append(r.Problems, mixedTrees(r.Guards, tables, d.Parents)...)
	if o.Backstop {
		bo := backstop.Options{TokenSetting: o.TokenSetting, AllowTruncate: o.AllowTruncate, ExemptRoles: o.ExemptRoles, PooledRoles: o.PooledRoles, Replace: o.Replace}
		if o.Discover {
			// What a table found by its epoch column gets, for the event
			// trigger that installs the backstop as DDL creates one.
			g := apply(sqlrewrite.Guard{Column: o.DiscoverColumn})
			bo.Discovered = &g
		}
		rep, err := backstop.Reconcile(ctx, conn, tables, bo, o.BackstopMode)
		if err != nil {
			return nil, err
		}
		r.Backstop = rep
		for _, t := range rep.Tables {
			if t.Problem != "" {
				r.Problems = append(r.Problems, "backstop: "+t.Problem)
			}
		}
		r.Problems = append(r.Problems, rep.Problems...)
		if len(rep.Grants) > 0 {
			r.Problems = append(r.Problems, grantsProblem(rep))
		}
		for k, g := range r.Guards {
			r.Guards[k].Backstop = backstopCovers(rep, g)
		}
		if counts, err := backstop.ReadCounts(ctx, conn); err != nil {
			r.Problems = append(r.Problems, err.Error())
		} else {
			r.Counts = &counts
		}
		if r.NoticeKey, err = backstop.ReadNoticeKey(ctx, conn); err != nil {
			r.Problems = append(r.Problems, err.Error()+": the stale writes the backstop skips in pgfence's sessions are counted only in the database (pgfence_backstop_rejects_total)")
		}
	}
	slices.Sort(r.Problems)
	r.Problems = slices.Compact(r.Problems) // a problem is said once
	return r, nil
}

// grantsProblem says what pgfence's role lacks, as the statements that
// would give it.
func grantsProblem(rep *backstop.Report) string {
	return fmt.Sprintf("pgfence's role %s lacks privileges the backstop needs; a superuser or the objects' owner gives them with:\n  %s",
		rep.Role, strings.Join(rep.Grants, "\n  "))
}

// backstopCovers reports whether the backstop is OK, and this instance's
// configuration, on every table g stands for (an unqualified guard stands
// for its name in every schema), and g stands for at least one: only then
// may the rewrite leave a write to it (MERGE, COPY FROM) to the backstop.
func backstopCovers(rep *backstop.Report, g sqlrewrite.Guard) bool {
	found := false
	for _, t := range rep.Tables {
		if t.Guard.Table != g.Table || g.Schema != "" && g.Schema != t.Guard.Schema {
			continue
		}
		if !t.OK || !t.AsConfigured {
			return false
		}
		found = true
	}
	return found
}
