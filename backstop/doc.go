// Package backstop keeps pgfence's fence inside Postgres: triggers on every
// guarded table that enforce the rule the rewriter splices into the SQL it
// sees, for the writes it cannot see (views, functions, procedures, DO
// blocks, rules, triggers of other tables, foreign-key cascades, writes
// through an inheritance parent, and sessions connected straight to
// Postgres).
//
// # What is installed
//
// In the schema pgfence (owned by pgfence's upstream role):
//
//   - pgfence.domains, one row per lock domain, and pgfence.domain_members,
//     which table is in which domain. A trigger on pgfence.domains lets a
//     domain's token only grow and its rows never go, except for their
//     owner, so the UPDATE that the rewriter's claim needs can be granted
//     to PUBLIC without letting any writer lower a token.
//   - pgfence.claim_domain, note_reject and note_exempt: SECURITY DEFINER
//     helpers, so that application roles need no grants on pgfence's
//     counters or domain rows. The row triggers run as the writer, so
//     PUBLIC may call the helpers; note_reject and note_exempt refuse a
//     call from outside any trigger (pg_trigger_depth() = 0), so that a
//     client cannot count a reject, or write an audit line, by calling one
//     in a statement of its own. A trigger a client makes on a table it
//     owns can still call them: telling that trigger from the backstop's
//     would take the row triggers running as pgfence's role (SECURITY
//     DEFINER), which would lose the writer's role that the exempt-role
//     check reads (CURRENT_USER); the call stack (PG_CONTEXT) cannot tell
//     them apart, as it quotes the caller's statement text, which the
//     client writes.
//   - One row trigger function per distinct guard configuration, named
//     backstop_<hash of its body>: the configuration is baked into the
//     body (column, token setting, rollout, missing-token policy, lock
//     domain, exempt roles, pooled roles), so a function's name says what it enforces
//     and drift (a body edited by hand) shows as a mismatch.
//   - One reject counter per guarded table, the sequence rejects_<oid>:
//     sequences are not transactional, so a reject is counted even when its
//     transaction rolls back, and counting takes no row lock.
//   - The recorded configuration (record.go): pgfence.settings (token
//     setting, exempt roles, pooled roles, TRUNCATE) and pgfence.guarded, one row per
//     guarded table by oid (epoch column, rollout, missing-token policy,
//     lock domain, and the functions its triggers run).
//   - pgfence.secret, a key only pgfence's role reads, with which
//     note_reject and note_exempt key their once-per-statement marks: a
//     client can set the mark's setting, but not to a value that hides
//     the next notice or audit line.
//   - The DDL guard's functions (guard.go): backstop_problem, guard_of,
//     guard_ddl, guard_drop, refuse_weakened, mend_backstops.
//
// With discovery on, and when pgfence's role is a superuser, the event
// trigger pgfence_backstop_ddl (on_ddl, configured by the one row of
// pgfence.ddl_backstop) puts the backstop on a table as soon as DDL gives it
// the discovered epoch column, on any connection, so that a migration run
// straight to Postgres leaves no window until the next discovery. It runs
// as the role that ran the DDL (the new table's owner), and turns what it
// cannot do into a warning: a failing event trigger would fail every
// CREATE TABLE in the database.
//
// On each guarded table:
//
//   - "~pgfence_backstop", BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW.
//     BEFORE triggers fire in name order; "~" sorts after every letter and
//     digit, so the backstop sees (and stamps) the row as the other BEFORE
//     triggers leave it. On a partitioned table it is created once on the
//     table, named "~pgfence_backstop_p<oid>", and Postgres clones it to
//     every partition, present and future. The names differ so that a
//     clone never meets a trigger of the same name: ATTACH PARTITION of a
//     table that has a backstop of its own (one detached, or created for
//     the purpose and discovered) fails on such a meeting.
//   - "~pgfence_backstop_truncate", BEFORE TRUNCATE FOR EACH STATEMENT,
//     refusing TRUNCATE unless it is allowed.
//   - "~pgfence_epoch", BEFORE UPDATE OF <epoch column> FOR EACH STATEMENT
//     WHEN (false): it never runs, but a trigger naming a column makes
//     Postgres refuse to change the column's type (ALTER COLUMN ... TYPE
//     bigint USING 0 would reset every epoch) or to drop it without
//     CASCADE, on every connection and for every role.
//
// # Nothing weakens the backstop unseen
//
// Reconcile and the DDL guard judge a table's backstop by one function,
// backstop_problem: its triggers in place, enabled, of pgfence's shape
// (events, timing, level, no WHEN, no column list, no arguments: all that
// pg_get_triggerdef prints, compared field by field), running unedited
// functions of pgfence's (a function's name ends with its body's hash), no
// BEFORE row trigger firing after the backstop's, and the epoch column
// there and tied. Every trigger named as pgfence names its row triggers
// is held to that, not only the one that fires first: a name is only a
// name, and one a writer took ("~pgfence_backstop_p1" on a plain table)
// would fire after the backstop and could lower the epoch it stamps. So
// such a trigger must be a partition's clone of an ancestor's, or the
// table's own under the name pgfence gives it. A clone must run the
// function the partition's own configuration wants: a table in a lock
// domain attached under a parent outside it would otherwise be fenced as
// the parent is. Reconcile keeps (or gives) such a partition a trigger of
// its own, which fires before the clone and fences it as configured. Roles that may set session_replication_role (GRANT SET
// ON PARAMETER, Postgres 15 on) make every table not OK too.
//
// When pgfence's role is a superuser, Install keeps three event triggers,
// pgfence_guard_ddl (ddl_command_end of ALTER TABLE, CREATE and ALTER
// TRIGGER, CREATE and ALTER FUNCTION) and pgfence_guard_drop (sql_drop),
// which fail a command, rolling it back, when a guarded table it touched
// (or its partitions) then has a problem, and pgfence_guard_rewrite
// (table_rewrite), which fails one that rewrites a guarded table's column
// values (ALTER COLUMN ... TYPE: its USING is a write of every row that no
// row trigger sees), unless the role running it is
// pgfence's own (the owner of schema pgfence, or a member of it; not any
// superuser) or a recorded exempt role. They run as that role, and read
// only what PUBLIC may. They judge only the tables the command touched:
// another table's broken backstop never fails an unrelated migration.
// Before judging an ALTER TABLE, guard_ddl mends what Postgres itself
// undid for a legitimate command: a partition detached, whose clone of
// its parent's row trigger Postgres dropped, gets one of its own at once;
// a table attached under a guarded parent drops its own once it has the
// clone. Event triggers do not fire on event triggers, on shared objects
// (roles, GRANT ON PARAMETER) or under session_replication_role =
// replica; only superusers can drop them.
//
// on_ddl, the discovery watch, runs as pgfence's role (SECURITY DEFINER):
// the guard judges each trigger it creates as it creates them, and lets
// only pgfence's and the exempt roles through the states in between.
//
// Install never queues behind an open transaction: a writer queued behind
// pgfence's lock request would wait too. Each table's DDL runs with a
// lock_timeout of 1 ms (LOCK TABLE ... NOWAIT would take more than the
// TRIGGER privilege), and a table it could not lock is reported with
// Retry, for serve to try again soon.
//
// # Privileges
//
// pgfence's role needs its schema (the CREATE privilege on the database,
// or a schema pgfence made for it) and the TRIGGER privilege on each
// guarded table and partition: creating, replacing and enabling again a
// trigger (CREATE OR REPLACE TRIGGER enables it) take no more. Dropping
// one, or enabling a partition's clone (ALTER TABLE), takes owning the
// table, and Install does it only when a configuration or an older
// version's naming asks for it. What it lacks, Install reports as the
// GRANT statements that would give it (privileges.go).
//
// # The rule
//
// The row trigger reads the token as the rewriter does (the domain's own
// setting, then the general one; both set and different is an error), and
// then, in enforce mode: an INSERT is stamped with the token (a forged
// epoch is overwritten); an UPDATE or DELETE of a row whose epoch is above
// the token is skipped (the statement reports one row fewer) and counted,
// and an UPDATE that passes stamps the token. Skipping is only right at
// the top level of a statement: a row written by another trigger (a
// foreign-key cascade is one) cannot be skipped without leaving the parent's
// write half done (an orphan), so there (pg_trigger_depth() > 1) a stale
// row is counted and fails the statement with SQLSTATE PF002. A missing
// token fails the write with 55000, or, with the allow policy
// (Guard.AllowMissingToken), lets it through unfenced: an UPDATE keeps the
// row's epoch and an INSERT is stamped 0, as the rewriter stamps it. In
// shadow mode nothing is
// skipped: stale rows are counted and keep their epoch (never lowered).
// Observe tables get no backstop. For a table in a lock domain (enforce),
// each row also claims the domain through claim_domain, which locks the
// domain's row (FOR NO KEY UPDATE) as the rewriter's WITH query does, so
// the check and the claim are one step and concurrent writers serialise.
//
// Every expression in the trigger names its operators and functions with
// their schema (OPERATOR(pg_catalog.>)): the trigger runs with the
// writer's search_path, which could otherwise put an operator of the
// writer's own ahead of pg_catalog's. The trigger itself is SECURITY
// INVOKER, so that current_user is the writer's role (for exempt roles)
// and a call costs no configuration switch.
//
// # What it does not cover
//
// Triggers do not fire when session_replication_role is replica, which is
// what logical-replication apply runs with: the publisher already fenced
// those writes. Only superusers (and roles granted SET on it, which make
// the backstop not OK) can set it. Without the DDL guard (pgfence's role
// is not a superuser), the table's owner can still drop, disable or change
// the backstop's triggers and the epoch column; Reconcile (Verify) reports
// it as drift at its next read, and Reconcile (Install) mends the
// triggers, but writes in between are not fenced by Postgres. A BEFORE
// row trigger whose name sorts after the backstop's would fire after it
// and could change the epoch: the table is not OK until it is renamed (and
// the guard refuses to create one).
//
// Exempt roles are matched on current_user: a SECURITY DEFINER function
// owned by an exempt role writes unfenced for whoever calls it. Helpers
// and counters can be called by any role (the trigger runs as the writer):
// a writer can raise a domain's token or a reject count, never lower one.
//
// A table partitioned by its epoch column cannot take an INSERT whose
// epoch the trigger changes (Postgres does not move a row to another
// partition from a BEFORE trigger): such an INSERT that pgfence did not
// stamp itself (a direct session, a function, COPY) fails. It fails
// closed.
//
// Two stale statements of one simple-protocol Query raise one notice per
// table (statement_timestamp() is the Query's): pgfence then counts one
// reject through the notice, where the database's counter has every row.
//
// Setup marks the schema with the version of its objects and skips them
// while the mark matches: a helper edited by hand (claim_domain, say) is
// not found out; the trigger functions are checked at every Reconcile.
package backstop
