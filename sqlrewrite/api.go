// Package sqlrewrite turns SQL text that writes a guarded table into SQL that
// only writes when the session's fencing token is not stale.
//
// It is pure: no I/O, no global state. Every decision is made on Postgres's
// own parse tree (pg_query), and every change is spliced into the client's
// original text at offsets from that tree and from the scanner, so whatever
// the client wrote (comments, spacing, casing) stays exactly as written.
package sqlrewrite

// Guard names one guarded table and its epoch column. Names are already
// normalised the way Postgres folds identifiers (see ParseGuard).
type Guard struct {
	Schema string // "" matches the table in any schema (fail closed)
	Table  string
	Column string // bigint NOT NULL epoch column; default "fence_epoch"
}

// Config is what a Rewriter needs to know.
type Config struct {
	Guards       []Guard
	TokenSetting string // custom setting that holds the token, e.g. "fence.token"
}

// Mode says where a SQL text came from.
type Mode int

const (
	// Simple is a simple-protocol Query: any number of statements. A probe
	// statement is appended right after each fenced statement.
	Simple Mode = iota
	// Prepared is the text of an extended-protocol Parse: one statement, no
	// probes appended (the proxy runs ProbeSQL itself after each Execute).
	Prepared
)

// Result is the outcome of rewriting one SQL text.
type Result struct {
	// SQL is the text to send in place of the input. It is the input itself,
	// unchanged, when nothing was fenced and nothing refused.
	SQL string
	// Fenced lists the fenced statements in order.
	Fenced []Fenced
	// Refusal is non-nil when the input was refused. SQL then is a statement
	// that makes the server raise the refusal (see ParseErrorMarker), so the
	// session's transaction state stays exactly what Postgres says it is.
	Refusal *Refusal
}

// Fenced describes one fenced statement.
type Fenced struct {
	Table string // the guarded table as configured, e.g. "accounts" or "public.accounts"
	Kind  string // "UPDATE" or "DELETE"
	// ProbeIndex is, in Simple mode, the 0-based index among the statements
	// of Result.SQL of the probe that follows this statement; -1 in Prepared mode.
	ProbeIndex int
}

// Refusal is an error pgfence raises instead of running a statement.
type Refusal struct {
	Code    string // SQLSTATE
	Message string // starts with "pgfence: "
	Hint    string
}

func (r *Refusal) Error() string { return r.Message }
