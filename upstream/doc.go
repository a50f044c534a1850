// Package upstream is where pgfence finds Postgres: the hosts an --upstream
// connection string names, with libpq's meaning of sslmode and
// target_session_attrs, whether each is a writable primary, following the
// primary among them as failovers move it, and pacing pgfence's own logins
// while Postgres refuses them.
//
// # TLS: libpq's attempts, and the proxy's one
//
// pgconn gives each host one attempt per TLS mode, in libpq's order
// (sslmode=prefer, the default: TLS, then plain text; allow: plain text,
// then TLS). pgfence's own connections (Check, and the catalog reads in
// cmd/pgfence, which connect with the URL) make them all, so /readyz
// answers as libpq would: with prefer, ready against a Postgres without
// TLS. A client session's leg is one attempt (see sessionTLS): the proxy
// cannot start a session over once it has relayed the client's startup
// packet. It asks for TLS whenever any attempt does and Postgres offers it,
// and insists only when no attempt is plain (require, verify-ca,
// verify-full), verifying as that attempt's tls.Config says. That differs
// from libpq in two corners only (docs/limits.md): a Postgres that offers
// TLS but refuses TLS connections in pg_hba.conf, and allow's order.
//
// # Logins while Postgres refuses them
//
// Every check logs in as pgfence's role, and checks come often: each
// /readyz, each scrape of pgfence_upstream_up, Follow every second. With
// a wrong password each would be a failed login in Postgres's log. A Host
// carries a Backoff: once Postgres refuses the role, Check reports that
// refusal without logging in until the wait is over, and the waits double
// (jittered) up to a minute. cmd/pgfence's retries of the first catalog
// read share the Backoff of the (single) host, so that the reads and the
// checks take turns (Try): Postgres sees one failed login per wait.
package upstream
