package backstop

import (
	"slices"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// setupSQL creates pgfence's schema objects, or brings them up to date:
// schemaSQL's, the DDL guard's (guardSQL) and the discovery watch's
// function (onDDLSQL). Every statement is idempotent; Install runs them
// under an advisory lock, so two pgfence instances starting at once do not
// trip over each other.
var setupSQL = slices.Concat(schemaSQL, guardSQL, []string{onDDLSQL})

// schemaSQL: lock domains, counters and the trigger's helpers.
//
// PUBLIC gets USAGE on the schema (to reach the helpers below) and
// SELECT, UPDATE on pgfence.domains (the rewriter's claim is an UPDATE of
// the domain's row in the writer's own statement); domains_guard keeps
// that UPDATE from ever lowering a token or renaming a domain, and keeps
// rows from being deleted, except by the table's owner (pgfence's role).
// A role that writes no table of a domain can still raise its token, or
// hold its row: a DBA may grant the table to the writers alone, which
// setup then leaves as it is.
//
// The schema is created only when it is missing: CREATE SCHEMA IF NOT
// EXISTS asks for the CREATE privilege on the database even then, and a
// DBA may create it for pgfence's role instead (CREATE SCHEMA pgfence
// AUTHORIZATION <role>).
var schemaSQL = []string{
	`DO $pgfence$ BEGIN
  IF pg_catalog.to_regnamespace('pgfence') IS NULL THEN
    CREATE SCHEMA pgfence;
  END IF;
END $pgfence$`,
	`GRANT USAGE ON SCHEMA pgfence TO PUBLIC`,
	// Granted when the table is made, not at every setup, so that a DBA's
	// narrower grants stand (see docs/lock-domains.md).
	`DO $pgfence$ BEGIN
  IF pg_catalog.to_regclass('pgfence.domains') IS NULL THEN
    CREATE TABLE pgfence.domains (domain text PRIMARY KEY, token bigint NOT NULL);
    GRANT SELECT, UPDATE ON pgfence.domains TO PUBLIC;
  END IF;
END $pgfence$`,
	`CREATE TABLE IF NOT EXISTS pgfence.domain_members (
		relid regclass PRIMARY KEY,
		domain text NOT NULL REFERENCES pgfence.domains)`,
	// Membership and counters are no secret: any role may read them, so
	// that a pgfence instance with a reader role can discover.
	`GRANT SELECT ON pgfence.domain_members TO PUBLIC`,
	`ALTER DEFAULT PRIVILEGES IN SCHEMA pgfence GRANT SELECT ON SEQUENCES TO PUBLIC`,
	`CREATE SEQUENCE IF NOT EXISTS pgfence.exempt_writes`,
	`GRANT SELECT ON SEQUENCE pgfence.exempt_writes TO PUBLIC`,
	`CREATE OR REPLACE FUNCTION pgfence.domains_guard() RETURNS trigger
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $pgfence$
BEGIN
  IF pg_has_role(CURRENT_USER, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
  END IF;
  RAISE EXCEPTION USING ERRCODE = '42501',
    MESSAGE = format('pgfence: a lock domain''s token only grows, and its row is pgfence''s: %s of pgfence.domains refused', TG_OP),
    HINT = 'lock domains change through pgfence: write guarded tables with a fencing token, or run pgfence init as pgfence''s role';
END
$pgfence$`,
	// AFTER, with a WHEN clause: a claim (the token raised, or kept) is
	// checked when the event would be queued, without a call and without
	// the row lock a BEFORE row trigger takes first (that cost a lock-domain
	// write 10-15 % in a bare loop of claims). An error raised after the
	// row is written still undoes the statement.
	`DROP TRIGGER IF EXISTS domains_guard ON pgfence.domains`,
	`DROP TRIGGER IF EXISTS domains_guard_update ON pgfence.domains`,
	`DROP TRIGGER IF EXISTS domains_guard_delete ON pgfence.domains`,
	`CREATE TRIGGER domains_guard_update AFTER UPDATE ON pgfence.domains
		FOR EACH ROW WHEN (NEW.domain IS DISTINCT FROM OLD.domain OR NEW.token < OLD.token)
		EXECUTE FUNCTION pgfence.domains_guard()`,
	`CREATE TRIGGER domains_guard_delete AFTER DELETE ON pgfence.domains
		FOR EACH ROW EXECUTE FUNCTION pgfence.domains_guard()`,
	`CREATE OR REPLACE TRIGGER domains_guard_truncate BEFORE TRUNCATE ON pgfence.domains
		FOR EACH STATEMENT EXECUTE FUNCTION pgfence.domains_guard()`,
	// claim_domain is the backstop's claim of a lock domain for token tok:
	// the rewriter's WITH query as a function. The row lock serialises the
	// domain's writers until they commit; under READ COMMITTED a waiter
	// reads the token the other writer committed.
	`CREATE OR REPLACE FUNCTION pgfence.claim_domain(d text, tok bigint) RETURNS boolean
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  cur bigint;
BEGIN
  SELECT token INTO cur FROM pgfence.domains WHERE domain = d FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = format('pgfence: lock domain "%s" has no row in pgfence.domains, so no write to its tables can be checked', d),
      HINT = format('start pgfence serve with the domain configured, or run: pgfence init --domain %s', d);
  END IF;
  IF cur > tok THEN
    RETURN false;
  END IF;
  IF cur < tok THEN
    UPDATE pgfence.domains SET token = tok WHERE domain = d;
  END IF;
  RETURN true;
END
$pgfence$`,
	// note_reject counts a stale row in the table's sequence (kept even
	// if the transaction rolls back) and, in enforce mode, raises one
	// notice per statement and table, which pgfence takes from its own
	// sessions' replies to count them as its rejects. The notice carries
	// the statement's time and a mark of it keyed with pgfence's secret
	// (see NoticeMark), so that pgfence counts no notice a client raised
	// itself, nor one it raised again. It is sent whatever the session's
	// client_min_messages (the function sets it for its own run): a client
	// that turned notices off, or a role with ALTER ROLE ... SET
	// client_min_messages = warning, would otherwise hide its rejects from
	// pgfence.
	`CREATE OR REPLACE FUNCTION pgfence.note_reject(rel oid, kind text, mode text, epoch bigint, tok bigint) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET client_min_messages = notice AS $pgfence$
DECLARE
  seq regclass := to_regclass('pgfence.' || quote_ident('rejects_' || rel));
  at int8 := (extract(epoch FROM statement_timestamp()) * 1000000)::int8;
  k text;
  sch name;
  tbl name;
BEGIN
  -- Only a trigger notes anything: this helper is PUBLIC's, as the
  -- backstop's triggers run as the writer, and a client's own statement
  -- that called it would otherwise count (and mark) a reject that never
  -- was. (A trigger a client made on a table of its own still can: see
  -- docs/backstop.md.)
  IF pg_trigger_depth() = 0 THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = 'pgfence: pgfence.note_reject is the database backstop''s; only its triggers call it';
  END IF;
  IF seq IS NOT NULL THEN
    PERFORM nextval(seq);
  END IF;
  -- A shadow write lands: pgfence's rewrite of it, if it had one, counted
  -- it already, and a notice would count it twice.
  IF mode = 'shadow' THEN
    RETURN;
  END IF;
  -- One notice per statement and table: the mark is keyed with pgfence's
  -- secret, so that a client cannot set it ahead to hide the notice.
  SELECT md5(s.key || ' ' || at || ' ' || rel || ' ' || kind) INTO k FROM pgfence.secret s;
  IF current_setting('pgfence.noticed', true) IS DISTINCT FROM k THEN
    PERFORM set_config('pgfence.noticed', k, true);
    SELECT n.nspname, c.relname INTO sch, tbl FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
    RAISE NOTICE USING ERRCODE = 'PF010',
      MESSAGE = format('pgfence: stale write %s on guarded table %I.%I: %s',
        CASE mode WHEN 'shadow' THEN 'would have been skipped' ELSE 'skipped' END, sch, tbl,
        CASE kind WHEN 'domain' THEN format('its lock domain has a token above %s', tok)
                  ELSE format('a row''s epoch %s is above the token %s', epoch, tok) END),
      DETAIL = format('kind=%s mode=%s epoch=%s token=%s rel=%s at=%s mark=%s', kind, mode, coalesce(epoch::text, ''), tok, rel, at, k),
      SCHEMA = sch, TABLE = tbl;
  END IF;
END
$pgfence$`,
	// note_stale is how a write pgfence rewrote raises a stale row's flag
	// where the database has it (sqlrewrite.Config.StaleNotice): as
	// set_config(flag, value, true) does, returning value; and, in a
	// transaction whose probe pgfence leaves out (sqlrewrite.QuietSetting
	// is on), with a notice whose detail is the flag's name and value,
	// which pgfence takes from its session's replies instead
	// (sqlrewrite.ParseStaleNotice). It runs only for stale rows. A notice
	// costs the writer a send of its own (Postgres flushes each at once),
	// so it is raised only where it is read. It counts nothing and runs as
	// its caller: a client that calls it raises a flag of its own
	// transaction, as it could with set_config, and pgfence counts such a
	// notice only during one of the client's own fenced writes, for that
	// write's tables. Every name is schema-qualified, so that it needs no
	// search_path of its own (a function's SET costs every call).
	`CREATE OR REPLACE FUNCTION pgfence.note_stale(flag text, value text) RETURNS text
	LANGUAGE plpgsql AS $pgfence$
BEGIN
  PERFORM pg_catalog.set_config(flag, value, true);
  IF pg_catalog.current_setting('` + sqlrewrite.QuietSetting + `', true) OPERATOR(pg_catalog.=) 'on' THEN
    PERFORM pgfence.raise_stale(flag, value);
  END IF;
  RETURN value;
END
$pgfence$`,
	// raise_stale raises note_stale's notice, whatever the session's
	// client_min_messages (as note_reject's).
	`CREATE OR REPLACE FUNCTION pgfence.raise_stale(flag text, value text) RETURNS void
	LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = notice AS $pgfence$
BEGIN
  RAISE NOTICE USING ERRCODE = '` + sqlrewrite.StaleNoticeCode + `',
    MESSAGE = 'pgfence: a stale row was left unchanged', DETAIL = flag || ' ' || value;
END
$pgfence$`,
	// note_exempt counts a row written by an exempt role and logs the
	// first of each statement and table in the server log (audit).
	`CREATE OR REPLACE FUNCTION pgfence.note_exempt(rel oid, who name) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgfence$
DECLARE
  k text;
BEGIN
  -- As note_reject: only a trigger notes anything.
  IF pg_trigger_depth() = 0 THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = 'pgfence: pgfence.note_exempt is the database backstop''s; only its triggers call it';
  END IF;
  PERFORM nextval('pgfence.exempt_writes');
  -- As note_reject's mark: a client cannot set it ahead to hide the line.
  SELECT md5(s.key || ' ' || statement_timestamp() || ' ' || rel) INTO k FROM pgfence.secret s;
  IF current_setting('pgfence.exempt_noted', true) IS DISTINCT FROM k THEN
    PERFORM set_config('pgfence.exempt_noted', k, true);
    RAISE LOG 'pgfence: role % (session user %) wrote guarded table % without the fence: it is an exempt role', who, session_user, rel::regclass;
  END IF;
END
$pgfence$`,
}
