package sqlrewrite

import (
	"slices"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// statementMayInvalidate reports whether the statement at sql[i:] (up to
// the next ";", which errs on the safe side) is RESET ALL, a SET or RESET
// that names the role, or ends a transaction or part of one but goes on
// in a transaction (a change made in what ends changes back then, where the
// proxy sees no end of a transaction block).
func statementMayInvalidate(sql string, i int) bool {
	i = skipSpace(sql, i)
	if i == len(sql) {
		return false
	}
	var kws []string
	switch sql[i] | 0x20 {
	case 'r':
		kws = []string{"rollback", "reset"}
	case 's':
		kws = []string{"set"}
	case 'c', 'e', 'a':
		kws = []string{"commit", "end", "abort"}
	default:
		return false
	}
	stmt := sql
	if j := strings.IndexByte(sql[i:], ';'); j >= 0 {
		stmt = sql[:i+j]
	}
	for _, kw := range kws {
		if !spellsKeyword(stmt, i, kw) {
			continue
		}
		rest := stmt[i+len(kw):]
		switch kw {
		case "rollback":
			return spellsWord(rest, "to") || spellsWord(rest, "chain")
		case "reset":
			return spellsKeyword(rest, skipSpace(rest, 0), "all") || spellsRole(rest)
		case "set":
			return spellsRole(rest)
		default:
			return spellsWord(rest, "chain")
		}
	}
	return false
}

// setConfigMaySetRole reports whether the set_config call whose name ends
// at sql[i] may set the role: unless its first argument is a plain string
// naming another setting, it may. A name that is not followed by "(" is no
// call (a column, say).
func setConfigMaySetRole(sql string, i int) bool {
	i = skipSpace(sql, i)
	if i == len(sql) || sql[i] != '(' {
		return false
	}
	i = skipSpace(sql, i+1)
	if i == len(sql) || sql[i] != '\'' {
		return true // a parameter, an expression, E'...'
	}
	end, ok := quotedEnd(sql, i, '\'', true)
	name := sql[i+1 : max(end-1, i+1)]
	if !ok || strings.IndexByte(name, '\'') >= 0 {
		return true // no end, an escape or a doubled quote: read it as Postgres might
	}
	return isWord(name, "role") || isWord(name, "session_authorization")
}

// isWord reports whether s is lower, ignoring ASCII case.
func isWord(s, lower string) bool {
	return len(s) == len(lower) && equalFoldASCII(s, lower)
}

// spellsRole reports whether sql spells ROLE or AUTHORIZATION (SET SESSION
// AUTHORIZATION) as a word of its own.
func spellsRole(sql string) bool {
	return spellsWord(sql, "role") || spellsWord(sql, "authorization")
}

// spellsWord reports whether sql spells kw (lower case) as a word of its
// own anywhere.
func spellsWord(sql, kw string) bool {
	for i := 0; i+len(kw) <= len(sql); i++ {
		if sql[i]|0x20 == kw[0] && spellsKeyword(sql, i, kw) {
			return true
		}
	}
	return false
}

// spellsKeyword reports whether keyword kw (lower case) is spelled at
// sql[i:], ignoring ASCII case, as a word of its own: the scanner reads
// letters, digits, "_", "$" and non-ASCII bytes after a letter as one
// identifier, so kw is not a token where one of them follows it or a
// letter, "_" or non-ASCII byte comes right before it (a digit or "$"
// before it counts as a word boundary, which errs on the safe side).
func spellsKeyword(sql string, i int, kw string) bool {
	end := i + len(kw)
	if end > len(sql) || i > 0 && isIdentStart(sql[i-1]) {
		return false
	}
	return equalFoldASCII(sql[i:end], kw) && (end == len(sql) || !isIdentCont(sql[end]))
}

// hasWriteKeyword reports whether tokens hold a write keyword.
func hasWriteKeyword(tokens []*pg_query.ScanToken) bool { return hasKeyword(tokens, writeKeywords[:]) }

// hasKeyword reports whether tokens hold one of keywords.
func hasKeyword(tokens []*pg_query.ScanToken, keywords []pg_query.Token) bool {
	for _, t := range tokens {
		if slices.Contains(keywords, t.Token) {
			return true
		}
	}
	return false
}
