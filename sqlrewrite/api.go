package sqlrewrite

import (
	"strconv"
	"strings"
)

// Guard names one guarded table and its epoch column, and how it is fenced.
// Names are already normalised the way Postgres folds identifiers (see
// ParseGuard).
type Guard struct {
	Schema string // "" matches the table in any schema (fail closed)
	Table  string
	Column string // bigint NOT NULL epoch column; default "fence_epoch"
	// Rollout is how writes to the table are treated (default Enforce).
	Rollout Rollout
	// AllowMissingToken lets an Enforce write with no token set through
	// unfenced (the probe reports it) instead of failing with 55000. A token
	// that is set but not an integer still fails.
	AllowMissingToken bool
	// Domain is the lock domain of the table, "" for none. A domain is one
	// token stream shared by all its tables: once a holder has written with
	// token N anywhere in the domain, every write to the domain with a
	// token below N changes nothing (INSERTs fail), whichever rows it
	// touches. Its name is a lower-case SQL identifier ([a-z_][a-z0-9_]*, at
	// most MaxDomainLen bytes), and the domain's row must exist in
	// DomainTable (see DomainRowSQL) before a write to it. Its tables read
	// the token from <TokenSetting>.<Domain> first, then from TokenSetting.
	// Domain fencing is Enforce-only for now: Shadow and Observe tables
	// ignore their domain (a Shadow table still reads the domain's setting
	// first).
	Domain string
	// Backstop says the database backstop is installed on the table: BEFORE
	// INSERT/UPDATE/DELETE row triggers that enforce the fence in Postgres
	// (skip stale rows, stamp the epoch column with the token). The forms
	// the rewriter cannot fence in the SQL text, MERGE INTO the table, COPY
	// ... FROM into it and UPDATE/DELETE ... WHERE CURRENT OF on it, then
	// run unrewritten instead of being refused (Result.Fenced reports them
	// with Backstop set). Everything else is fenced in the text as without
	// it; TRUNCATE, which fires no row triggers, is still refused unless
	// Allow.Truncate. (The backstop checks the table's lock domain too.)
	Backstop bool
	// As, when set, is how messages and metrics name the table: the one
	// table of the catalog an unqualified guard stands for, schema-qualified
	// (see catalog.Discover), so that every instance labels a table alike
	// whichever way it was guarded. Label is Name when it is empty.
	As string
	// Unfenceable, when set, says why the table cannot be fenced (it has
	// no epoch column, or one that is not an integer) and how to fix it:
	// catalog.Discover sets it from the catalog. Every write to the table
	// (but in Observe, which fences nothing) is then refused with
	// SQLSTATE CodeUnfenceable and this text, rather than rewritten into
	// a statement Postgres would fail with its own error.
	Unfenceable string
}

// CodeUnfenceable is the SQLSTATE of a write refused because its guarded
// table cannot be fenced (Guard.Unfenceable).
const CodeUnfenceable = "PF003"

// DomainTable holds one row per lock domain: the highest token any write to
// the domain has used.
const DomainTable = "pgfence.domains"

// MaxDomainLen is the longest lock domain name, in bytes.
const MaxDomainLen = 40

// DomainTableDDL returns the statements that create DomainTable if it does
// not exist.
func DomainTableDDL() string {
	return "CREATE SCHEMA IF NOT EXISTS pgfence; CREATE TABLE IF NOT EXISTS pgfence.domains (domain text PRIMARY KEY, token bigint NOT NULL)"
}

// DomainRowSQL returns the statement that creates the row of the lock
// domain named by its parameter $1, if it does not exist, with the lowest
// token. Rewritten statements only UPDATE that row: a write to a domain
// whose row is missing changes nothing (INSERTs fail).
func DomainRowSQL() string {
	return "INSERT INTO pgfence.domains (domain, token) VALUES ($1, -9223372036854775808) ON CONFLICT (domain) DO NOTHING"
}

// Rollout is a table's stage in adopting pgfence.
type Rollout int

const (
	// Enforce rewrites writes so that stale ones change nothing.
	Enforce Rollout = iota
	// Shadow rewrites writes so that epochs are kept (never lowered) and
	// stale rows are flagged, but every write lands: it shows what Enforce
	// would reject.
	Shadow
	// Observe leaves writes untouched and only probes them for a token.
	Observe
)

// String returns "enforce", "shadow" or "observe".
func (r Rollout) String() string {
	switch r {
	case Shadow:
		return "shadow"
	case Observe:
		return "observe"
	}
	return "enforce"
}

// Config is what a Rewriter needs to know.
type Config struct {
	Guards       []Guard
	TokenSetting string // custom setting that holds the token, e.g. "fence.token"
	// Allow lets through, unfenced, forms that cannot be fenced and are
	// refused by default.
	Allow Allow
	// DDLGuard says the database's DDL guard is in place (see the
	// backstop package): DETACH PARTITION of a guarded table may then run,
	// as the guard gives the detached table a backstop of its own at once
	// (see backstop/guard.go).
	DDLGuard bool
	// ServerVersion is the server's server_version_num (180004 for 18.4),
	// 0 when unknown. On a server newer than the grammar pgfence reads SQL
	// with, a text that may write a guarded table and that pgfence cannot
	// read is refused as a version skew (0A000, see skew.go).
	ServerVersion int
	// StaleNotice says the database has the backstop's helper
	// pgfence.note_stale (see StaleNoticeCode): a stale row raises its
	// flag through it, which also raises a notice, so that the proxy can
	// learn of it without the probe (see Probe).
	StaleNotice bool
	// MaxParse is the longest text, in bytes, that the rewriter parses to
	// fence it; 0 for no limit. A longer one that may write a guarded table
	// is refused (54000, CodeTooLarge): libpg_query's parse tree takes
	// about 13 times the text's size, outside Go's heap, on the event loop
	// that asked for it.
	MaxParse int
}

// CodeTooLarge is the SQLSTATE of a write refused because its text is
// longer than Config.MaxParse (program_limit_exceeded).
const CodeTooLarge = "54000"

// StaleNoticeCode is the SQLSTATE of the notice pgfence.note_stale raises
// for a stale row a rewritten write left alone (StaleNotice). Its detail
// is the flag's name, a space and the flag's value (ParseStaleNotice).
const StaleNoticeCode = "PF011"

// Allow names the unfenceable forms a configuration lets through. On a
// table whose guard has Backstop, COPY FROM and CURRENT OF run fenced by
// the backstop whatever Allow says.
type Allow struct {
	Truncate  bool // TRUNCATE of a guarded table
	CopyFrom  bool // COPY ... FROM into a guarded table
	CurrentOf bool // UPDATE/DELETE ... WHERE CURRENT OF on a guarded table
}

// Session tells the rewriter what a session has prepared with SQL-level
// PREPARE, so that EXECUTE of a fenced write gets its probe.
type Session interface {
	// PreparedWrite returns the guarded tables the named prepared
	// statement writes, or nil.
	PreparedWrite(name string) []string
}

// Mode says where a SQL text came from.
type Mode int

const (
	// Simple is a simple-protocol Query: any number of statements. A probe
	// statement is appended right after each fenced statement.
	Simple Mode = iota
	// Prepared is the text of an extended-protocol Parse: one statement, no
	// probes appended (the proxy runs the Result.Probes SQL itself after
	// each Execute).
	Prepared
)

// Result is the outcome of rewriting one SQL text.
type Result struct {
	// SQL is the text to send in place of the input. It is the input itself,
	// unchanged, when nothing was fenced and nothing refused.
	SQL string
	// Fenced lists every guarded write found, in text order, nested ones
	// included.
	Fenced []Fenced
	// Probes lists the probe statements, one per top-level statement that
	// writes (or EXECUTEs a prepared write to) a guarded table; not after a
	// PREPARE (its EXECUTEs are probed) nor after an EXPLAIN without
	// ANALYZE (it runs nothing).
	Probes []Probe
	// Prepared lists SQL-level PREPAREs in this text whose statement writes a
	// guarded table (the session should remember them for EXECUTE).
	Prepared []PreparedWrite
	// SessionDependent is true when the result depended on the Session
	// (it was asked about an EXECUTE that the text does not PREPARE
	// itself): it must not be cached by text.
	SessionDependent bool
	// NoRows is true when the text is a single INSERT, UPDATE or DELETE
	// without RETURNING: it returns no rows whatever the tables' columns
	// become, so a server-side prepared statement of it can never fail
	// with "cached plan must not change result type".
	NoRows bool
	// Refusal is non-nil when the input was refused. SQL then is a statement
	// that makes the server raise the refusal (see ParseErrorMarker), so the
	// session's transaction state stays exactly what Postgres says it is.
	Refusal *Refusal
	// edits made SQL from the input, in offset order (see Position).
	edits []edit
}

// Fenced describes one guarded write.
type Fenced struct {
	Table   string // the guarded table as configured, e.g. "accounts" or "public.accounts"
	Kind    string // "UPDATE", "DELETE", "INSERT", "UPSERT" (INSERT ... ON CONFLICT DO UPDATE), "EXECUTE", or a form the rewriter cannot fence, let through by Allow, by the table's backstop (see Backstop) or on an Observe table ("TRUNCATE", "COPY FROM", "CURRENT OF", "MERGE")
	Rollout Rollout
	Nested  bool // inside WITH, PREPARE, EXPLAIN or another statement
	// Backstop is true when the write is a form the rewriter cannot fence
	// ("MERGE", "COPY FROM", "CURRENT OF") that passed unrewritten because
	// the table's database backstop fences it (see Guard.Backstop): it is
	// fenced by Postgres, not let through unfenced by Allow. It is false
	// on an Observe table, where those forms pass anyway.
	Backstop bool
}

// Probe is a statement that reads, right after a guarded write and in the
// same transaction, what the write left for pgfence: the token in force and,
// per table, whether a row the write matched was stale and what beat it.
// It returns one row, which Outcome reads.
type Probe struct {
	// Index is, in Simple mode, the 0-based index among the statements of
	// Result.SQL of this probe; -1 in Prepared mode, where the proxy runs SQL
	// itself after each Execute.
	Index  int
	SQL    string
	Tables []ProbeTable
}

// Stale says what a matched row of a guarded write lost to.
type Stale uint8

const (
	NotStale    Stale = iota
	StaleRow          // the row's epoch was above the token
	StaleDomain       // the table's lock domain had a higher token
)

func (s Stale) String() string {
	switch s {
	case StaleRow:
		return "row"
	case StaleDomain:
		return "domain"
	}
	return ""
}

// ProbeOutcome is what a probe's row says about one of its tables. Its
// slices point into the row.
type ProbeOutcome struct {
	// Token is the token the write ran with for the table (the lock
	// domain's own setting, if set, in a domain), empty when none was set.
	Token []byte
	Stale Stale
	// Winner is, when Stale, the epoch or domain token that beat Token
	// (the last stale row's, if several), empty when pgfence cannot know
	// it (a NULL epoch).
	Winner []byte
}

// The probe's row: column 0 is the token setting's text (NULL or "" when
// unset), column 1 the transaction's tag (flagTag); then three per entry of
// Tables, in order: the stale flag (the tag, ':' and the epoch of a row
// that was above the token and skipped (Enforce) or written (Shadow), as
// text, the last one's if several, else NULL or ""), the domain flag (the
// tag, ':' and the domain's token, when rows the write matched were
// skipped because its lock domain had a higher token, else NULL or "";
// NULL when the table is in no domain or is not Enforce) and the domain's
// token text (NULL outside one). The remaining columns clear the flags and
// carry no information.
const (
	probeLead            = 2
	probeColumnsPerTable = 3
)

// Outcome reads table i's outcome from a row the probe returned; ok is false
// when the row is too short to be the probe's. A flag counts only when it
// holds the tag of the probe's own transaction: one a client set itself,
// where pgfence cannot see it, in an earlier transaction (or left on a
// server connection another client uses next) does not.
func (p *Probe) Outcome(row [][]byte, i int) (o ProbeOutcome, ok bool) {
	if len(row) < probeLead+probeColumnsPerTable*len(p.Tables) || i >= len(p.Tables) {
		return o, false
	}
	c := row[probeLead+probeColumnsPerTable*i:]
	tag := row[1]
	o.Token = row[0]
	if len(c[2]) > 0 {
		o.Token = c[2]
	}
	if v, ok := raised(c[1], tag); ok {
		o.Stale, o.Winner = StaleDomain, v
	} else if v, ok := raised(c[0], tag); ok {
		o.Stale, o.Winner = StaleRow, v
	}
	if string(o.Winner) == unknownEpoch {
		o.Winner = nil
	}
	return o, true
}

// raised reports whether flag was raised in the transaction tagged tag,
// and returns what it was raised to.
func raised(flag, tag []byte) ([]byte, bool) {
	if len(tag) == 0 || len(flag) <= len(tag) || flag[len(tag)] != ':' || string(flag[:len(tag)]) != string(tag) {
		return nil, false
	}
	return flag[len(tag)+1:], true
}

// ProbeTable is one table a probe reports on.
type ProbeTable struct {
	Table   string
	Rollout Rollout
	Domain  string // the table's lock domain, "" for none
	// Guard is the index of the table's guard in the configuration, which
	// names its flags (see ParseStaleNotice).
	Guard int
}

// ParseStaleNotice reads the detail of a StaleNoticeCode notice: the guard
// whose flag the stale row raised, which flag, and what beat the token
// (empty when pgfence cannot know it). ok is false for a detail that is
// not such a notice's.
func ParseStaleNotice(detail string) (guard int, kind Stale, winner string, ok bool) {
	name, value, found := strings.Cut(detail, " ")
	if !found {
		return 0, NotStale, "", false
	}
	var index string
	switch {
	case strings.HasPrefix(name, dflagPrefix):
		kind, index = StaleDomain, name[len(dflagPrefix):]
	case strings.HasPrefix(name, flagPrefix):
		kind, index = StaleRow, name[len(flagPrefix):]
	default:
		return 0, NotStale, "", false
	}
	guard, err := strconv.Atoi(index)
	// The value is the transaction's start (which has colons), ':' and the
	// winner (which has none).
	at := strings.LastIndexByte(value, ':')
	if err != nil || guard < 0 || at < 0 {
		return 0, NotStale, "", false
	}
	if winner = value[at+1:]; winner == unknownEpoch {
		winner = ""
	}
	return guard, kind, winner, true
}

// PreparedWrite is an SQL-level PREPARE of a statement writing guarded tables.
type PreparedWrite struct {
	Name   string
	Tables []string
}

// Refusal is an error pgfence raises instead of running a statement.
type Refusal struct {
	Code    string // SQLSTATE
	Message string // starts with "pgfence: "
	Hint    string
}

func (r *Refusal) Error() string { return r.Message }
