package sqlrewrite

import "strings"

// ReadingProbeSQL selects the session's standard_conforming_strings and
// client_encoding, in that order, as one row: the settings a text is read
// with, which Postgres reports to the client only right before
// ReadyForQuery, so not in the middle of an extended-protocol batch.
const ReadingProbeSQL = "SELECT pg_catalog.current_setting('standard_conforming_strings'), pg_catalog.current_setting('client_encoding')"

// SettingSQL sets a setting the proxy answered a SET of itself (see
// proxy.Config.SettingSQL), as the session's next statement needs it:
// set_config($1, $2, $3) of the name, the value and whether it is local,
// then the server's process id, by which the proxy finds a transaction
// pooler that would run it on a connection other than the session's. When
// $4 is true it also sets QuietSetting for the transaction: the proxy
// leaves the probe out after the write the setting goes with (see
// proxy.Quiet), and the stale rows of that write raise notices.
const SettingSQL = "SELECT pg_catalog.set_config($1, $2, $3), pg_catalog.pg_backend_pid() " +
	"FROM (SELECT CASE WHEN $4 THEN pg_catalog.set_config('" + QuietSetting + "', 'on', true) END) AS quiet"

// QuietSetting is 'on' for the transaction of a write whose probe the
// proxy leaves out: pgfence.note_stale raises its notice only then.
const QuietSetting = "pgfence.quiet"

// StandInSQL is the text of the Parse of the unnamed statement the proxy
// sends in place of a client's Parse that it answers with a statement it
// prepared for reuse (see proxy.Config.StandInSQL). Postgres parses it
// without a catalog lookup, and refuses it, as it would the client's, in a
// failed transaction block. Should it ever be bound, it fails with 26000
// (no such prepared statement), which says what to do, rather than run as
// an empty statement: a write silently not done.
const StandInSQL = `EXECUTE "pgfence: Parse the unnamed statement again"`

// ReadsAlike reports whether Postgres reads sql the same under every
// client_encoding and either standard_conforming_strings: it is all ASCII
// and has no backslash inside a '...' literal (see Reading differentials).
func ReadsAlike(sql string) bool {
	if strings.IndexByte(sql, '\\') < 0 {
		return isASCIIText(sql)
	}
	return isASCIIText(sql) && backslashesAlike(sql)
}

func isASCIIText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// backslashesAlike reports whether every backslash in sql, an ASCII text,
// is where both readings of standard_conforming_strings take it alike:
// outside any '...' literal but an E'...' one.
func backslashesAlike(sql string) bool {
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			// A comment to the end of the line, inside an operator too,
			// which it cuts there.
			i = lineComment(sql, i)
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			end, ok := blockComment(sql, i)
			if !ok {
				return false
			}
			i = end
		case c == '\'':
			end, ok := quotedEnd(sql, i, '\'', true)
			if !ok {
				return false // a backslash inside, or no end
			}
			i = end
		case c == '"':
			end, ok := quotedEnd(sql, i, '"', false)
			if !ok {
				return false
			}
			i = end
		case c == '$':
			// At the start of a token (identifiers are read whole below):
			// a parameter, a dollar-quoted string, or a lone "$".
			end, ok := dollarEnd(sql, i)
			if !ok {
				return false
			}
			i = end
		case isIdentStart(c):
			j := i + 1
			for j < len(sql) && isIdentCont(sql[j]) {
				j++
			}
			if j == i+1 && c|0x20 == 'e' && j < len(sql) && sql[j] == '\'' {
				// E'...': a backslash is an escape in either reading.
				end, ok := escapeLiteralEnd(sql, j)
				if !ok {
					return false
				}
				j = end
			}
			// Any other prefix (B, X, N, U&) leaves a '...' literal next,
			// read as a plain one above: a backslash in it says no, which
			// is right for N'...' and U&'...' and only careful for B'...'
			// and X'...'.
			i = j
		case isDigit(c):
			// A number's digits; whatever follows it (a point, an
			// exponent, junk) is read on as its own token, which takes
			// an "e" right before a quote for E'...' as Postgres 14 does
			// (1e'x' is 1 and E'x' there; later versions reject it).
			i++
		default:
			i++
		}
	}
	return true
}

// dollarEnd returns the end of what starts with "$" at sql[i], the start
// of a token: a parameter ($1), a dollar-quoted string ($$...$$,
// $tag$...$tag$), or a lone "$". ok is false for a dollar-quoted string
// with no end.
func dollarEnd(sql string, i int) (end int, ok bool) {
	if i+1 < len(sql) && isDigit(sql[i+1]) {
		return i + 1, true // the digits are read on as a number
	}
	tag, ok := dollarTag(sql, i)
	if !ok {
		return i + 1, true // not a delimiter: "$", then a word
	}
	return dollarQuotedEnd(sql, i, tag)
}
