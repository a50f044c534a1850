package backstop

// The DDL guard: see "Nothing weakens the backstop unseen" in doc.go.

// Names of the guard's pieces.
const (
	// EpochTrigger is the statement trigger that ties the epoch column to
	// the table's backstop: a trigger whose column list names a column
	// makes Postgres refuse to change that column's type
	// ("cannot alter type of a column used in a trigger definition") or
	// drop it without CASCADE, on every connection. WHEN (false): it never
	// runs.
	EpochTrigger = "~pgfence_epoch"
	// GuardTrigger and DropGuardTrigger are the event triggers that
	// refuse DDL weakening the backstop (ddl_command_end and sql_drop);
	// RewriteGuardTrigger refuses DDL that rewrites a guarded table's
	// column values (table_rewrite), which no row trigger sees.
	GuardTrigger        = "pgfence_guard_ddl"
	DropGuardTrigger    = "pgfence_guard_drop"
	RewriteGuardTrigger = "pgfence_guard_rewrite"
)

// guardTriggers are the event triggers of the DDL guard.
var guardTriggers = []string{GuardTrigger, DropGuardTrigger, RewriteGuardTrigger}

// guardSQL creates the recorded configuration and what the DDL guard
// runs. It is part of setupSQL; the event triggers themselves are created
// by Reconcile (Install), as only a superuser may.
var guardSQL = []string{
	// The configuration every guarded table's backstop was installed
	// with: the first instance records it, 'pgfence init' replaces it,
	// and the others keep it (see record.go).
	`CREATE TABLE IF NOT EXISTS pgfence.settings (
		one boolean PRIMARY KEY DEFAULT true CHECK (one),
		token_setting text NOT NULL,
		allow_truncate boolean NOT NULL,
		exempt_roles name[] NOT NULL)`,
	`ALTER TABLE pgfence.settings ADD COLUMN IF NOT EXISTS pooled_roles name[] NOT NULL DEFAULT '{}'`,
	`GRANT SELECT ON pgfence.settings TO PUBLIC`,
	// One row per guarded table, by oid (which a rename keeps): its epoch
	// column, rollout, missing-token policy and lock domain, and the
	// functions its triggers run (row_function NULL: observe, no
	// backstop; truncate_function NULL: TRUNCATE allowed).
	`CREATE TABLE IF NOT EXISTS pgfence.guarded (
		relid oid PRIMARY KEY,
		epoch_column name NOT NULL,
		rollout text NOT NULL,
		allow_missing boolean NOT NULL,
		domain text,
		row_function name,
		truncate_function name)`,
	`GRANT SELECT ON pgfence.guarded TO PUBLIC`,
	// A key only pgfence's role can read: what its SECURITY DEFINER
	// helpers use to mark what a client must not be able to forge.
	`CREATE TABLE IF NOT EXISTS pgfence.secret (
		one boolean PRIMARY KEY DEFAULT true CHECK (one),
		key text NOT NULL)`,
	`REVOKE ALL ON pgfence.secret FROM PUBLIC`,
	`INSERT INTO pgfence.secret (key) VALUES (pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text) ON CONFLICT DO NOTHING`,
	// The configuration a table found by its epoch column gets, for the
	// event trigger that installs the backstop as DDL creates one (see
	// eventtrigger.go): one row, kept by Reconcile.
	`CREATE TABLE IF NOT EXISTS pgfence.ddl_backstop (
		one boolean PRIMARY KEY DEFAULT true CHECK (one),
		epoch_column name NOT NULL,
		row_function name NOT NULL,
		truncate_function name)`,
	// The configuration it was made from, besides the settings: the
	// function's name says its body, not the configuration, which is the
	// same from one version to the next while the body may not be. NULL:
	// recorded by a version before 0.1.0, which did not say (the next
	// Install records its own).
	`ALTER TABLE pgfence.ddl_backstop ADD COLUMN IF NOT EXISTS rollout text, ADD COLUMN IF NOT EXISTS allow_missing boolean`,
	`GRANT SELECT ON pgfence.ddl_backstop TO PUBLIC`,
	`CREATE OR REPLACE FUNCTION pgfence.epoch_guard() RETURNS trigger
	LANGUAGE plpgsql AS $pgfence$ BEGIN RETURN NULL; END $pgfence$`,
	// row_shaped: a row trigger as pgfence creates it: BEFORE INSERT OR
	// UPDATE OR DELETE, FOR EACH ROW, no WHEN, no column list, no
	// arguments, no transition tables, not a constraint trigger.
	`CREATE OR REPLACE FUNCTION pgfence.row_shaped(t pg_catalog.pg_trigger) RETURNS boolean
	LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $pgfence$
  SELECT t.tgtype = 31 AND t.tgqual IS NULL AND t.tgnargs = 0 AND cardinality(t.tgattr::int2[]) = 0 AND t.tgconstraint = 0
         AND t.tgoldtable IS NULL AND t.tgnewtable IS NULL
$pgfence$`,
	// unedited: a function whose body is the one its name was made from (the name ends with the first 16 hex digits of the body's
	// SHA-256, see named).
	`CREATE OR REPLACE FUNCTION pgfence.unedited(p pg_catalog.pg_proc) RETURNS boolean
	LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $pgfence$
  SELECT substr(encode(sha256(convert_to(p.prosrc, 'UTF8')), 'hex'), 1, 16) = right(p.proname, 16)
$pgfence$`,
	// backstop_problem says what keeps table rel's backstop from being
	// what it must be (NULL: nothing): its row trigger (want_row, NULL
	// for none) and TRUNCATE trigger (want_trunc) in place, enabled, of
	// the right shape (events, timing, level, no WHEN, no columns, no
	// arguments), running an unedited function of pgfence's (each
	// function's name ends with the hash of its body); no BEFORE row
	// trigger firing after the backstop's; the epoch column col there,
	// an integer, and tied to it by EpochTrigger. A partition's row
	// trigger may be the clone of a partitioned ancestor's, which runs
	// that ancestor's function. Go's drift check and the DDL guard both
	// ask it, so they cannot disagree.
	`CREATE OR REPLACE FUNCTION pgfence.backstop_problem(rel oid, col name, want_row name, want_trunc name) RETURNS text
	LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  kind "char";
  tbl text;
  att record;
  t record;
  fires name;
  after text;
BEGIN
  SELECT c.relkind, pg_catalog.format('%I.%I', n.nspname, c.relname) INTO kind, tbl
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
  IF NOT FOUND THEN
    RETURN NULL; -- dropped: nothing left to fence
  END IF;
  SELECT a.attnum, a.atttypid INTO att FROM pg_attribute a
  WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
  IF NOT FOUND THEN
    RETURN format('table %s has no epoch column %I (dropped or renamed)', tbl, col);
  END IF;
  IF att.atttypid NOT IN ('int8'::regtype, 'int4'::regtype, 'int2'::regtype) THEN
    RETURN format('the epoch column %I of table %s is of type %s, not an integer', col, tbl, format_type(att.atttypid, NULL));
  END IF;
  IF want_row IS NOT NULL THEN
    -- Every row trigger named as pgfence names its own must be one: a
    -- clone of an ancestor's, or the table's own under the name pgfence
    -- gives it. A name proves nothing by itself: anyone with TRIGGER on
    -- the table may take one, and "~pgfence_backstop_p1" would fire after
    -- the backstop and could lower the epoch it stamps. The one that
    -- fires last (by name) is the one whose check stands.
    FOR t IN
      SELECT tr.tgname, tr.tgparentid <> 0 AS cloned, tr.tgenabled, p.proname, n.nspname,
             pgfence.row_shaped(tr) AS shaped, pgfence.unedited(p) AS unedited, pg_get_triggerdef(tr.oid) AS def
      FROM pg_trigger tr JOIN pg_proc p ON p.oid = tr.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE tr.tgrelid = rel AND (tr.tgname = '~pgfence_backstop' OR tr.tgname ~ '^~pgfence_backstop_p[0-9]+$')
      ORDER BY tr.tgname COLLATE "C"
    LOOP
      fires := t.tgname;
      IF NOT t.cloned AND t.tgname <> (CASE kind WHEN 'p' THEN '~pgfence_backstop_p' || rel ELSE '~pgfence_backstop' END) THEN
        RETURN format('table %s has a row trigger named as pgfence names its backstop''s that is not pgfence''s (pgfence names the table''s own %I): %s; drop it or rename it',
          tbl, CASE kind WHEN 'p' THEN '~pgfence_backstop_p' || rel ELSE '~pgfence_backstop' END, t.def);
      END IF;
      IF NOT t.shaped THEN
        RETURN format('the backstop trigger of table %s is not as pgfence creates it (BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW, no WHEN, no column list): %s', tbl, t.def);
      END IF;
      IF t.nspname <> 'pgfence' OR t.proname NOT LIKE 'backstop\_%' THEN
        RETURN format('the backstop trigger of table %s runs %s.%s, not pgfence.%s (another pgfence configuration, or edited by hand)', tbl, t.nspname, t.proname, want_row);
      END IF;
      IF t.proname <> want_row THEN
        -- A clone runs its ancestor's configuration. One weaker than the
        -- partition's own (no lock domain, say, after ATTACH PARTITION
        -- under a new parent) would fence the partition less.
        RETURN CASE WHEN t.cloned THEN format('partition %s has the backstop of its partitioned ancestor (Postgres clones its row trigger), which runs pgfence.%s, not pgfence.%s as this table is configured: give the partitioned table this one''s configuration (the same lock domain, rollout and missing-token rule), or detach the partition', tbl, t.proname, want_row)
          ELSE format('the backstop trigger of table %s runs %s.%s, not pgfence.%s (another pgfence configuration, or edited by hand)', tbl, t.nspname, t.proname, want_row) END;
      END IF;
      IF NOT t.unedited THEN
        RETURN format('function pgfence.%s, the backstop of table %s, was edited by hand', t.proname, tbl);
      END IF;
      IF t.tgenabled <> 'O' THEN
        RETURN format('the backstop trigger of table %s is %s', tbl, CASE t.tgenabled
          WHEN 'D' THEN 'disabled: writes to it are not fenced by Postgres (ALTER TABLE ... DISABLE TRIGGER)'
          WHEN 'R' THEN 'enabled for replicas only: it fires only under session_replication_role = replica, so ordinary writes are not fenced by Postgres'
          WHEN 'A' THEN 'enabled always: it fires under session_replication_role = replica too, fencing logical-replication apply a second time'
          ELSE 'not enabled as pgfence installs it' END);
      END IF;
    END LOOP;
    IF fires IS NULL THEN
      RETURN format('table %s has no backstop trigger %I', tbl, CASE kind WHEN 'p' THEN '~pgfence_backstop_p' || rel ELSE '~pgfence_backstop' END);
    END IF;
    SELECT string_agg(quote_ident(tr.tgname), ', ' ORDER BY tr.tgname COLLATE "C") INTO after
    FROM pg_trigger tr
    WHERE tr.tgrelid = rel AND (NOT tr.tgisinternal OR tr.tgparentid <> 0) AND tr.tgenabled <> 'D' -- clones are internal up to 14
      AND tr.tgtype & 3 = 3 AND tr.tgtype & 20 <> 0 -- BEFORE ROW, INSERT or UPDATE
      AND tr.tgname COLLATE "C" > fires COLLATE "C"
      AND NOT (tr.tgname = '~pgfence_backstop' OR tr.tgname ~ '^~pgfence_backstop_p[0-9]+$');
    IF after IS NOT NULL THEN
      RETURN format('table %s has BEFORE row triggers that fire after the backstop''s and could change the epoch it stamps: %s; rename them so that their names sort before %I', tbl, after, fires);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger tr WHERE tr.tgrelid = rel AND tr.tgname = '~pgfence_epoch' AND cardinality(tr.tgattr::int2[]) = 1 AND tr.tgattr[0] = att.attnum) THEN
      RETURN format('table %s has no trigger %I tying its epoch column %I to the backstop (it keeps the column''s type from being changed)', tbl, '~pgfence_epoch', col);
    END IF;
  END IF;
  IF want_trunc IS NOT NULL THEN
    SELECT tr.tgenabled, p.proname, n.nspname,
           tr.tgtype = 34 AND tr.tgqual IS NULL AND tr.tgnargs = 0 AND cardinality(tr.tgattr::int2[]) = 0 AS shaped, -- BEFORE TRUNCATE, FOR EACH STATEMENT
           pgfence.unedited(p) AS unedited, pg_get_triggerdef(tr.oid) AS def
    INTO t
    FROM pg_trigger tr JOIN pg_proc p ON p.oid = tr.tgfoid JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE tr.tgrelid = rel AND tr.tgname = '~pgfence_backstop_truncate';
    IF NOT FOUND THEN
      RETURN format('table %s has no TRUNCATE backstop trigger %I', tbl, '~pgfence_backstop_truncate');
    END IF;
    IF NOT t.shaped OR t.nspname <> 'pgfence' OR t.proname <> want_trunc OR NOT t.unedited THEN
      RETURN format('the TRUNCATE backstop trigger of table %s is not pgfence''s (BEFORE TRUNCATE, FOR EACH STATEMENT, running pgfence.%s): %s', tbl, want_trunc, t.def);
    END IF;
    IF t.tgenabled <> 'O' THEN
      RETURN format('the TRUNCATE backstop trigger of table %s is %s', tbl, CASE t.tgenabled
        WHEN 'D' THEN 'disabled' WHEN 'R' THEN 'enabled for replicas only' WHEN 'A' THEN 'enabled always' ELSE 'not enabled as pgfence installs it' END);
    END IF;
  END IF;
  RETURN NULL;
END
$pgfence$`,
	// guard_of is what pgfence keeps on table rel: its recorded row, else
	// a partitioned ancestor's (a partition created since), else the
	// configuration of tables found by their epoch column (one created or
	// given the column since). No row: not guarded.
	`CREATE OR REPLACE FUNCTION pgfence.guard_of(rel oid, OUT epoch_column name, OUT row_function name, OUT truncate_function name)
	RETURNS SETOF record LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $pgfence$
  (SELECT g.epoch_column, g.row_function, g.truncate_function FROM pgfence.guarded g WHERE g.relid = rel
   UNION ALL
   SELECT g.epoch_column, g.row_function, g.truncate_function
   FROM pg_partition_ancestors(rel) a JOIN pgfence.guarded g ON g.relid = a.relid
   WHERE a.relid <> rel AND NOT EXISTS (SELECT 1 FROM pgfence.guarded h WHERE h.relid = rel)
   UNION ALL
   SELECT d.epoch_column, d.row_function, d.truncate_function
   FROM pgfence.ddl_backstop d
   JOIN pg_class c ON c.oid = rel AND c.relkind IN ('r', 'p')
   JOIN pg_namespace n ON n.oid = c.relnamespace
   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = d.epoch_column AND a.attnum > 0 AND NOT a.attisdropped
   WHERE a.atttypid IN ('int8'::regtype, 'int4'::regtype, 'int2'::regtype)
     AND n.nspname NOT IN ('pgfence', 'pg_catalog', 'information_schema') AND n.nspname NOT LIKE E'pg\\_%'
     AND NOT EXISTS (SELECT 1 FROM pgfence.guarded h WHERE h.relid = rel))
  LIMIT 1
$pgfence$`,
	// guard_ddl runs at the end of every DDL command that could weaken a
	// backstop (ALTER TABLE, CREATE and ALTER of triggers and functions;
	// guard_drop serves the drops), as the role that ran it. First it
	// mends what Postgres itself undoes on a legitimate command (see
	// mend_backstops). Then it fails the command, rolling it back, if a
	// table it touched has a backstop problem, unless the role is
	// pgfence's own or one of the recorded exempt roles (see
	// refuse_weakened).
	`CREATE OR REPLACE FUNCTION pgfence.guard_ddl() RETURNS event_trigger
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  rels oid[];
BEGIN
  IF TG_TAG = 'ALTER TABLE' THEN
    PERFORM pgfence.mend_backstops();
  END IF;
  SELECT array_agg(DISTINCT x.rel) INTO rels FROM (
    SELECT d.objid AS rel FROM pg_event_trigger_ddl_commands() d WHERE d.classid = 'pg_class'::regclass
    UNION ALL
    SELECT tr.tgrelid FROM pg_event_trigger_ddl_commands() d JOIN pg_trigger tr ON tr.oid = d.objid WHERE d.classid = 'pg_trigger'::regclass
    UNION ALL
    SELECT tr.tgrelid FROM pg_event_trigger_ddl_commands() d JOIN pg_trigger tr ON tr.tgfoid = d.objid WHERE d.classid = 'pg_proc'::regclass) x;
  PERFORM pgfence.refuse_weakened(rels, TG_TAG);
END
$pgfence$`,
	// guard_drop is guard_ddl for what a command dropped: triggers
	// (DROP TRIGGER, DROP FUNCTION ... CASCADE, DROP OWNED) and columns
	// (ALTER TABLE ... DROP COLUMN ... CASCADE) of tables that remain.
	`CREATE OR REPLACE FUNCTION pgfence.guard_drop() RETURNS event_trigger
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  rels oid[];
BEGIN
  SELECT array_agg(DISTINCT r) INTO rels FROM (
    SELECT to_regclass(format('%I.%I', o.address_names[1], o.address_names[2]))::oid AS r
    FROM pg_event_trigger_dropped_objects() o
    WHERE o.object_type IN ('trigger', 'table column') AND array_length(o.address_names, 1) = 3) x
  WHERE r IS NOT NULL;
  PERFORM pgfence.refuse_weakened(rels, TG_TAG);
END
$pgfence$`,
	// ddl_exempt says the role running a command may change what the
	// guard keeps: pgfence's own role (the owner of its schema or a
	// member of it, by membership, not as a superuser, who is a member of
	// every role), or one of the recorded exempt roles.
	`CREATE OR REPLACE FUNCTION pgfence.ddl_exempt() RETURNS boolean
	LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $pgfence$
  SELECT (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence') IN (
           WITH RECURSIVE m(r) AS (SELECT oid FROM pg_roles WHERE rolname = CURRENT_USER
                                   UNION SELECT a.roleid FROM pg_auth_members a JOIN m ON a.member = m.r)
           SELECT r FROM m)
      OR CURRENT_USER OPERATOR(pg_catalog.=) ANY (coalesce((SELECT s.exempt_roles FROM pgfence.settings s), '{}'))
$pgfence$`,
	// refuse_weakened fails the command if a guarded table among rels (or
	// their partitions) has a backstop problem, unless the role running
	// it is pgfence's own or an exempt one.
	`CREATE OR REPLACE FUNCTION pgfence.refuse_weakened(rels oid[], tag text) RETURNS void
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  t record;
  problem text;
BEGIN
  IF rels IS NULL OR pgfence.ddl_exempt() THEN
    RETURN;
  END IF;
  FOR t IN
    SELECT DISTINCT pt.relid, g.* FROM unnest(rels) r(rel)
    CROSS JOIN LATERAL (SELECT r.rel UNION SELECT tree.relid FROM pg_partition_tree(r.rel) tree) pt(relid)
    CROSS JOIN LATERAL pgfence.guard_of(pt.relid) g
  LOOP
    problem := pgfence.backstop_problem(t.relid, t.epoch_column, t.row_function, t.truncate_function);
    IF problem IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('pgfence: %s refused: it would leave a guarded table''s fence weaker: %s', tag, problem),
        DETAIL = format('role %s is neither pgfence''s own nor one of its exempt roles (--backstop-exempt-role)', CURRENT_USER),
        HINT = 'guarded tables keep their backstop triggers and epoch column; run this DDL as a role pgfence exempts, straight to Postgres, if it must change them';
    END IF;
  END LOOP;
END
$pgfence$`,
	// guard_rewrite refuses a table rewrite that sets a guarded table's
	// column values anew (ALTER TABLE ... ALTER COLUMN ... TYPE, whose
	// USING may give every row a value of its choosing): no row trigger
	// fires, so neither the rewrite nor the backstop fences it. A rewrite
	// for a new column's volatile default, or for the table's persistence
	// or access method, keeps the values there are.
	`CREATE OR REPLACE FUNCTION pgfence.guard_rewrite() RETURNS event_trigger
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  rel oid := pg_event_trigger_table_rewrite_oid();
BEGIN
  IF pg_event_trigger_table_rewrite_reason() & 4 = 0 -- AT_REWRITE_COLUMN_REWRITE
     OR NOT EXISTS (SELECT 1 FROM pgfence.guard_of(rel) g WHERE g.row_function IS NOT NULL)
     OR pgfence.ddl_exempt() THEN
    RETURN;
  END IF;
  RAISE EXCEPTION USING ERRCODE = '42501',
    MESSAGE = format('pgfence: %s refused: it rewrites a column''s values in guarded table %s (ALTER COLUMN ... TYPE, with any USING), which no fence checks: a stale lock holder could write every row with it', TG_TAG, rel::regclass),
    DETAIL = format('role %s is neither pgfence''s own nor one of its exempt roles (--backstop-exempt-role)', CURRENT_USER),
    HINT = 'run this DDL as a role pgfence exempts, straight to Postgres; a type change Postgres makes without a rewrite (varchar(10) to varchar(20), to text) is not refused';
END
$pgfence$`,
	// mend_backstops gives a guarded table that is no longer a partition
	// and has no row trigger of pgfence's (a partition just detached,
	// whose clone Postgres dropped) one of its own, and drops a table's
	// own row trigger once it has one cloned from an ancestor (a table just
	// attached). It runs as pgfence's role (a superuser where the guard is
	// in place): the owner of a partitioned table may detach a partition it
	// does not own. Anyone may call it; it only puts back what pgfence
	// keeps. A backstop it cannot put back fails the command (fail closed).
	`CREATE OR REPLACE FUNCTION pgfence.mend_backstops() RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  t record;
BEGIN
  FOR t IN
    WITH odd AS MATERIALIZED ( -- cheap first: guard_of only for these
      SELECT s.* FROM (
        SELECT c.oid, c.oid::regclass AS rel, c.relkind, c.relispartition,
               (SELECT tr.tgname FROM pg_trigger tr WHERE tr.tgrelid = c.oid AND tr.tgparentid = 0
                  AND (tr.tgname = '~pgfence_backstop' OR tr.tgname ~ '^~pgfence_backstop_p[0-9]+$') LIMIT 1) AS own,
               EXISTS (SELECT 1 FROM pg_trigger tr WHERE tr.tgrelid = c.oid AND tr.tgparentid <> 0
                  AND (tr.tgname = '~pgfence_backstop' OR tr.tgname ~ '^~pgfence_backstop_p[0-9]+$')) AS cloned
        FROM (SELECT g.relid FROM pgfence.guarded g WHERE g.row_function IS NOT NULL
              UNION -- every backstop has its epoch trigger, which is never cloned
              SELECT tr.tgrelid FROM pg_trigger tr WHERE tr.tgname = '~pgfence_epoch') x(relid)
        JOIN pg_class c ON c.oid = x.relid) s
      WHERE s.own IS NULL AND NOT s.cloned AND NOT s.relispartition OR s.own IS NOT NULL AND s.cloned)
    SELECT odd.*, g.row_function FROM odd CROSS JOIN LATERAL pgfence.guard_of(odd.oid) g
    WHERE g.row_function IS NOT NULL
  LOOP
    IF t.own IS NULL THEN
      EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION pgfence.%I()',
        CASE t.relkind WHEN 'p' THEN '~pgfence_backstop_p' || t.oid ELSE '~pgfence_backstop' END, t.rel, t.row_function);
    ELSE
      BEGIN
        EXECUTE format('DROP TRIGGER %I ON %s', t.own, t.rel);
      EXCEPTION WHEN OTHERS THEN
        -- Redundant, not missing: the next Reconcile drops it.
        RAISE WARNING 'pgfence: could not drop the backstop of table % that its parent''s covers: %', t.rel, SQLERRM;
      END;
    END IF;
  END LOOP;
END
$pgfence$`,
}
