package sqlrewrite

import "strings"

// The prefilters as they were before Classify merged them into one pass:
// the oracles TestClassifyOracles and FuzzClassify hold Classify to.

// MayWrite is a conservative, allocation-free prefilter for the scanner's
// hasWriteKeyword: it returns false only when no write keyword is spelled
// in sql as a word of its own (see spellsKeyword), ignoring ASCII case as
// the scanner does. A keyword token is always such a word, so a text
// without one holds none and passes unchanged, whatever its literals,
// comments and quoting.
func oracleMayWrite(sql string) bool {
	for i := 0; i < len(sql); i++ {
		var kw string
		switch sql[i] | 0x20 { // ASCII lower case; other bytes match no case below
		case 'i':
			kw = "insert"
		case 'u':
			kw = "update"
		case 'd':
			kw = "delete"
		case 'm':
			kw = "merge"
		case 't':
			kw = "truncate"
		case 'c':
			kw = "copy"
		case 'e':
			kw = "execute"
		default:
			continue
		}
		if spellsKeyword(sql, i, kw) {
			return true
		}
	}
	return false
}

// MayInvalidate reports, conservatively, whether sql could drop prepared
// statements or change the tables their names stand for: whether it spells
// DEALLOCATE, DISCARD or search_path as a word of its own, calls set_config
// on the role (or on a setting it cannot name), or has a statement that is
// RESET ALL, sets the role (SET ROLE, SET SESSION AUTHORIZATION, their
// RESETs), or may undo such a change while a transaction goes on (ROLLBACK
// TO SAVEPOINT, COMMIT AND CHAIN). (Postgres plans a statement again after
// a search_path change, but with the parameter types it was first prepared
// with, which a table of the same name elsewhere may not take. The role is
// what "$user" in search_path stands for.)
func oracleMayInvalidate(sql string) bool {
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c|0x20 == 'd':
			if spellsKeyword(sql, i, "deallocate") || spellsKeyword(sql, i, "discard") {
				return true
			}
		case c == '_':
			if i >= len("search") && spellsKeyword(sql, i-len("search"), "search_path") {
				return true
			}
			if i >= len("set") && spellsKeyword(sql, i-len("set"), "set_config") &&
				setConfigMaySetRole(sql, i-len("set")+len("set_config")) {
				return true
			}
		case c == ';':
			if statementMayInvalidate(sql, i+1) {
				return true
			}
		}
	}
	return statementMayInvalidate(sql, 0)
}

// EndsTransaction reports, conservatively, whether a statement of sql
// starts COMMIT, END, ROLLBACK, ABORT or PREPARE TRANSACTION.
func oracleEndsTransaction(sql string) bool {
	for i := 0; ; {
		j := skipSpace(sql, i)
		if j < len(sql) {
			switch sql[j] | 0x20 {
			case 'c', 'e', 'r', 'a', 'p':
				if spellsKeyword(sql, j, "commit") || spellsKeyword(sql, j, "end") ||
					spellsKeyword(sql, j, "rollback") || spellsKeyword(sql, j, "abort") ||
					spellsKeyword(sql, j, "prepare") && spellsKeyword(sql, skipSpace(sql, j+len("prepare")), "transaction") {
					return true
				}
			}
		}
		k := strings.IndexByte(sql[i:], ';')
		if k < 0 {
			return false
		}
		i += k + 1
	}
}

// MayChangeTables reports, conservatively, whether sql could create,
// rename, move, attach or inherit a table: whether it spells CREATE, ALTER
// or IMPORT (FOREIGN SCHEMA) as a word of its own (see spellsKeyword),
// ignoring ASCII case. After such a text the guarded tables must be read
// from the catalog again: a new table with the epoch column, a table
// renamed or moved to another schema, a new partition or inheritance child.
// (SELECT ... INTO a new table is not caught.)
func oracleMayChangeTables(sql string) bool {
	for i := 0; i < len(sql); i++ {
		var kw string
		switch sql[i] | 0x20 {
		case 'c':
			kw = "create"
		case 'a':
			kw = "alter"
		case 'i':
			kw = "import"
		default:
			continue
		}
		if spellsKeyword(sql, i, kw) {
			return true
		}
	}
	return false
}

// MayChangeReading reports, conservatively, whether sql could change how
// Postgres reads the session's later texts, which the proxy learns only
// from the server's reply: whether it spells client_encoding, NAMES (SET
// NAMES) or standard_conforming_strings as a word of its own, or RESET or
// DISCARD together with ALL. (A setting changed by a function, or by a
// set_config whose name is computed, is not caught.)
func oracleMayChangeReading(sql string) bool {
	reset, all := false, false
	for i := 0; i < len(sql); i++ {
		switch sql[i] | 0x20 {
		case 'c':
			if spellsKeyword(sql, i, "client_encoding") {
				return true
			}
		case 'n':
			if spellsKeyword(sql, i, "names") {
				return true
			}
		case 's':
			if spellsKeyword(sql, i, "standard_conforming_strings") {
				return true
			}
		case 'r':
			reset = reset || spellsKeyword(sql, i, "reset")
		case 'd':
			reset = reset || spellsKeyword(sql, i, "discard")
		case 'a':
			all = all || spellsKeyword(sql, i, "all")
		}
	}
	return reset && all
}

// MayTouch is a conservative, allocation-free prefilter: it returns false
// only when sql certainly cannot name a guarded table, because no guarded
// table name occurs in it (ASCII case-insensitively, with any " doubled as
// a quoted name must be written) and it has no U& escaped identifier. (An
// EXECUTE of a prepared write names no table; Rewrite checks for it when it
// has a Session.)
func (r *Rewriter) oracleMayTouch(sql string) bool {
	if len(r.needles) == 0 {
		return false
	}
	if ContainsFold(sql, "u&") {
		return true
	}
	for _, n := range r.needles {
		if ContainsFold(sql, n) {
			return true
		}
	}
	return false
}

// The prefilters as they were before Analyze merged them into its pass:
// the oracles TestAnalyzeOracles and FuzzAnalyze hold it to.

// oracleMayNameInternal is InternalChange's prefilter (see there), one pass
// over sql: every statement the proxy hands the policy goes through it.
func oracleMayNameInternal(sql string) bool {
	setConfig := false
	for i := 0; i < len(sql); i++ {
		if !internalFirst[sql[i]] {
			continue
		}
		rest := sql[i:]
		switch {
		case len(rest) >= len("pgfence") && equalFoldASCII(rest[:len("pgfence")], "pgfence"):
			return true
		case len(rest) >= 2 && rest[1] == '&' && rest[0]|0x20 == 'u':
			return true
		case !setConfig && len(rest) >= len("set_config") && equalFoldASCII(rest[:len("set_config")], "set_config"):
			setConfig = true
		}
	}
	return setConfig && strings.ContainsAny(sql, "\\\n\r")
}

// internalFirst are the bytes oracleMayNameInternal looks at: the first of
// pgfence, u& and set_config, in either case.
var internalFirst = [256]bool{'p': true, 'P': true, 'u': true, 'U': true, 's': true, 'S': true}

// oracleMayChangeSession is SessionChange's prefilter, allocation-free: sql
// spells the token setting's first part ("fence" of fence.token, which
// every spelling of it and of every lock domain's has, quoted or spaced
// out), set_config, RESET, DISCARD, or a Unicode escape (U&"...", which
// could spell any of them), ignoring ASCII case.
func oracleMayChangeSession(sql, token string) bool {
	first, _, _ := strings.Cut(token, ".")
	return ContainsFold(sql, first) || ContainsFold(sql, "set_config") ||
		ContainsFold(sql, "reset") || ContainsFold(sql, "discard") || ContainsFold(sql, "u&")
}

// oracleWritesNothing reports whether sql is one statement that can run none of
// the user's SQL, and so write nothing and read no token: transaction
// control, SET, SHOW, LISTEN and the like, and the maintenance commands
// Postgres refuses to run inside a transaction block or a pipeline
// (VACUUM, CREATE INDEX CONCURRENTLY, CREATE DATABASE, ALTER SYSTEM...),
// which a statement of pgfence's ahead of them in their transaction would
// make fail. It looks at the first words only, after comments, and says
// false for anything it does not know or for more than one statement.
func oracleWritesNothing(sql string) bool {
	i := skipSpace(sql, 0)
	return oracleOneStatement(sql) && leadWritesNothing(sql, i, ContainsFold(sql, "set_config"), ContainsFold(sql, "concurrently"))
}

// oracleOneStatement reports whether sql has no semicolon but, at most, a last
// one followed by white space: a semicolon in a string counts, which errs
// towards "more than one".
func oracleOneStatement(sql string) bool {
	k := strings.IndexByte(sql, ';')
	return k < 0 || space(sql, k+1) == len(sql)
}

// oracleShowsToken reports whether sql, which oracleWritesNothing clears, may read or
// set a token setting all the same: a SHOW, SET or RESET that spells the
// token setting's first part (any case, quoted or spaced out) or a Unicode
// escape. Behind a transaction pooler its transaction then needs the
// session's token settings too.
func oracleShowsToken(sql, token string) bool {
	if !leadShows(leadWord(sql, skipSpace(sql, 0))) {
		return false
	}
	first, _, _ := strings.Cut(token, ".")
	return ContainsFold(sql, asciiLower(first)) || ContainsFold(sql, "u&")
}

// oracleSpellsTxEnd reports whether sql spells, as a word of its own, a keyword
// that starts a statement that may end a transaction.
func oracleSpellsTxEnd(sql string) bool {
	for _, w := range [...]string{"commit", "end", "rollback", "abort", "prepared", "transaction"} {
		if spellsWord(sql, w) {
			return true
		}
	}
	return false
}
