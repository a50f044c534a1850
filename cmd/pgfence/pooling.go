package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// What --upstream-pooling says stands at --upstream.
const (
	poolingNone        = "none"        // Postgres itself
	poolingSession     = "session"     // a pooler that gives each session its own server connection
	poolingTransaction = "transaction" // a pooler that shares server connections between transactions
)

// transactionPooling checks --upstream-pooling and reports whether it
// says transaction.
func (o serveOptions) transactionPooling() (bool, error) {
	switch o.upstreamPooling {
	case "", poolingNone, poolingSession:
		return false, nil
	case poolingTransaction:
		if o.forwardTokenSets {
			return false, errors.New("--upstream-pooling=transaction cannot go with --forward-token-sets: pgfence must answer the token's SET itself to keep it off the shared server connection")
		}
		return true, nil
	}
	return false, fmt.Errorf("--upstream-pooling: %q is not none, session or transaction", o.upstreamPooling)
}

// policyConfig is the fencing policy the flags say.
func (o serveOptions) policyConfig() (fence.Config, func(sqlrewrite.Guard) sqlrewrite.Guard, error) {
	cfg, apply, err := o.policyOptions.config()
	cfg.TransactionPooling = o.upstreamPooling == poolingTransaction
	cfg.StaleLogInterval = o.staleLogInterval
	return cfg, apply, err
}

// connectUpstream opens pgfence's own connection for catalog reads, to
// database db ("" for the URL's own) with the URL's other settings. Behind
// a transaction pooler it prepares no statements (pgx's exec mode, which
// PgBouncer supports): a named one would stay on a server connection
// other clients get.
func connectUpstream(ctx context.Context, url, db, pooling string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if db != "" {
		cfg.Database = db
	}
	if pooling == poolingTransaction {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	} else {
		// pgfence's own SQL, run as its (often superuser) role in every
		// database clients use, must not find an application's objects
		// before the built-ins: an operator ~(name, name) in public is a
		// better match than pg_catalog's ~(name, text) for a name compared
		// with an untyped value, and would run as pgfence's role. (A
		// transaction pooler refuses the parameter; there the queries'
		// own qualification stands alone.)
		cfg.RuntimeParams["search_path"] = "pg_catalog, pg_temp"
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "08P01" && strings.Contains(pe.Message, "startup parameter") && cfg.RuntimeParams["search_path"] != "" {
		// A pooler nobody declared (PgBouncer takes no search_path at
		// startup): connect without it, so that checkPooler finds it and
		// pgfence refuses to serve, saying so.
		delete(cfg.RuntimeParams, "search_path")
		return pgx.ConnectConfig(ctx, cfg)
	}
	return c, err
}

// checkPooler finds out whether a pooler answers at the upstream when
// --upstream-pooling says none: Postgres's BackendKeyData names the
// backend's process, which pg_backend_pid() returns; a pooler hands out
// keys of its own. Behind one nobody told pgfence of, a session's token
// would stay on a server connection that other clients get next (and a
// transaction pooler gives the session's next transaction another one),
// so client sessions are refused until it is gone or the flag says so.
func (i *instance) checkPooler(ctx context.Context, conn *pgx.Conn, pooling string) error {
	if pooling != poolingNone && pooling != "" {
		return nil
	}
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	if key := conn.PgConn().PID(); key != pid {
		why := fmt.Sprintf("a connection pooler answers at %s (its cancel key names process %d, the server process is %d), and --upstream-pooling says none: "+
			"a session's fencing token would stay on a server connection other clients get; with PgBouncer in pool_mode = transaction run pgfence with --upstream-pooling=transaction, in pool_mode = session with --upstream-pooling=session",
			i.upstream, key, pid)
		if old := i.pooler.Swap(&why); old == nil {
			i.log.Error("refusing client sessions", "why", why)
		}
		return errors.New(why)
	}
	if i.pooler.Swap(nil) != nil {
		i.log.Info("the upstream is Postgres itself again: serving client sessions")
	}
	return nil
}

// checkResets finds out, once per instance, whether the transaction pooler
// at the upstream resets a server connection after each transaction, and
// warns if it does not. pgfence resets the token's settings in every
// transaction it sets them in, but nothing else: a temporary table or view,
// a search_path or a SET ROLE that one client leaves on a server
// connection for the session is in force in the next client's
// transactions there. Code of one client then runs inside another's
// write, where it can raise the token that write carries (red team 6a:
// a stale write landed that way). PgBouncer resets only in session mode
// unless told to always (server_reset_query_always).
func (i *instance) checkResets(ctx context.Context, conn *pgx.Conn) {
	if !i.resetsChecked.CompareAndSwap(false, true) {
		return
	}
	kept, err := poolerKeepsSessionState(ctx, conn)
	switch {
	case err != nil:
		i.log.Debug("could not tell whether the transaction pooler resets server connections", "err", err)
	case kept:
		i.log.Warn("the transaction pooler at the upstream keeps a server connection's session state from one transaction to the next: "+
			"what a client leaves there for its session (a temporary table or view, search_path, SET ROLE) is in force in other clients' transactions, "+
			"where it can run that client's code inside another's write and raise the fencing token the write carries; "+
			"unless every client of the pooler is trusted, have it reset server connections after every transaction "+
			"(PgBouncer: server_reset_query = DISCARD ALL and server_reset_query_always = 1)", "upstream", i.upstream)
	}
}

// poolerKeepsSessionState sets a setting for the session in one
// transaction and reads it in the next, until both run on the same server
// process: it is still there unless the pooler reset the connection in
// between.
func poolerKeepsSessionState(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var b [8]byte
	rand.Read(b[:])
	mark := hex.EncodeToString(b[:])
	for range 5 {
		var set, read uint32
		var got string
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid(), pg_catalog.set_config('pgfence.reset_probe', $1::text, false)", mark).Scan(&set, nil); err != nil {
			return false, err
		}
		if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid(), COALESCE(pg_catalog.current_setting('pgfence.reset_probe', true), '')").Scan(&read, &got); err != nil {
			return false, err
		}
		if set == read {
			return got == mark, nil
		}
	}
	return false, errors.New("five pairs of transactions ran on different server processes")
}
