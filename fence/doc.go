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
// vectors themselves, with the database label given, as a curried vector
// has no DeletePartialMatch of its own.
//
// # One analysis of a text
//
// Every fencing decision about a Query's or Parse's text is made in
// plan, planIn and pooledPlan, in a fixed order: pgfence's own settings,
// then (behind a transaction pooler) a SET or RESET of a token setting
// and any other change of one for the session, then the session's memo,
// DDL and settings that change how texts are read, an answerable SET, a
// text that cannot name a guarded table, a read, the rewrite (cached,
// bound to its literals, or made), and last, behind a transaction pooler,
// whether the text needs the session's token and where its transactions
// start. Each step switches over one
// sqlrewrite.Analysis of the text, made at the first step that needs it
// (text.analysis), so a text is scanned once whatever steps it goes
// through, and a text the session's memo passes outside a transaction
// pooler not at all. Only the steps the analysis says must look further
// read the text again: the parser, for a refusal or a rewrite, and the
// literals' scanner, for a simple-protocol write. Behind a transaction
// pooler, where a rewrite run as sent starts its transactions is read
// from the rewrite, another text that the parser must read (the fence's
// rewrite spells END and adds its probe's statement): that is found at the
// rewrite's first use and kept with the plan the cache keeps (planned.tx),
// so that a cache hit parses nothing. Where a text that runs as sent
// starts its transactions is kept likewise, by text, in the loop's caches
// (caches.passed), when finding it took a parse (a BEGIN; ...; COMMIT; ...
// sent again and again). Nothing found is never taken for no
// starts: a plan whose starts were not found is checked at its use, and
// one whose rewrite pgfence cannot read is refused at every use.
//
// # Per-loop state
//
// The proxy relays sessions on several event loops, one per core, and a
// statement's way through the policy must not make one loop wait for
// another: nothing on it takes a lock another loop takes or writes a
// cache line another loop writes. The configuration (state) is read
// through an atomic pointer and swapped whole on reload; so is each
// session's policy. What a statement writes is kept per loop, by the
// shard of the session's loop (see shard.go and proxy.Client.Loop): the
// counters and histograms (internal/loopstat: a cell per shard, summed at
// a scrape), and the rewrite caches (state.caches: an LRU moves an entry
// at every hit, under its lock, so each loop has its own set, at the cost
// of a rewrite per loop of each text and up to CacheSize entries per loop).
// Series that only an event names (a backstop notice's table) are looked
// up once per session and kept in the session's state; the stale log
// takes its lock only to write a line (see staleLog). A session relayed by
// goroutines is counted in a shard by its id, with the same atomic adds and
// locks, which are then shared by the sessions of a shard.
//
// # Counting a fenced write
//
// A fenced write is counted from its probe's row (probe.go: the token it
// ran with, and per table whether a stale row raised its flag), or, where
// the proxy left the probe out, from the token pgfence set right ahead of
// it and the notices its stale rows raised (quiet.go); both go through
// outcome, so the two count alike.
package fence
