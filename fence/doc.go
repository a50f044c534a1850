// Package fence is pgfence's policy: which tables are guarded, what a write
// to one becomes, how stale writes are classified and counted, and what the
// client is told. It implements proxy.Interceptor.
//
// # One policy per database
//
// A table is known only within its database: the same name in two
// databases is two tables, possibly guarded differently (another epoch
// column, lock domain or backstop), or not at all. Databases is the
// proxy.Interceptor that fences each session with the Policy of its own
// database, picked once at SessionStart (and kept in the session's state,
// so a statement costs no lookup). Its policies share one generation
// counter: the Interceptor has a single Generation, and a reload of any
// database's policy has every session plan its prepared statements again,
// which costs a plan (mostly a cache hit) and never a wrong one. A session
// Databases has no policy for is refused statement by statement, as
// pgfence cannot tell which of its tables to fence; the program should
// refuse such a session at admission in the first place. A Policy made by
// New serves every session whatever its database (the test harness, the
// torture check and the benchmark use one).
//
// Series of tables, lock domains and each database's configuration carry
// a database label (see Metrics.Database). They are retired through the
// uncurried vectors, with the database label given: a curried vector's
// DeletePartialMatch ignores its curried labels, and would retire the
// series of a table of that name in every database.
package fence
