// Package catalog reads what a database's catalog says pgfence fences
// there: the guarded tables (explicit guards checked and extended to their
// partitions and inheritance children, tables discovered by their epoch
// column, tables that carry the backstop), the lock-domain membership the
// database keeps (pgfence.domain_members, which wins over the flags so
// that every instance applies the same), and the server's version. Read
// is one such read, as serve makes it at start-up, every
// --discover-interval, on SIGHUP and after DDL, and as init makes it; it
// returns plain values (Found) that the program turns into a
// fence.Config and /readyz's state.
//
// It is the one place the program reads the catalog for fencing: fence
// holds the policy and opens no connection of its own, and cmd/pgfence only
// connects, maps its flags onto Options and Found onto the policy. The
// package imports neither fence nor proxy, so fence's tests can use it.
//
// A read also does what the flags ask of the database: it records lock
// domains and their members (InitDomains), and has backstop set up its
// schema and install or verify the triggers (backstop.Setup, Reconcile).
// What the backstop's own objects say is read by backstop itself, which
// alone knows their shape: its state on each table (Reconcile), the tables
// carrying its row trigger (Carriers, whose column it reads back out of
// the trigger function's body), its counters (ReadCounts) and its notice
// key (ReadNoticeKey). Read orders them: the version first (an old
// server is refused as such, not by the first statement it cannot parse),
// then discovery, the carriers, the schema, the domains, the membership,
// and the backstop last, on the tables as membership left them.
//
// With nothing to guard (no --guard, no discovery) and the backstop off,
// a read is the version alone: pgfence sets up nothing in the database.
//
// A table that cannot be fenced as configured (missing, its epoch column
// missing, not an integer, nullable) is a problem in Found, not an error:
// a guard of it carries Unfenceable (its writes are refused, saying the
// fix) and it gets no backstop, whose trigger could only fail every
// write. An error means the catalog could not be read at all; serve then
// keeps the guards of the last good read (fail closed).
package catalog
