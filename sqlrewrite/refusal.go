package sqlrewrite

import (
	"strconv"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

const (
	codeForgedEpoch = "42501" // insufficient_privilege
	codeUnsupported = "0A000" // feature_not_supported
	codeSyntax      = "42601" // syntax_error
	codeNoToken     = "55000" // object_not_in_prerequisite_state
	codeBadToken    = "22023" // invalid_parameter_value

	hintForgedEpoch  = "pgfence sets it to the session's token itself; remove it from the statement"
	hintUnsupported  = "write guarded tables with INSERT (with a column list), UPDATE or DELETE statements, which pgfence fences"
	hintMerge        = "write it as INSERT ... ON CONFLICT, UPDATE and DELETE statements, which pgfence fences, or let pgfence install its database backstop on the table (pgfence serve does by default), with which MERGE runs fenced by Postgres"
	hintReservedName = "rename the WITH query: pgfence adds WITH queries named pgfence_domain_<n> itself"
	hintStaleDomain  = "a newer holder of the lock has written to this lock domain with a higher fencing token: stop acting as the holder and acquire the lock again"
	hintTooLarge     = "split the write into smaller statements, or raise --max-parse-size along with pgfence's memory (its parse takes about 13 times the text's size)"
)

// hintUnfenceable is the hint of a write refused because its guarded
// table cannot be fenced: the message says the fix.
const hintUnfenceable = "pgfence fences the table from its next read of the catalog that finds it fixed as the message says (every --discover-interval, on SIGHUP, and right after DDL sent through pgfence); or take the table out of --guard"

// unfenceable refuses a write to a guarded table that cannot be fenced
// (see Guard.Unfenceable).
func unfenceable(g *guardInfo) *Refusal {
	return &Refusal{
		Code:    CodeUnfenceable,
		Message: "pgfence: writes to guarded table \"" + g.name + "\" are refused, as they cannot be fenced: " + g.Unfenceable,
		Hint:    hintUnfenceable,
	}
}

// tooLarge refuses a text of n bytes that may write a guarded table and is
// longer than the rewriter parses (Config.MaxParse).
func tooLarge(n, limit int) *Refusal {
	return &Refusal{
		Code:    CodeTooLarge,
		Message: "pgfence: a text of " + strconv.Itoa(n) + " bytes that may write a guarded table is longer than pgfence parses to fence it (" + strconv.Itoa(limit) + " bytes)",
		Hint:    hintTooLarge,
	}
}

func forgedEpoch(g *guardInfo) *Refusal {
	return &Refusal{
		Code:    codeForgedEpoch,
		Message: "pgfence: column " + quoteIdent(g.Column) + " of guarded table \"" + g.name + "\" holds the fencing epoch; no statement may assign it",
		Hint:    hintForgedEpoch,
	}
}

// unsupported refuses a form of write pgfence cannot fence.
func unsupported(form string, g *guardInfo, hint string) *Refusal {
	return &Refusal{
		Code:    codeUnsupported,
		Message: "pgfence: " + form + " on guarded table \"" + g.name + "\" cannot be fenced yet",
		Hint:    hint,
	}
}

// noColumnList refuses an INSERT whose epoch column position is unknown.
func noColumnList(g *guardInfo) *Refusal {
	return &Refusal{
		Code:    codeUnsupported,
		Message: "pgfence: INSERT into guarded table \"" + g.name + "\" needs a column list",
		Hint:    "name the columns, as in INSERT INTO t (a, b) VALUES ...; pgfence adds the epoch column itself",
	}
}

// positioned refuses UPDATE/DELETE ... WHERE CURRENT OF, whose WHERE can
// hold nothing else.
func positioned(kind string, g *guardInfo) *Refusal {
	return unsupported("positioned "+kind+" (WHERE CURRENT OF)", g,
		"fetch the row's key with the cursor and "+kind+" ... WHERE <key> = <value> instead")
}

// storedWrite refuses a write kept in a rule, a function body or a view,
// which would run later without the fence; writes to Observe tables are
// let through, since nothing about them is fenced anyway.
func storedWrite(kind string, stored proto.Message, g *guardInfo) *Refusal {
	if g.Rollout == Observe {
		return nil
	}
	switch stored.(type) {
	case *pg_query.RuleStmt:
		return unsupported("CREATE RULE ... DO "+kind, g,
			"a rule would write the guarded table without the fence; run the "+kind+" from the client instead")
	}
	what := stmtKind(stored)
	return unsupported(kind+" inside "+what, g,
		"the "+kind+" would run later without the fence; run it from the client instead")
}

// syntaxError refuses text pgfence rejects before parsing it (a NUL byte;
// what the parser rejects, unparsable refuses). msg may quote invalid UTF-8
// from the input, which the refusal must not repeat.
func syntaxError(msg string) *Refusal {
	return &Refusal{Code: codeSyntax, Message: "pgfence: " + strings.ToValidUTF8(msg, "\uFFFD")}
}

// refusalSQL makes Postgres raise the refusal as 22P02 while it analyses
// the statement, which in the extended protocol is already at Parse time.
func refusalSQL(ref *Refusal) string {
	msg := strings.TrimPrefix(ref.Message, "pgfence: ")
	return "SELECT (" + quoteLiteral("pgfence "+ref.Code+": "+msg) + ")::pg_catalog.int8"
}

// markerPrefix starts the text pgfence casts to int8 to raise its errors.
const markerPrefix = "pgfence "

// ParseErrorMarker recognises the error Postgres raises for a pgfence marker
// (SQLSTATE 22P02, `invalid input syntax for type bigint: "pgfence CODE:
// MESSAGE"`) and returns the refusal it stands for.
func ParseErrorMarker(code, message string) (Refusal, bool) {
	if code != "22P02" {
		return Refusal{}, false
	}
	// The marker is the first one in the message: Postgres's own prefix
	// comes before it and whatever follows is pgfence text or the token.
	for from := 0; ; {
		i := strings.Index(message[from:], markerPrefix)
		if i < 0 {
			return Refusal{}, false
		}
		rest := message[from+i+len(markerPrefix):]
		if len(rest) >= 7 && isSQLState(rest[:5]) && rest[5:7] == ": " {
			sqlstate, text := rest[:5], trimClosingQuote(rest[7:])
			return Refusal{Code: sqlstate, Message: "pgfence: " + text, Hint: markerHint(sqlstate, text)}, true
		}
		from += i + len(markerPrefix)
	}
}

func isSQLState(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// trimClosingQuote drops the quote Postgres puts after the value: '"' in
// English, another quotation mark in some translations.
func trimClosingQuote(s string) string {
	r, n := utf8.DecodeLastRuneInString(s)
	if strings.ContainsRune(`"'»«”“’」』`, r) {
		return s[:len(s)-n]
	}
	return s
}

// markerHint gives the hint for a marker's code. The token setting's name is
// taken from the message text, which pgfence wrote.
func markerHint(code, text string) string {
	switch code {
	case codeNoToken:
		// "no fencing token is set ... table "T"; set S first", or "set
		// S.D or S first" in a lock domain.
		if i := strings.LastIndex(text, "; set "); i >= 0 && strings.HasSuffix(text, " first") {
			if s, ok := settingsIn(text[i+len("; set ") : len(text)-len(" first")]); ok {
				return "SET " + s + " = '<token>' (or SET LOCAL inside a transaction) before writing"
			}
		}
		return "SET the fencing token setting (or SET LOCAL inside a transaction) before writing"
	case codeBadToken:
		if h, ok := TokenConflictHint("pgfence: " + text); ok {
			return h
		}
		// "S must be an integer fencing token ...", or "S.D or S must ..."
		if s, _, ok := strings.Cut(text, " must be an integer"); ok {
			if s, ok := settingsIn(s); ok {
				return "the token must be a whole number, e.g. SET " + s + " = '42'"
			}
		}
		return "the fencing token must be a whole number, e.g. '42'"
	case codeForgedEpoch:
		if h := internalHint(text); h != "" {
			return h
		}
		return hintForgedEpoch
	case codeUnsupported:
		if isUnparsableNewer(text) {
			return hintNewer
		}
		if strings.HasPrefix(text, "MERGE on guarded table ") {
			return hintMerge
		}
		if h := pooledHint(text); h != "" {
			return h
		}
		return hintUnsupported
	case codeReservedName:
		return hintReservedName
	case codeStaleDomain:
		return hintStaleDomain
	case CodeUnfenceable:
		return hintUnfenceable
	case CodeTooLarge:
		return hintTooLarge
	case codeSyntax:
		return unparsableHint(text)
	}
	return ""
}

// settingsIn reads how a marker names the token settings, "S" or, in a
// lock domain, "S.D or S", and returns them as a hint names them: "S" or
// "S.D (or S)".
func settingsIn(s string) (string, bool) {
	first, second, two := strings.Cut(s, " or ")
	switch {
	case !validSettingName(first):
		return "", false
	case !two:
		return first, true
	case validSettingName(second):
		return first + " (or " + second + ")", true
	}
	return "", false
}

// RefusedTable finds the guarded table a refusal of pgfence names (its
// messages say `... guarded table "T"; ...`, see tableSubject), "" if
// none.
func RefusedTable(msg string) string {
	const key = `guarded table "`
	i := strings.Index(msg, key)
	if i < 0 {
		return ""
	}
	rest := msg[i+len(key):]
	// The name ends where what follows it in the messages begins (a name
	// may hold quotes itself, as "Accounts" does).
	end := -1
	for _, after := range []string{`"; `, `" in lock domain "`, `"):`, `" holds`, `" cannot`, `" needs`, `" in lock domain`} {
		if j := strings.Index(rest, after); j >= 0 && (end < 0 || j < end) {
			end = j
		}
	}
	if end < 0 {
		end = strings.LastIndex(rest, `"`)
	}
	if end < 0 {
		return rest
	}
	return rest[:end]
}

// Refuse returns the Result that makes the server raise ref, for callers
// that must refuse a statement for reasons of their own.
func Refuse(ref *Refusal) *Result { return refused(ref) }
