package catalog

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// Domains lists the lock domains of guards, each once, in the order they
// first appear.
func Domains(guards []sqlrewrite.Guard) []string {
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

// AddDomains makes sure the lock-domain table has a row per domain (it
// needs pgfence's schema: see backstop.Setup).
func AddDomains(ctx context.Context, conn *pgx.Conn, domains []string) error {
	for _, d := range domains {
		if _, err := conn.Exec(ctx, sqlrewrite.DomainRowSQL(), d); err != nil {
			return fmt.Errorf("cannot add lock domain %q to %s (writes to it change nothing until its row exists; run 'pgfence init'): %w", d, sqlrewrite.DomainTable, err)
		}
	}
	return nil
}

// addMembers records the lock domains the flags give tables, where the
// database has none for them yet: the database's membership is the one
// every pgfence instance (and the backstop) applies. Nor where the
// table's backstop is recorded with another domain (a membership row
// gone, or from before there were any): an instance's flags must not move
// a table out of its domain (red team 8).
func addMembers(ctx context.Context, conn *pgx.Conn, tables []sqlrewrite.Guard) error {
	for _, t := range tables {
		if t.Domain == "" {
			continue
		}
		_, err := conn.Exec(ctx, `INSERT INTO pgfence.domain_members (relid, domain)
			SELECT r.relid, $3 FROM (SELECT pg_catalog.format('%I.%I', $1::text, $2::text)::regclass AS relid) r
			WHERE NOT EXISTS (SELECT 1 FROM pgfence.guarded g WHERE g.relid = r.relid::oid AND g.domain IS NOT NULL AND g.domain <> $3::text)
			ON CONFLICT (relid) DO NOTHING`, t.Schema, t.Table, t.Domain)
		if err != nil {
			return fmt.Errorf("cannot record table %s in lock domain %q in pgfence.domain_members (other pgfence instances will not apply it; run 'pgfence init'): %w", t.Name(), t.Domain, err)
		}
	}
	return nil
}

// readMembers reads the lock-domain membership kept in the database, by
// schema.table (none before pgfence's schema exists).
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
		JOIN pg_catalog.pg_class c ON c.oid = m.relid::oid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace`)
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
