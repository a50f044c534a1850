package backstop

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Removal is everything pgfence put in a database, as Uninstall drops it:
// the event triggers first (so that the DDL guard does not refuse the
// rest), then the backstop's triggers on every table that carries them,
// then the schema pgfence with all it holds (lock domains, the recorded
// configuration, counters, the secret, the functions) and with it the
// grants on them and the default privileges set in it.
type Removal struct {
	// EventTriggers are the event triggers that run a function of
	// pgfence's schema.
	EventTriggers []string
	// Triggers are the triggers, on tables outside the schema, that run a
	// function of pgfence's schema (a partitioned table's, not the clones
	// Postgres made of it on its partitions, which go with it).
	Triggers []TriggerOn
	// Schema is set when the schema pgfence exists; Owner is its owner,
	// Contents what it holds, by kind ("3 tables: a, b, c").
	Schema   bool
	Owner    string
	Contents []string
}

// TriggerOn is a trigger and the table it is on.
type TriggerOn struct {
	Table   string // schema-qualified, quoted as SQL needs
	Trigger string
}

// Empty reports whether there is nothing to drop.
func (r *Removal) Empty() bool {
	return len(r.EventTriggers) == 0 && len(r.Triggers) == 0 && !r.Schema
}

// Statements are the statements Uninstall runs, in order, in one
// transaction.
func (r *Removal) Statements() []string {
	var out []string
	for _, e := range r.EventTriggers {
		out = append(out, "DROP EVENT TRIGGER "+ident(e))
	}
	for _, t := range r.Triggers {
		out = append(out, "DROP TRIGGER "+ident(t.Trigger)+" ON "+t.Table)
	}
	if r.Schema {
		out = append(out, "DROP SCHEMA "+ident(Schema)+" CASCADE")
	}
	return out
}

// PlanUninstall finds what Uninstall would drop. It only reads.
func PlanUninstall(ctx context.Context, conn *pgx.Conn) (*Removal, error) {
	r := &Removal{}
	rows, err := conn.Query(ctx, `SELECT e.evtname::text FROM pg_catalog.pg_event_trigger e
		JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 ORDER BY 1`, Schema)
	if err != nil {
		return nil, fmt.Errorf("reading pgfence's event triggers: %w", err)
	}
	if r.EventTriggers, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, fmt.Errorf("reading pgfence's event triggers: %w", err)
	}
	rows, err = conn.Query(ctx, `SELECT pg_catalog.format('%I.%I', tn.nspname, c.relname), t.tgname::text
		FROM pg_catalog.pg_trigger t
		JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid JOIN pg_catalog.pg_namespace tn ON tn.oid = c.relnamespace
		JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND tn.nspname <> $1 AND t.tgparentid = 0::oid AND NOT t.tgisinternal
		ORDER BY tn.nspname, c.relname, t.tgname COLLATE "C"`, Schema)
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's triggers: %w", err)
	}
	for rows.Next() {
		var t TriggerOn
		if err := rows.Scan(&t.Table, &t.Trigger); err != nil {
			return nil, fmt.Errorf("reading the backstop's triggers: %w", err)
		}
		r.Triggers = append(r.Triggers, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the backstop's triggers: %w", err)
	}
	var owner *string
	if err := conn.QueryRow(ctx, `SELECT n.nspowner::regrole::text FROM pg_catalog.pg_namespace n WHERE n.nspname = $1`, Schema).Scan(&owner); err != nil && err != pgx.ErrNoRows {
		return nil, fmt.Errorf("reading pgfence's schema: %w", err)
	}
	if owner == nil {
		return r, nil
	}
	r.Schema, r.Owner = true, *owner
	rows, err = conn.Query(ctx, `SELECT kind, pg_catalog.count(*)::int, pg_catalog.string_agg(name, ', ' ORDER BY name) FROM (
			SELECT CASE c.relkind WHEN 'r' THEN 'tables' WHEN 'S' THEN 'sequences' WHEN 'v' THEN 'views' ELSE 'other relations' END AS kind, c.relname::text AS name
			FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'S', 'v', 'm', 'f', 'p')
			UNION ALL
			SELECT 'functions', p.proname::text FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
			UNION ALL
			SELECT 'types', t.typname::text FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
			WHERE n.nspname = $1 AND t.typtype IN ('c', 'd', 'e') AND (t.typrelid = 0::oid OR (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid) = 'c')
		) x GROUP BY kind ORDER BY kind`, Schema)
	if err != nil {
		return nil, fmt.Errorf("reading pgfence's schema: %w", err)
	}
	for rows.Next() {
		var kind, names string
		var n int
		if err := rows.Scan(&kind, &n, &names); err != nil {
			return nil, fmt.Errorf("reading pgfence's schema: %w", err)
		}
		r.Contents = append(r.Contents, fmt.Sprintf("%d %s: %s", n, kind, names))
	}
	return r, rows.Err()
}

// Uninstall drops what r lists (see Removal), in one transaction: all of
// it or, when a statement fails, none. It waits up to 5 s for each lock
// (dropping a trigger waits for the transactions that use its table);
// what fails says what it takes.
func Uninstall(ctx context.Context, conn *pgx.Conn, r *Removal) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
			return err
		}
		// Not while an instance sets the schema up or installs.
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
			return err
		}
		for _, sql := range r.Statements() {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return uninstallFailure(sql, err)
			}
		}
		return nil
	})
}

// uninstallFailure says why sql failed, and what it takes.
func uninstallFailure(sql string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "42501" && strings.HasPrefix(sql, "DROP EVENT TRIGGER"):
			return fmt.Errorf("%s: %w: only a superuser (or the event trigger's owner) may drop it: run pgfence uninstall as a superuser; nothing was dropped", sql, err)
		case pe.Code == "42501" && strings.HasPrefix(sql, "DROP TRIGGER"):
			return fmt.Errorf("%s: %w: dropping a trigger takes owning its table: run pgfence uninstall as a superuser, or as a role that owns every table listed; nothing was dropped", sql, err)
		case pe.Code == "42501":
			return fmt.Errorf("%s: %w: run pgfence uninstall as a superuser, or as the schema's owner; nothing was dropped", sql, err)
		case pe.Code == "55P03":
			return fmt.Errorf("%s: %w: open transactions held a lock it needs for 5 s; try again when they are done; nothing was dropped", sql, err)
		}
	}
	return fmt.Errorf("%s: %w; nothing was dropped", sql, err)
}
