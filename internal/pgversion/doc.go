// Package pgversion says which Postgres a connection reaches and what
// pgfence does on it. pgfence decides each version-dependent behaviour
// from the server's server_version_num, read when it starts and at each
// read of the catalog, rather than finding it out from a failed statement:
//
//   - PostgreSQL 13 and older are refused at start, with a message naming
//     the version: the database backstop creates and replaces its triggers
//     with CREATE OR REPLACE TRIGGER, and --upstream's
//     target_session_attrs=read-write reads in_hot_standby, both new in 14.
//     Supporting 13 would take a second way of installing the backstop
//     (DROP and CREATE TRIGGER in one transaction, which takes owning the
//     table, not the TRIGGER privilege alone) and of finding the primary,
//     for a version past its end of life (November 2025).
//   - GRANT SET ON PARAMETER (15 on) lets roles other than superusers set
//     session_replication_role, under which no trigger fires: the backstop
//     reads who may only where the privilege exists (HasParameterPrivileges).
//   - MERGE (15 on) is the server's to refuse on 14, as without pgfence.
//   - A server newer than the grammar pgfence reads SQL with (see
//     sqlrewrite) gets the version skew's refusal for what pgfence cannot
//     read; a major newer than Newest, which pgfence was not tested on, is
//     served, and pgfence says so in its log.
//   - in_hot_standby, which the proxy's primary check reads from the
//     server's ParameterStatus, is reported from 14: every supported
//     version has it.
//   - BEGIN ATOMIC function bodies (14 on) are written by the backstop's
//     paths tests; every supported version has them.
//
// The tests decide by the version too (pgtest.Version, pgtest.NeedVersion),
// and make test-versions runs them on every supported major.
package pgversion
