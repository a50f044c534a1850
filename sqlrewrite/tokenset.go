package sqlrewrite

import (
	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// TokenSettings recognizes the statements that set the session's fencing
// token: the token setting itself, or a lock domain's
// <token setting>.<domain>.
type TokenSettings struct {
	names []string // lower case, as Postgres folds them
}

// NewTokenSettings returns the recognizer for token and the lock domains'
// settings. A name Postgres's parser does not take unquoted in a SET (a
// part that is a reserved keyword, say) is left out, so a SET of it is
// never recognized and runs as sent.
func NewTokenSettings(token string, domains []string) TokenSettings {
	var ts TokenSettings
	token = asciiLower(token)
	for _, name := range append([]string{token}, domains...) {
		if name != token {
			name = token + "." + asciiLower(name)
		}
		if set, ok := parseTokenSet("SET " + name + " = '1'"); !ok || set.Name != name || set.Value != "1" || !plainSet(name) {
			continue
		}
		ts.names = append(ts.names, name)
	}
	return ts
}

// plainSet reports whether Postgres's parser reads SET name = '1' as one
// plain SET of name.
func plainSet(name string) bool {
	tree, err := pg_query.Parse("SET " + name + " = '1'")
	if err != nil || len(tree.Stmts) != 1 {
		return false
	}
	set := tree.Stmts[0].Stmt.GetVariableSetStmt()
	return set != nil && set.Name == name && set.Kind == pg_query.VariableSetKind_VAR_SET_VALUE && !set.IsLocal
}

// TokenSet is a statement that sets a token setting, as Match reads it.
type TokenSet struct {
	Name  string // the setting, lower case
	Value string // the text value Postgres would store
	// Local is set for SET LOCAL, which lasts until the transaction
	// ends (and outside a block does nothing but warn).
	Local bool
	// Reset is set for a RESET (see MatchReset); Value is then "".
	Reset bool
}

// Match reports whether sql is exactly one statement that sets one of the
// token settings to a constant, and if so which setting, the text value
// Postgres would store, and whether the SET is LOCAL:
//
//	SET [SESSION | LOCAL] <name> { = | TO } { '<text>' | <integer> } [;]
//
// Such a statement can only fail on the server for reasons outside the
// statement (an aborted transaction, a cancel), so a proxy may answer it
// itself and run it later. Anything less plain (comments, quoted names,
// escapes, DEFAULT, a second statement) is not recognized and so runs as
// sent: recognizing too little only costs speed. Value shares sql's
// memory; nothing is allocated.
func (ts TokenSettings) Match(sql string) (TokenSet, bool) {
	if len(ts.names) == 0 {
		return TokenSet{}, false
	}
	set, ok := parseTokenSet(sql)
	if !ok {
		return TokenSet{}, false
	}
	for _, n := range ts.names {
		if isWord(set.Name, n) { // as Postgres folds an unquoted name: ASCII only
			set.Name = n
			return set, true
		}
	}
	return TokenSet{}, false
}

// parseTokenSet reads sql as SET [SESSION | LOCAL] <name> { = | TO }
// <constant>, where name is dotted words, returned as written.
func parseTokenSet(sql string) (set TokenSet, ok bool) {
	i := space(sql, 0)
	if !word(sql, i, "set") {
		return set, false
	}
	i = space(sql, i+len("set"))
	switch {
	case word(sql, i, "session"):
		i = space(sql, i+len("session"))
	case word(sql, i, "local"):
		set.Local = true
		i = space(sql, i+len("local"))
	}
	start := i
	for i < len(sql) && (isIdentCont(sql[i]) || sql[i] == '.') {
		i++
	}
	set.Name = sql[start:i]
	i = space(sql, i)
	switch {
	case i < len(sql) && sql[i] == '=':
		i++
	case word(sql, i, "to"):
		i += len("to")
	default:
		return set, false
	}
	i = space(sql, i)
	set.Value, i, ok = constant(sql, i)
	if !ok {
		return set, false
	}
	i = space(sql, i)
	if i < len(sql) && sql[i] == ';' {
		i = space(sql, i+1)
	}
	return set, i == len(sql)
}

// constant reads the value at sql[i:]: a plain single-quoted string of
// printable ASCII (no quote or backslash inside, so it means the same with
// standard_conforming_strings off), or an integer written as Postgres
// prints it (optional minus, no leading zeros), which it stores as the same
// text.
func constant(sql string, i int) (value string, end int, ok bool) {
	if i < len(sql) && sql[i] == '\'' {
		for j := i + 1; j < len(sql); j++ {
			switch c := sql[j]; {
			case c == '\'':
				if j+1 < len(sql) && sql[j+1] == '\'' {
					return "", 0, false // a doubled quote: an escape
				}
				return sql[i+1 : j], j + 1, true
			case c == '\\' || c < ' ' || c > '~':
				return "", 0, false
			}
		}
		return "", 0, false
	}
	j := i
	if j < len(sql) && sql[j] == '-' {
		j++
	}
	digits := j
	for j < len(sql) && isDigit(sql[j]) {
		j++
	}
	n := j - digits
	switch {
	case n == 0, n > 18, // int8 range, stored as written
		n > 1 && sql[digits] == '0',                            // 007 is stored as 7
		sql[i] == '-' && n == 1 && sql[digits] == '0',          // -0 is stored as 0
		j < len(sql) && (isIdentCont(sql[j]) || sql[j] == '.'): // 1e3, 1.5, 12abc
		return "", 0, false
	}
	return sql[i:j], j, true
}

// space skips white space (not comments: a text with one is not plain).
func space(sql string, i int) int {
	for i < len(sql) {
		switch sql[i] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			i++
		default:
			return i
		}
	}
	return i
}

// word reports whether sql spells the keyword kw at i, as a word of its own.
func word(sql string, i int, kw string) bool {
	return i < len(sql) && spellsKeyword(sql, i, kw)
}
