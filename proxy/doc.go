// Package proxy is a Postgres wire-protocol proxy: one server connection per
// client connection, bytes forwarded untouched unless a message matters, and
// an Interceptor that decides what the messages that matter become.
//
// The notes below are the design of what the proxy sends the server in the
// client's place; the code refers to them by their headings.
//
// # Parts of a session
//
// A session is its two sides (session.go) and the parts that each keep
// one feature's state and decide what it needs from each message: the
// book of the client's statements and portals (stmtBook, statements.go),
// the statements prepared for reuse (reuseState, reuse.go), the SETs the
// proxy answers itself (setState, settings.go) and how they are set on
// the server (applyState, deferred.go), transaction pooling (txPooling,
// txpooling.go), probes (probeState, probes.go) and the writes watched in
// their place (Quiet, quiet.go), forgetting (forgetState,
// forget.go) and authentication (authState, auth.go). A part is a type
// with hooks named for the message they act on: onMessage (any client
// message), onQuery, onParse, onBind, onDescribe, onExecute, onClose,
// onPassword; onAnswered, onAnsweredQuery and onAnsweredParse when the
// proxy answered a SET itself; onReady (a ReadyForQuery), onServerError,
// and onReply for the server's replies to the part's own messages. A hook
// takes what it needs: the link (link.go: the writer to the server, the
// pipeline, the buffer the proxy builds messages in, and whether the
// block failed), the client's reader, the decoded message, and another
// part's state where it reads or changes it (the reuse part marks the
// book's unnamed statement gone), never the session. Configuration a
// part keeps is given to it as the session starts (session.startParts,
// through each part's start).
//
// A short dispatcher in session.go hands each message to the parts in
// order, and writes none of their fields: clientMessage (and query,
// parse, bind for the messages that matter) on the client side,
// serverMessage and ready on the server side. The order is the relay's
// correctness: for a Query, the answered SET first (it takes the Query
// whole), then deferred settings ahead of it, then the token settings
// behind a pooler, then forgetting, then the book and the reuse part,
// which the Query's destruction of the unnamed statement updates, and
// last what is sent and waited for. What joins two parts (a Bind's
// deferred settings go with it when the book says its statement is a
// fenced write; a probe's statement is prepared again when forgetting
// says it may be lost) is the dispatcher's, in session.go, and small. A
// Bind or Describe is decoded once (clientFrame) for all the parts that
// look at it and for the hold checks. A change to one feature touches its
// part's file and, if its order or inputs change, the dispatcher.
//
// The replies to a part's own messages are that part's too, in its file
// (applyState.onReply and onHeldReady, probeState.onReply and
// onQueryReply): they take the server side's way back (fromServer, in
// link.go: the server's reader, the buffer a message is read into, the
// writer to the client) and, for what only the session does, a small
// interface to it (relay: relay a reply the usual way, report an error,
// end the session, log), never the session itself.
//
// What a Query, Parse, Bind, Describe or FunctionCall waits for before
// the Interceptor sees it (see Statement holds and Reading holds) is
// checked in holds.go (session.holdFor), before the dispatcher: the
// hold's state is the Client's, which the Interceptor takes holds on.
//
// # Statement reuse
//
// Drivers in the extended protocol without named statements (pgx's default,
// libpq's PQexecParams, pgbench -M extended) send the same Parse of the
// unnamed statement before every execution, and Postgres parses, analyses
// and plans the text each time. For a text the Interceptor rewrote (Plan.
// Reuse) that is pgfence's cost: the fenced text is several times the
// client's. So the session prepares the rewritten text once under a name of
// its own and answers later Parses of it with a Parse of a stand-in (see
// standInParse), whose ParseComplete the client takes for its own, and
// points the client's Binds and Describes of the unnamed statement at the
// prepared one. The stand-in's text is the Interceptor's package's
// (Config.StandInSQL): without one, the unnamed statement is not reused.
//
// # Bound Queries
//
// A simple Query whose Plan has ParamTypes runs as a prepared statement:
// the proxy sends Parse (unless the session's backend has the statement),
// Bind, Execute, the probe and Sync in its place, and keeps ParseComplete
// and BindComplete from the client, which sees what its Query would get:
// CommandComplete (or an error) and ReadyForQuery. A simple Query runs in
// an implicit transaction that ends with it, as this one does at its Sync.
//
// # The portal a failed Query leaves
//
// A simple Query that fails in a transaction block leaves Postgres its
// unnamed portal, failed, pointing at the Query's text and plan, which
// Postgres frees at the next message; an Execute of that portal reads
// them before it checks the block, and PostgreSQL 16.14, 17.10 and 18.4
// crash on it. After a Query (sent as one or bound), the first Bind or
// Execute of the unnamed portal goes behind a Close of it
// wherever the block may have failed by then (stmtBook.portalStale), as
// the portal a bound Query left goes (stmtBook.portalGone). A Bind behind
// the Close makes the client's portal as it would have; one Postgres
// refuses leaves none; the Execute of a closed portal gets 34000.
//
// # Deferred settings
//
// A transaction that sets the fencing token and then writes costs two round
// trips to Postgres: the SET, then the write. When nothing is in flight and
// the session is idle or in a transaction block that has not failed, the
// proxy answers a SET the Interceptor vouches for (Plan.Setting) itself,
// keeps the setting, and sets it on the server with a statement of its own
// (set_config) ahead of the client's next statement, where Postgres would
// have run the SET:
//
//   - Ahead of a unit that is one fenced write (Bind, an optional Describe,
//     Execute and Sync, all in hand), with no Sync between them. Both run
//     in one transaction: if the setting fails, Postgres skips the write
//     and the client gets the error (fail closed).
//   - Ahead of anything else that may run a statement, with a Sync of its
//     own; what the proxy sends for the client's messages after it waits
//     in the proxy until Postgres has answered (applyState.held). If the
//     setting failed there, it is tried once more while idle; in a block,
//     or failed twice, the session ends with the error: nothing may run
//     without the setting the client was told is set.
//
// A setting answered while idle that joined a write in its implicit
// transaction is rolled back with the write if that fails, where the
// client's SET would have stood: it is kept until a unit that carried it
// ends in ReadyForQuery with no error, and until then every unit carries
// it again. One answered in a block (SET LOCAL too) is done once it ran:
// from there Postgres undoes it when the client's SET would be undone. If
// it failed ahead of a write, the block failed with the write, and the
// client can only roll back past the SET; it is dropped.
//
// A unit of one fenced write that found the session idle and got the
// settings joined to it runs in a transaction of its own, right after
// them: the settings the proxy sent are those the write runs with. Where
// its probe's Quiet (see Quiet) says they tell it all it needs, the proxy
// sends them with the quiet mark (Config.SettingSQL's fourth argument,
// which has the write's stale rows raise notices) and leaves the probe out
// (applyState.quiet, until the unit's Execute): the Execute's wait carries
// the settings, the notices the write raises go to the Quiet first, and
// the write's CommandComplete tells it the write completed, in place of
// the probe's row.
//
// # Transaction pooling
//
// With Config.TransactionPooling, a transaction pooler such as PgBouncer
// with pool_mode = transaction hands the server connection behind a session
// to another client whenever a transaction ends, so nothing the proxy
// leaves on it may outlive the transaction, and nothing a client leaves on
// it (where the proxy cannot see: in a function, say) may change what the
// next client's writes carry:
//
//   - The session's token settings live in the proxy (txPooling.values,
//     which always holds the token setting, "" while unset). A plain SET
//     or RESET of one outside a transaction block is answered at once and
//     kept; a token setting in the startup packet (a parameter, or a -c
//     or -- switch of options) is kept, a RESET's value, and taken out of
//     what is forwarded (see startup.go); anything else that would change
//     one for the session is refused by the Interceptor before it gets
//     here.
//   - Ahead of every statement that may need the token (Plan.NeedsToken),
//     in its transaction, the proxy runs the statement its Interceptor
//     gives it (PooledSets) for the configuration in force: it sets every
//     token setting, the token setting and each lock domain's, to the
//     session's value or "", with set_config(..., true), which lasts
//     until that transaction ends, and clears each for the session, so
//     that what a client left there is gone once the transaction commits.
//     It does so at most once per transaction: it also sets a marker
//     setting per token setting (pgfence.tx.<name>), transaction-local
//     too, and sets nothing while the marker holds the session's nonce
//     (and the transaction's start, which the database backstop of a
//     pooled role checks: see backstop.Options.PooledRoles), so
//     a SET LOCAL the client ran after it in the same transaction stands.
//     The nonce is drawn with crypto/rand, never logged, and drawn anew
//     whenever a client message finds the session idle, where a
//     transaction starts with nothing of an earlier one in flight: no
//     client can leave a marker that stops it, as none can know a nonce
//     still to be drawn, even one that read its own. (Tracking in the proxy
//     whether the client set a token LOCAL in the transaction instead
//     would mean following where transactions end in what the client
//     pipelines, which only the server knows.)
//   - Ahead of extended-protocol messages that is a Parse, Bind, Execute
//     and Close of a statement of the session's own, closed before its
//     portal runs; ahead of a simple Query, which runs in a transaction of
//     its own, a statement put in front of the Query's text, and again at
//     each statement of it that starts a transaction of its own after a
//     COMMIT and the like (Plan.TxStarts), whose replies the client does
//     not see.
//   - The proxy prepares nothing for reuse (Plan.Reuse and the named
//     statements of bound Queries) and its probes' statements are closed
//     as soon as they are bound.
//
// # Statement holds
//
// After a text whose effect pgfence must know before it can judge the
// next one (DDL, which the catalog read after it must see; a change of
// client_encoding), the Interceptor holds the session's next Query or
// Parse (Client.HoldNextStatement) until the server has answered all
// before it. Postgres sends nothing of an extended-protocol batch before
// its Sync or a Flush, and drivers that pipeline (pgx's batches, libpq's
// pipeline mode, pgJDBC's executeBatch) send the held statement in the
// batch, with the Sync behind it: waiting for the answers then would wait
// for ever, and the client with it. So when the client has sent
// extended-protocol messages since its last Sync, the proxy sends a Flush
// of its own before it waits. A Flush has no reply and changes nothing
// but when Postgres writes; after an error in the batch Postgres skips it
// with everything else up to the Sync, but then it has sent the error,
// and the replies the pipeline still waits for are the ones it skips
// (pipeline.skipToSync): the hold ends at once. A simple Query ends with
// ReadyForQuery, which Postgres always sends at once.
//
// A catalog read the hold starts in the middle of a batch cannot see
// what the batch's implicit transaction has yet to commit (it reads on
// another connection), so the first Query or Parse after the batch's Sync
// waits for the Sync's ReadyForQuery and for the read again (once); in a
// transaction block, the text that ends it holds again (see fence's
// noteDDL).
//
// While a hold waits, the event loop reads nothing more of the client
// (side.parked) but still learns when it hangs up: a client that leaves
// then ends its session at once, and the statement it had running is
// cancelled, as when it leaves mid-query. A hold that waits only for the
// server's answers waits for the pipeline's own channel, which the server
// side closes on the loop: the loop resumes the client side right after
// the server's messages that closed it (loop.resumeLocal), with no
// goroutine and no wake-up of another thread; a hold that waits for a
// catalog read too is resumed by a goroutine. On the goroutine relay a
// held client side reads nothing until the hold ends, which it does once
// the server has answered.
//
// # Reading holds
//
// The Interceptor reads a text with the session's
// standard_conforming_strings and client_encoding as the proxy last
// learnt them (Client.StandardConformingStrings, ClientEncoding), from
// the server's ParameterStatus messages. Any statement may change them,
// not only one that names them (a set_config with a computed name, a
// function, DO, CALL, a trigger, an operator or a cast), and Postgres
// (14 and later) reports a change only right before ReadyForQuery. So a
// Query or Parse the client sends before every reply is in, or in the
// middle of an extended-protocol batch, may be read by Postgres with
// other settings than the proxy knows. The proxy asks the Interceptor
// whether what it makes of such a text depends on them
// (DependsOnReading; fence says so only for a text that may write a
// guarded table and reads otherwise under another setting, which almost
// no text does), and if so holds it as after HoldNextStatement: until the
// ReadyForQuery of what came before, or, in a batch, until the
// Interceptor's reading probe (ReadingProbe, a SELECT of both settings,
// injected before the held text with a Flush) has answered. So too a Bind
// or Describe that plans its prepared statement's text again after a
// configuration change (see replan), which sends Postgres a Parse of the
// new plan. What the probe found stands until the next ReadyForQuery,
// from which on the proxy goes by what the server reported again
// (Postgres reports there every setting that changed; one the probe saw
// may have been rolled back since). A client that waits for each reply
// before it sends its next statement never waits.
//
// The probe is a statement like any: in a transaction block that failed
// it fails (25P02), where the held text may be the ROLLBACK that ends the
// block. So while the block may have failed (the last ReadyForQuery said
// so, or one is still owed), the proxy first sends only the Flush and
// waits for the answers; if the block has failed and no statement ran
// since the ReadyForQuery that said so, which reported the settings, it
// knows them and runs no probe; else it runs the probe then. After an
// error in the batch Postgres skips the probe and the held text with it;
// the proxy's waits for replies Postgres skips are dropped
// (pipeline.skipToSync, also after the error of a Bind or Describe, which
// it does not wait for), so the hold ends with the error.
//
// A single simple Query is read whole, with the settings from before it,
// before any of its statements runs: a setting it changes does not
// change how its later statements are read, and the Interceptor reads
// them all alike too.
//
// # Statement names
//
// The proxy's own statements on a server backend carry names no other
// session's can: a tag drawn when the process starts, and the session's
// number. Behind a transaction pooler that nobody told pgfence of (see
// Config.TransactionPooling), a backend serves many clients in turn; with
// names shared between sessions, a Bind of one session's statement could
// run another's. With these it fails with 26000, which is as far as such a
// mistake can go.
//
// # The event loop
//
// A Server's event loops relay its sessions (TCP or Unix socket, plain or
// TLS), each on one goroutine, the way PgBouncer does on its one thread:
// one epoll set per loop, non-blocking reads and writes straight on the
// file descriptors. Two goroutines per session on Go's netpoller cost about
// twice PgBouncer's CPU per message: every read first fails with EAGAIN,
// and each message wakes a parked goroutine and often another thread. Here
// a message costs a read and a write, and one epoll_wait serves many.
//
// There are Config.EventLoops of them, by default one per usable core
// (GOMAXPROCS), started by New and stopped by Close (or a drain that
// finished). A session is given to one when it is admitted, past startup,
// and stays there to its end: the loop owns its sides, their buffers (a
// pool per loop) and its place in the loop's epoll set, and everything
// of the session that runs while it is relayed, the Interceptor's calls
// included, runs on that loop's goroutine (Client.Loop says which). What
// comes from elsewhere is posted to the session's own loop: its end
// (closeServer: a drain, Close, an upstream that moved) and the end of a
// hold that a goroutine waits for. A cancel request needs no loop: the
// backend key the client holds is its Postgres backend's own, and the
// request is forwarded as it is.
//
// Each session goes to the loop that holds the fewest sessions now, ties
// in turn, rather than to the loop the kernel picks (a listener per loop
// with SO_REUSEPORT): the kernel spreads connections by a hash of their
// addresses, blind to how many each loop holds and to which ended, so a
// pool of 16 would put 4 or fewer on one of 2 loops about one time in 50,
// and a pool that reconnects stays where the hash put it. Picking at
// admission also works for every listener (TCP, Unix socket, an
// embedder's) and keeps accepting and startup (TLS handshake,
// authentication, which block) off the loops, on the session's goroutine,
// as before. The count is taken under the Server's lock once per session,
// never per message.
//
// Sockets are watched edge-triggered: epoll reports a socket once per
// arrival rather than again at every wait until it is drained, which spares
// each wait a poll of every socket it returned last time (up to 2 % of the
// CPU per select-only transaction at a fixed rate). A read that returns less
// than it had room for has drained the socket (whatever comes later is a
// new edge), so no read ends in EAGAIN on the common path, and no epoll_ctl
// is needed to pause a side whose peer is backed up: the loop just stops
// reading it until the peer drains.
//
// A loop takes what its epoll set has ready with a raw, non-blocking
// epoll_wait (a raw system call skips the scheduler's bookkeeping, which
// costs more than the call), and when nothing is ready its goroutine
// parks in Go's netpoller, where the epoll set is registered as a file,
// readable while it has events. A busy loop never parks; an idle one
// holds no thread and no P. The loop runs inside one RawConn.Read of the
// epoll set, which keeps a readiness edge that comes while the loop is
// handling events (Read clears one only when it starts): so after a wait
// that returned fewer events than it had room for, which drained the set,
// the loop parks without asking the set again, one epoll_wait fewer per
// wake-up than a Read per wait (0.67 against 0.89 per select-only
// transaction, with the Go runtime's own). The CPU per transaction stayed
// where it was: a wake-up that finds its readiness through the scheduler
// costs about what the system call did (see BENCHMARKS.md). Earlier the one loop waited in a raw blocking
// epoll_wait (up to 5 ms) to keep its P; with a loop per P that kept every
// P, and every other goroutine (a session's startup, a hold's end, the
// garbage collector, /metrics) waited for sysmon to preempt a loop or poll
// the network, 10 ms at a time: a new connection took 50–75 ms to start
// under load, where parking makes it 25–35 (15–18 with one loop and a
// spare P), and the CPU per transaction did not change within the
// machine's noise (see BENCHMARKS.md). Each session's own goroutine waits
// for the loop to hand it back at the end, and ends it as goroutines
// would.
//
// TLS sessions are relayed by the event loop too. crypto/tls wants a
// blocking net.Conn, so every tls.Conn pgfence makes is built on a
// tlsTransport: until the loop takes the session it is the socket itself;
// on the loop it reads ciphertext straight from the loop's descriptor and,
// when that is drained, fails with errWouldBlock, which crypto/tls takes as
// temporary (it keeps a partial record and reads on at the next call, as
// after a read deadline; make test's TLS pass would catch a crypto/tls that
// let it stick). What tls.Conn writes goes to a buffer the loop sends. So a
// TLS side costs the loop a decryption and an encryption more than a plain
// one, and no goroutine or system call more.
//
// # Messages
//
// A message's type byte means different messages in each direction ('C'
// is the client's Close and the server's CommandComplete; 'D', 'E' and
// 'S' likewise), so the types are named per direction (msgtype.go), as
// distinct Go types: comparing a client's message with a server's constant
// does not compile. A header's byte becomes one or the other only where
// the relay knows which side it read it from. The client messages whose
// fields the proxy tracks (Bind, Execute, Close, Describe) are decoded in
// place (decode.go), as flyweights over the bytes in the reader: no copy,
// no allocation, and only when the session tracks something they may
// name; a message the proxy only forwards is not decoded.
package proxy
