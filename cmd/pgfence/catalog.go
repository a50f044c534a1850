package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgversion"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// catalogOptions say what one read of the catalog does besides reading:
// serve's and init's flags alike.
type catalogOptions struct {
	discover       bool
	discoverColumn string
	initDomains    bool
	backstop       string // install, verify or off
	exemptRoles    []string
	tokenSetting   string
	allowTruncate  bool
	// replace records this configuration in the database in place of the
	// one there ('pgfence init'): see backstop.Options.Replace.
	replace bool
}

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

// catalogRead is what one read of the catalog found and did.
type catalogRead struct {
	guards   []sqlrewrite.Guard // for the policy: the explicit guards, discovered tables and their trees
	problems []string
	// backstop is nil when --backstop=off.
	backstop *backstop.Report
	counts   *backstop.Counts
	// noticeKey is pgfence's secret in the database, with which the
	// policy checks the backstop's notices ("" when it cannot be read).
	noticeKey string
	// version is the server's: the rewriter's refusals depend on it.
	version pgversion.Version
}

// configure puts in cfg what the read found besides the guards: whether
// the database's DDL guard is in place, and the key of the backstop's
// notices.
func (r *catalogRead) configure(cfg *fence.Config) {
	cfg.DDLGuard = r.backstop != nil && r.backstop.GuardingDDL
	cfg.NoticeKey = r.noticeKey
	cfg.ServerVersion = int(r.version)
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

// readCatalog discovers the guarded tables, applies the lock-domain
// membership the database keeps, and installs or verifies the backstop.
// An error means the catalog could not be read at all; what goes wrong
// with one table or one part is a problem in the result.
func readCatalog(ctx context.Context, conn *pgx.Conn, o catalogOptions, explicit []sqlrewrite.Guard, apply func(sqlrewrite.Guard) sqlrewrite.Guard) (*catalogRead, error) {
	mode, backstopOn, err := backstopMode(o.backstop)
	if err != nil {
		return nil, err
	}
	v, err := readVersion(ctx, conn)
	if err != nil {
		return nil, err
	}
	d, err := fence.Discover(ctx, conn, explicit, o.discover, o.discoverColumn, apply)
	if err != nil {
		return nil, err
	}
	r := &catalogRead{guards: d.Guards, problems: d.Problems, version: v}
	if p := untested(v); p != "" {
		r.problems = append(r.problems, p)
	}
	tables := d.Tables
	if backstopOn {
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
			r.guards = append(r.guards, g)
			tables = append(tables, g)
			r.problems = append(r.problems, fmt.Sprintf("table %s carries pgfence's backstop but no --guard or discovery names it "+
				"(renamed or moved since?): guarded as it is; name it in --guard, or, as pgfence's role or an exempt one, DROP TRIGGER %q ON %s to stop guarding it",
				g.Name(), backstop.RowTrigger, g.Name()))
		}
	}
	domains := domainsOf(tables)
	install := backstopOn && mode == backstop.Install
	setUp := true
	if install || o.initDomains && len(domains) > 0 {
		if err := backstop.Setup(ctx, conn); err != nil {
			setUp = false
			if !install { // Reconcile reports it otherwise, with what to grant
				r.problems = append(r.problems, fmt.Sprintf("%v (run 'pgfence init' as a role that may create the pgfence schema)", err))
			}
		}
	}
	// Without the schema, the domains' rows would fail for the same reason.
	if o.initDomains && setUp {
		if err := domainRows(ctx, conn, domains); err != nil {
			r.problems = append(r.problems, err.Error())
		}
		if err := addMembers(ctx, conn, tables); err != nil {
			r.problems = append(r.problems, err.Error())
		}
	}
	members, err := readMembers(ctx, conn)
	if err != nil {
		return nil, err
	}
	r.problems = append(r.problems, applyMembers(r.guards, members)...)
	applyMembers(tables, members)
	if backstopOn {
		bo := backstop.Options{TokenSetting: o.tokenSetting, AllowTruncate: o.allowTruncate, ExemptRoles: o.exemptRoles, Replace: o.replace}
		if o.discover {
			// What a table found by its epoch column gets, for the event
			// trigger that installs the backstop as DDL creates one.
			g := apply(sqlrewrite.Guard{Column: o.discoverColumn})
			bo.Discovered = &g
		}
		rep, err := backstop.Reconcile(ctx, conn, tables, bo, mode)
		if err != nil {
			return nil, err
		}
		r.backstop = rep
		for _, t := range rep.Tables {
			if t.Problem != "" {
				r.problems = append(r.problems, "backstop: "+t.Problem)
			}
		}
		r.problems = append(r.problems, rep.Problems...)
		if len(rep.Grants) > 0 {
			r.problems = append(r.problems, grantsProblem(rep))
		}
		for k, g := range r.guards {
			r.guards[k].Backstop = backstopCovers(rep, g)
		}
		if counts, err := backstop.ReadCounts(ctx, conn); err != nil {
			r.problems = append(r.problems, err.Error())
		} else {
			r.counts = &counts
		}
		if r.noticeKey, err = backstop.ReadNoticeKey(ctx, conn); err != nil {
			r.problems = append(r.problems, err.Error()+": the stale writes the backstop skips in pgfence's sessions are counted only in the database (pgfence_backstop_rejects_total)")
		}
	}
	slices.Sort(r.problems)
	r.problems = slices.Compact(r.problems) // a problem is said once
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

func domainsOf(guards []sqlrewrite.Guard) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range guards {
		if g.Domain != "" && !seen[g.Domain] {
			seen[g.Domain] = true
			out = append(out, g.Domain)
		}
	}
	return out
}

// domainRows makes sure the lock-domain table has a row per domain.
func domainRows(ctx context.Context, conn *pgx.Conn, domains []string) error {
	for _, d := range domains {
		if _, err := conn.Exec(ctx, sqlrewrite.DomainRowSQL(), d); err != nil {
			return fmt.Errorf("cannot add lock domain %q to %s (writes to it change nothing until its row exists; run 'pgfence init'): %w", d, sqlrewrite.DomainTable, err)
		}
	}
	return nil
}

// addMembers records the lock domains the flags give tables, where the
// database has none for them yet: the database's membership is the one
// every pgfence instance (and the backstop) applies.
func addMembers(ctx context.Context, conn *pgx.Conn, tables []sqlrewrite.Guard) error {
	for _, t := range tables {
		if t.Domain == "" {
			continue
		}
		_, err := conn.Exec(ctx, `INSERT INTO pgfence.domain_members (relid, domain)
			VALUES (pg_catalog.format('%I.%I', $1::text, $2::text)::regclass, $3) ON CONFLICT (relid) DO NOTHING`, t.Schema, t.Table, t.Domain)
		if err != nil {
			return fmt.Errorf("cannot record table %s in lock domain %q in pgfence.domain_members (other pgfence instances will not apply it; run 'pgfence init'): %w", t.Name(), t.Domain, err)
		}
	}
	return nil
}

// readMembers reads the lock-domain membership kept in the database, by
// schema.table ("" before pgfence's schema exists).
func readMembers(ctx context.Context, conn *pgx.Conn) (map[[2]string]string, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('pgfence.domain_members') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading lock-domain membership: %w", err)
	}
	out := map[[2]string]string{}
	if !exists {
		return out, nil
	}
	rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text, m.domain FROM pgfence.domain_members m
		JOIN pg_catalog.pg_class c ON c.oid = m.relid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace`)
	if err != nil {
		return nil, fmt.Errorf("reading lock-domain membership: %w", err)
	}
	for rows.Next() {
		var schema, table, domain string
		if err := rows.Scan(&schema, &table, &domain); err != nil {
			return nil, fmt.Errorf("reading lock-domain membership: %w", err)
		}
		out[[2]string{schema, table}] = domain
	}
	return out, rows.Err()
}

// applyMembers gives each guard the lock domain the database keeps for
// its table, which wins over the flags (so every instance applies the
// same), and says where they disagree.
func applyMembers(guards []sqlrewrite.Guard, members map[[2]string]string) []string {
	var problems []string
	for k, g := range guards {
		domain, found := "", false
		for key, d := range members {
			if key[1] != g.Table || g.Schema != "" && g.Schema != key[0] {
				continue
			}
			if found && d != domain {
				problems = append(problems, fmt.Sprintf("guard %s stands for tables in different lock domains (%q and %q in pgfence.domain_members): qualify it with its schema", g.Name(), domain, d))
			}
			domain, found = d, true
		}
		if !found || domain == g.Domain {
			continue
		}
		if g.Domain != "" {
			problems = append(problems, fmt.Sprintf("table %s is in lock domain %q in the database (pgfence.domain_members), but --domain says %q: the database's wins, for every pgfence instance; to move it: UPDATE pgfence.domain_members SET domain = '%s' WHERE relid = '%s'::regclass",
				g.Name(), domain, g.Domain, g.Domain, strings.ReplaceAll(g.Name(), "'", "''")))
		}
		guards[k].Domain = domain
	}
	return problems
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

// unfenceable says, when some database has guarded tables that cannot
// be fenced, that their writes are refused ("" when none has): the
// tables and their fixes are in statusLines.
func (i *instance) unfenceable() string {
	var dbs []string
	for _, d := range i.databases() {
		if d.unfenceable.Load() != nil {
			dbs = append(dbs, strconv.Quote(d.name))
		}
	}
	if len(dbs) == 0 {
		return ""
	}
	return "guarded tables of database " + strings.Join(dbs, ", ") + " cannot be fenced, and pgfence refuses their writes (which tables, and the fix, below)"
}
