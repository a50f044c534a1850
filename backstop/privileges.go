package backstop

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// What pgfence's role needs (docs/backstop.md has the table): its own
// schema, pgfence, which it creates (the CREATE privilege on the database)
// or a DBA creates for it (CREATE SCHEMA pgfence AUTHORIZATION <role>);
// the TRIGGER privilege on each guarded table, partitions included, which
// creates, replaces and enables again (CREATE OR REPLACE TRIGGER) the
// backstop's triggers; and owning a table (or being a member of its owner)
// only to drop one of them (observe, TRUNCATE allowed, a partition's
// redundant trigger, a rename) or to enable a partition's clone. The event
// triggers take a superuser. Install reports what the role lacks as the
// GRANT statements that would give it (Report.Grants).

// setupGrants are the statements that would let the current role set up
// pgfence's schema objects, for when Setup failed.
func setupGrants(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	var role, db string
	var missing, mayCreate bool
	var owner *string
	var ownerMember bool
	err := conn.QueryRow(ctx, `SELECT CURRENT_USER::text, pg_catalog.current_database()::text,
		pg_catalog.to_regnamespace('pgfence') IS NULL,
		pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE'),
		(SELECT n.nspowner::regrole::text FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'),
		coalesce((SELECT pg_catalog.pg_has_role(n.nspowner, 'USAGE') FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'), true)`).
		Scan(&role, &db, &missing, &mayCreate, &owner, &ownerMember)
	if err != nil {
		return nil, fmt.Errorf("reading pgfence's role's privileges: %w", err)
	}
	switch {
	case missing && !mayCreate:
		return []string{
			"GRANT CREATE ON DATABASE " + ident(db) + " TO " + ident(role) + ";  -- or, to grant less: CREATE SCHEMA pgfence AUTHORIZATION " + ident(role) + ";",
		}, nil
	case !missing && !ownerMember && owner != nil:
		// Its objects are another role's: only their owner may replace
		// them.
		return []string{"GRANT " + ident(*owner) + " TO " + ident(role) + ";  -- schema pgfence and its objects are role " + *owner + "'s: or run pgfence as " + *owner},
			nil
	}
	return nil, nil
}

// tableGrants are the statements that would give the current role the
// TRIGGER privilege on the tables of state that want a backstop and lack
// it.
func tableGrants(role string, state []tableState, want []wanted) []string {
	var out []string
	for i, st := range state {
		if st.oid == 0 || st.mayTrigger || want[i].row.Name == "" && want[i].trunc.Name == "" {
			continue
		}
		out = append(out, "GRANT TRIGGER ON TABLE "+ident(st.guard.Schema)+"."+ident(st.guard.Table)+" TO "+ident(role)+";")
	}
	return out
}

// guardGrants is tableGrants for guards before pgfence's schema objects
// are set up (readState needs them): the TRIGGER privilege on each table
// that would get a backstop.
func guardGrants(ctx context.Context, conn *pgx.Conn, role string, guards []sqlrewrite.Guard, o Options) ([]string, error) {
	oids, err := tableOIDs(ctx, conn, guards)
	if err != nil {
		return nil, err
	}
	rels := make([]int64, len(oids))
	for i, oid := range oids {
		rels[i] = int64(oid)
	}
	rows, err := conn.Query(ctx, `SELECT r.oid <> 0 AND NOT pg_catalog.has_table_privilege(r.oid::oid, 'TRIGGER')
		FROM pg_catalog.unnest($1::int8[]) WITH ORDINALITY AS r(oid, i) ORDER BY r.i`, rels)
	if err != nil {
		return nil, fmt.Errorf("reading pgfence's role's privileges: %w", err)
	}
	lacks, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return nil, fmt.Errorf("reading pgfence's role's privileges: %w", err)
	}
	state := make([]tableState, len(guards))
	want := make([]wanted, len(guards))
	for i, g := range guards {
		state[i] = tableState{guard: g, oid: oids[i], mayTrigger: !lacks[i]}
		want[i] = wantedFor(g, o)
	}
	return tableGrants(role, state, want), nil
}
