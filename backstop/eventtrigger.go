package backstop

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// EventTrigger is the event trigger that puts the backstop on a table the
// moment DDL gives it the discovered epoch column, whoever runs the DDL and
// whichever way it reaches Postgres. Only a superuser may create event
// triggers: without it, such a table is guarded at pgfence's next
// discovery (at once when the DDL came through pgfence).
const EventTrigger = "pgfence_backstop_ddl"

// onDDLSQL is the function EventTrigger runs (part of setupSQL). It reads
// the one row of pgfence.ddl_backstop (the epoch column discovery looks
// for and the functions a discovered table's triggers run, which
// Reconcile keeps), and turns what it cannot do into a warning, never a
// failed DDL: a broken event trigger would stop every CREATE TABLE in the
// database. It runs as pgfence's role (SECURITY DEFINER, a superuser where
// the event trigger exists): the DDL guard checks each trigger it creates
// as it creates them one by one, and lets only pgfence's role and the
// exempt ones through the states in between. A new partition of a guarded
// table has the row trigger cloned from its parent already, and gets only
// the others.
const onDDLSQL = `CREATE OR REPLACE FUNCTION pgfence.on_ddl() RETURNS event_trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgfence$
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
    SELECT DISTINCT c.oid, c.oid::regclass AS rel, c.relkind
    FROM pg_event_trigger_ddl_commands() d
    JOIN pg_class c ON c.oid = d.objid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = cfg.epoch_column AND a.attnum > 0 AND NOT a.attisdropped
    WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p')
      AND a.atttypid IN ('int8'::regtype, 'int4'::regtype, 'int2'::regtype)
      AND n.nspname NOT IN ('pgfence', 'pg_catalog', 'information_schema') AND n.nspname NOT LIKE E'pg\\_%'
  LOOP
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = t.oid AND (tgname = '~pgfence_backstop' OR tgname ~ '^~pgfence_backstop_p[0-9]+$')) THEN
        EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.%I()',
          CASE t.relkind WHEN 'p' THEN '~pgfence_backstop_p' || t.oid ELSE '~pgfence_backstop' END, t.rel, cfg.row_function);
      END IF;
      IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = t.oid AND tgname = '~pgfence_epoch') THEN
        EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OF %I ON %s FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION pgfence.epoch_guard()',
          '~pgfence_epoch', cfg.epoch_column, t.rel);
      END IF;
      IF to_regclass(format('pgfence.%I', 'rejects_' || t.oid)) IS NULL THEN -- IF NOT EXISTS alone would tell the client so at every ALTER TABLE
        EXECUTE format('CREATE SEQUENCE IF NOT EXISTS pgfence.%I', 'rejects_' || t.oid);
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
$pgfence$`

// eventTriggers are the event triggers Install keeps, by name: the DDL
// guard's (always) and the discovery watch (with discovery on).
var eventTriggers = map[string]string{
	GuardTrigger: "ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'CREATE FUNCTION', 'ALTER FUNCTION') " +
		"EXECUTE FUNCTION pgfence.guard_ddl()",
	DropGuardTrigger:    "ON sql_drop EXECUTE FUNCTION pgfence.guard_drop()",
	RewriteGuardTrigger: "ON table_rewrite EXECUTE FUNCTION pgfence.guard_rewrite()",
	EventTrigger: "ON ddl_command_end WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE TABLE AS', 'SELECT INTO') " +
		"EXECUTE FUNCTION pgfence.on_ddl()",
}

// keepEventTrigger creates or enables the event trigger name when the
// role is a superuser, and returns why it is not in place, or "".
func keepEventTrigger(ctx context.Context, tx pgx.Tx, name string, super bool) (string, error) {
	var enabled *string
	if err := tx.QueryRow(ctx, `SELECT evtenabled::text FROM pg_catalog.pg_event_trigger WHERE evtname = $1`, name).Scan(&enabled); err != nil && err != pgx.ErrNoRows {
		return "", err
	}
	switch {
	case enabled != nil && *enabled == "O":
		return "", nil
	case !super:
		return "the role pgfence connects as is not a superuser, so it cannot create the event trigger " + name, nil
	case enabled != nil:
		_, err := tx.Exec(ctx, "ALTER EVENT TRIGGER "+ident(name)+" ENABLE")
		return "", err
	}
	_, err := tx.Exec(ctx, "CREATE EVENT TRIGGER "+ident(name)+" "+eventTriggers[name])
	return "", err
}

// watchDDL keeps the discovery watch and its configuration: d is the
// configuration of tables found by their epoch column in force (the
// recorded one, unless there is none or it is being replaced: see
// recorded.discovered), discovered the function a discovered table's row
// trigger runs, truncate the TRUNCATE trigger's ("" when TRUNCATE is
// allowed). The functions follow the version's bodies: a newer pgfence
// records its own for the same configuration. It returns why the event
// trigger is not in place, or "".
func watchDDL(ctx context.Context, tx pgx.Tx, d sqlrewrite.Guard, discovered, truncate string, super bool) (string, error) {
	var trunc *string
	if truncate != "" {
		trunc = &truncate
	}
	if _, err := tx.Exec(ctx, `INSERT INTO pgfence.ddl_backstop (epoch_column, row_function, truncate_function, rollout, allow_missing) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (one) DO UPDATE SET epoch_column = excluded.epoch_column, row_function = excluded.row_function, truncate_function = excluded.truncate_function,
		    rollout = excluded.rollout, allow_missing = excluded.allow_missing
		WHERE (pgfence.ddl_backstop.epoch_column, pgfence.ddl_backstop.row_function, pgfence.ddl_backstop.truncate_function, pgfence.ddl_backstop.rollout, pgfence.ddl_backstop.allow_missing)
		      IS DISTINCT FROM (excluded.epoch_column, excluded.row_function, excluded.truncate_function, excluded.rollout, excluded.allow_missing)`,
		d.Column, discovered, trunc, d.Rollout.String(), d.AllowMissingToken); err != nil {
		return "", fmt.Errorf("recording the DDL watch's configuration: %w", err)
	}
	why, err := keepEventTrigger(ctx, tx, EventTrigger, super)
	if why != "" {
		why += ": a table that gets the epoch column by DDL outside pgfence is fenced from pgfence's next read of the catalog on; " +
			"a superuser can run 'pgfence init' once to create it"
	}
	return why, err
}
