package v258923c

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// EventTrigger is the event trigger that puts the backstop on a table the
// moment DDL gives it the discovered epoch column, whoever runs the DDL and
// whichever way it reaches Postgres. Only a superuser may create event
// triggers: without it, such a table is guarded at pgfence's next
// discovery (at once when the DDL came through pgfence).
const EventTrigger = "pgfence_backstop_ddl"

// ddlSQL creates what the event trigger needs. pgfence.ddl_backstop has
// one row: the epoch column discovery looks for and the functions a
// discovered table's triggers run (Reconcile keeps it). on_ddl runs as
// the role that ran the DDL, which owns a table it created; what it cannot
// do is a warning, never a failed DDL: a broken event trigger would stop
// every CREATE TABLE in the database.
var ddlSQL = []string{
	`CREATE TABLE IF NOT EXISTS pgfence.ddl_backstop (
		one boolean PRIMARY KEY DEFAULT true CHECK (one),
		epoch_column name NOT NULL,
		row_function name NOT NULL,
		truncate_function name)`,
	`GRANT SELECT ON pgfence.ddl_backstop TO PUBLIC`,
	`CREATE OR REPLACE FUNCTION pgfence.on_ddl() RETURNS event_trigger
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  cfg record;
  t record;
BEGIN
  BEGIN
    SELECT * INTO cfg FROM pgfence.ddl_backstop;
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pgfence: cannot read pgfence.ddl_backstop: %', SQLERRM
      USING HINT = 'tables this DDL gave the epoch column get the backstop at pgfence''s next discovery';
    RETURN;
  END;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  FOR t IN
    SELECT DISTINCT c.oid, c.oid::regclass AS rel
    FROM pg_event_trigger_ddl_commands() d
    JOIN pg_class c ON c.oid = d.objid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = cfg.epoch_column AND a.attnum > 0 AND NOT a.attisdropped
    WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p')
      AND a.atttypid IN ('int8'::regtype, 'int4'::regtype, 'int2'::regtype)
      AND n.nspname NOT IN ('pgfence', 'pg_catalog', 'information_schema') AND n.nspname NOT LIKE E'pg\\_%'
  LOOP
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = t.oid AND tgname = '~pgfence_backstop') THEN
        EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.%I()',
          '~pgfence_backstop', t.rel, cfg.row_function);
      END IF;
      IF cfg.truncate_function IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = t.oid AND tgname = '~pgfence_backstop_truncate') THEN
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION pgfence.%I()',
          '~pgfence_backstop_truncate', t.rel, cfg.truncate_function);
      END IF;
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'pgfence: could not put the backstop on table %: %', t.rel, SQLERRM
        USING HINT = 'pgfence puts it there at its next discovery; until then only writes through pgfence are fenced';
    END;
  END LOOP;
END
$pgfence$`,
}

// watchDDL keeps the event trigger and its configuration: discovered is
// the function a discovered table's row trigger runs (its column is
// column), truncate the TRUNCATE trigger's ("" when TRUNCATE is allowed).
// It returns why the event trigger is not in place, or "".
func watchDDL(ctx context.Context, tx pgx.Tx, column, discovered, truncate string) (string, error) {
	// Created again only when missing or not as written here: CREATE OR
	// REPLACE at every discovery would write the catalog every minute.
	_, body, _ := strings.Cut(ddlSQL[2], "$pgfence$")
	body, _, _ = strings.Cut(body, "$pgfence$")
	var current bool
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.to_regclass('pgfence.ddl_backstop') IS NOT NULL AND EXISTS (
		SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'pgfence' AND p.proname = 'on_ddl' AND p.prosrc = $1)`, body).Scan(&current); err != nil {
		return "", err
	}
	for _, sql := range ddlSQL {
		if current {
			break
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("creating the DDL watch: %w", err)
		}
	}
	var trunc *string
	if truncate != "" {
		trunc = &truncate
	}
	if _, err := tx.Exec(ctx, `INSERT INTO pgfence.ddl_backstop (epoch_column, row_function, truncate_function) VALUES ($1, $2, $3)
		ON CONFLICT (one) DO UPDATE SET epoch_column = excluded.epoch_column, row_function = excluded.row_function, truncate_function = excluded.truncate_function
		WHERE (pgfence.ddl_backstop.epoch_column, pgfence.ddl_backstop.row_function, pgfence.ddl_backstop.truncate_function)
		      IS DISTINCT FROM (excluded.epoch_column, excluded.row_function, excluded.truncate_function)`, column, discovered, trunc); err != nil {
		return "", fmt.Errorf("recording the DDL watch's configuration: %w", err)
	}
	var super bool
	var enabled *string
	if err := tx.QueryRow(ctx, `SELECT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = CURRENT_USER),
		(SELECT evtenabled::text FROM pg_catalog.pg_event_trigger WHERE evtname = $1)`, EventTrigger).Scan(&super, &enabled); err != nil {
		return "", err
	}
	switch {
	case enabled != nil && *enabled == "O":
		return "", nil
	case !super:
		return "the role pgfence connects as is not a superuser, so it cannot create the event trigger " + EventTrigger +
			": a table that gets the epoch column by DDL outside pgfence is fenced from pgfence's next read of the catalog on; " +
			"a superuser can run 'pgfence init' once to create it", nil
	case enabled != nil:
		_, err := tx.Exec(ctx, "ALTER EVENT TRIGGER "+ident(EventTrigger)+" ENABLE")
		return "", err
	}
	_, err := tx.Exec(ctx, "CREATE EVENT TRIGGER "+ident(EventTrigger)+
		" ON ddl_command_end WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE TABLE AS', 'SELECT INTO') EXECUTE FUNCTION pgfence.on_ddl()")
	return "", err
}
