// Package sqlrewrite turns SQL text that writes a guarded table into SQL that
// only writes when the session's fencing token is not stale.
//
// It is pure: no I/O, no global state. Every decision is made on Postgres's
// own parse tree (pg_query), or, for a text without a single write keyword,
// on its scanner's tokens; and every change is spliced into the client's
// original text at offsets from that tree and from the scanner, so whatever
// the client wrote (comments, spacing, casing) stays exactly as written.
//
// # One analysis of a text
//
// The policy decides what to do with every text a client sends, and most
// texts (reads, a SET of the token, a write whose rewrite is cached) are
// decided without parsing. Those decisions all switch over one Analysis,
// made by Rewriter.Analyze in one pass over the text: its Class (which
// keywords and guarded names it may hold, see Classify), whether it is a
// plain SET (or, behind a transaction pooler, RESET) of a token setting,
// and the prefilter of each later stage, each a conservative fact. The
// later stages are asked of the analysis (its InternalChange,
// SessionChange and TxStarts, which hold the text; RewriteAnalyzed;
// BindLiterals takes its Class), and read the text again only when it says
// they must: the parser for a text that may set pgfence's own settings or
// change a token setting for the session, the literals' scanner for a
// simple-protocol write, the parser again for its rewrite. Besides the
// pass, Analyze reads only the first words of a text, and a SET (or RESET)
// statement to its end. The package's functions of one fact
// (Classify, MayWrite, MayBeDDL, TokenSettings.Match, InternalChange,
// TxStarts, ...) are for a caller with a text and no analysis, the last
// ones through the same pass. The separate scans the pass replaced are
// kept in oracle_test.go, and Analyze must say what each of them says
// (TestAnalyzeOracles, FuzzAnalyze).
//
// The pass looks across literals and comments on purpose: a fact is false
// only when the bytes cannot spell it, whatever the quoting. Where a scan
// must know where a token ends (the literals' scanner, ReadsAlike, the
// token setting's value and name), white space, comments, strings, quoted
// identifiers and dollar quotes are read by lex.go alone (blank,
// lineComment, blockComment, quotedEnd, escapeLiteralEnd, dollarTag,
// dollarQuotedEnd).
//
// # Lock domains
//
// A statement that writes a table of a lock domain (Enforce
// only, for now) gets, first in the WITH list of its top-level query, one
// data-modifying WITH query per domain it writes:
//
//	"pgfence_domain_K" AS (UPDATE "pgfence"."domains" SET "token" = T::pg_catalog.int8
//	    WHERE "domain" OPERATOR(pg_catalog.=) E'<domain>' AND pg_catalog.int8le("token", CLAIM)
//	    RETURNING "token")
//
// It claims the domain for the statement's token: it returns a row only
// when no write to the domain has used a higher token. CLAIM is the token
// the settings' precedence picks, NULL when there is none or the settings
// conflict: such a session claims nothing. Its row lock serialises the
// writers of one domain until they commit, and under READ COMMITTED a
// writer that waited for it re-checks the qual against the token the other
// writer committed, so the check and the claim are one atomic step.
// Postgres runs a data-modifying WITH query exactly once, to completion,
// however often (or whether) the statement reads it, and an uncorrelated
// EXISTS over it is an InitPlan, evaluated once: every reference sees the
// same answer. The statement keeps its own command tag and result; the
// WITH query's rows are never part of them.
//
// The claim raises none of pgfence's errors: the writes that read it check
// the token first (GATE, TOKA, the INSERT stamp's check), so a missing,
// malformed or conflicting token fails the statement with pgfence's error
// naming the table (a write that runs none of those checks, as it reads no
// row, claims with a good token and with no other). The claim is kept small because the writers of a
// domain queue on it, and the re-check of a writer that waited runs while
// the others wait (see domainInfo.claim).
//
// The writes of the domain's tables then read that answer (see fenceWhere
// and fenceByDomain): UPDATE and DELETE touch a row only if the domain was
// claimed and the row's epoch is not above the token, raising the domain
// flag (pgfence.dstale_<i>) for matched rows when the domain was not
// claimed and the row flag otherwise; INSERT stamps the claimed token and
// fails with PF001 when the domain was not claimed.
//
// Postgres only runs a data-modifying WITH at the top level of a
// statement, so a write to a domain table must be the top-level query
// itself or one of its WITH queries (under EXPLAIN, PREPARE, COPY or CREATE
// TABLE AS, that query is the one they hold); anywhere else Postgres
// rejects it anyway, and pgfence refuses it.
//
// # Tables that cannot be fenced
//
// A guard whose table has no integer epoch column (Guard.Unfenceable, set
// by the caller from the catalog) would make every rewrite of a write to
// it fail in Postgres, with Postgres's own error about a column the client
// never named. Its writes are refused instead, with CodeUnfenceable and
// the caller's account of why and what fixes it; reads and DDL (the fix)
// pass. An unqualified name that may stand for such a table is refused
// too, as search_path decides which table it is; Observe guards fence
// nothing and are let through.
//
// # pgfence's own settings
//
// pgfence keeps state of its own in the settings of the pgfence namespace:
// the stale flags its rewrites raise and its probes read (pgfence.stale_<i>,
// pgfence.dstale_<i>; raised with set_config, or, with Config.StaleNotice,
// through the backstop's pgfence.note_stale, which also raises a notice
// that ParseStaleNotice reads), the markers of the token settings the proxy sets
// behind a transaction pooler (pgfence.tx.<name>), and the database
// backstop's (pgfence.noticed, pgfence.exempt_noted). A client that set one
// would change what pgfence counts or sets, so InternalChange finds the
// texts that would, in any spelling, and pgfence refuses them. It can only
// judge what a text says: a name a text computes, or one set inside a
// function, a DO block or a procedure, it cannot see, so what reads those
// settings does not trust a value a client could have left there. A flag
// holds the start of the transaction that raised it (flagValue), and the
// probe, which runs in the write's transaction, counts only a flag that
// holds its own transaction's start; a pooled marker holds a nonce the
// proxy draws for each transaction and that transaction's start
// (PooledSet), which the backstop of a pooled role checks. Within one
// transaction a client can still raise a flag (or clear one) itself,
// through a function its own statement calls: SQL offers nothing the
// rewrite can compute that a function the client calls cannot, so that
// only ever miscounts the client's own writes, and never changes what a
// write does.
//
// # Parameterized writes
//
// A simple-protocol write carries its values as literals, so its text, and
// with it the fenced rewrite Postgres must parse and plan, changes with
// every execution. BindLiterals takes the literals out: what is left is the
// same for every execution, so the proxy can prepare its rewrite once per
// session and bind each execution's values to it, as a driver using the
// extended protocol would.
//
// Postgres types a numeric literal by its text alone (an integer that fits
// int4 is int4, then int8, else numeric; one with a point or exponent is
// numeric), so a parameter declared with that type means exactly what the
// literal did. A plain string literal ('...') has no type of its own: the
// context gives it one, as it gives a parameter left untyped, and
// Postgres reads the value with that type's input function either way.
// Both resolve alike only in some contexts, though (pg_typeof('x') is
// "unknown", pg_typeof($1) an error), so a template with strings taken out
// is used only where each is compared with a column, assigned to one, or
// cast (see stringParamsSafe); the strings elsewhere stay in the text
// (StringsToKeep, then BindLiterals). One more difference is in the value: Postgres
// reads a literal assigned to an interval column declared with fields
// (interval hour) with those fields, so that '5' is 5 hours where a
// parameter is 5 seconds; a string that an interval could be read from
// stays in the text unless a cast follows it (see plainStringValue).
//
// # Reading differentials
//
// Postgres reads a text with two of the session's settings: its
// client_encoding, in which the bytes are characters, and
// standard_conforming_strings, which says whether a backslash in a '...'
// literal is a character or an escape. pgfence reads each text with the
// values the server last reported, and a statement the client pipelined
// behind one that changed them (a set_config with a computed name, a
// function, a trigger) reaches pgfence before the server has said so. The
// proxy then waits for the server's answer before the Interceptor judges a
// text that may write a guarded table, unless the text reads the same
// under every value of both (ReadsAlike), which is what almost every text
// does:
//
//   - Every encoding Postgres takes from a client reads the ASCII bytes
//     alone as ASCII: a multibyte character starts with a byte of 0x80 or
//     more in all of them. In the client-only ones its later bytes may be
//     ASCII: 0x40 to 0x7E in SJIS, BIG5, GBK and GB18030, the backslash
//     (0x5C) among them, digits in GB18030's four-byte characters, ASCII
//     letters in UHC, 0x31 to 0x7E in JOHAB (never a quote). So a text
//     with a byte of 0x80 or more may read otherwise (E'Á\' ends at the
//     last quote in UTF-8 and at the one after the backslash in SJIS,
//     where the last byte of Á and the backslash are one character), but
//     one without is the same characters in every encoding.
//   - standard_conforming_strings changes only what a backslash inside a
//     '...' literal (plain, N'...', U&'...') means. In E'...' a backslash
//     is an escape either way; in a dollar-quoted string, a quoted
//     identifier or a comment it is a character either way. Up to the
//     first backslash inside a '...' literal, both readings are the same,
//     token by token; a text with none is read the same throughout.
//
// The scanner in ReadsAlike follows Postgres's lexer where it tells these
// apart and says no wherever it would have to be right about anything
// more: an unterminated literal, comment or quoted name, or a prefix it
// is not sure of. A "no" costs a wait for the server, never a misreading.
package sqlrewrite
