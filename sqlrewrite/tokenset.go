package sqlrewrite

import (
	"slices"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// TokenSettings recognizes the statements that set the session's fencing
// token: the token setting itself, or a lock domain's
// <token setting>.<domain>. Postgres matches setting names without regard
// to ASCII case (guc.c's guc_name_compare), whether they were written
// quoted or not, and so does every method here.
type TokenSettings struct {
	names []string // lower case, as Postgres folds them: the token setting first
	// plain[i] says Postgres's parser takes names[i] unquoted in a SET (a
	// part that is a reserved keyword needs quotes).
	plain []bool
	// words are what Analyze's pass looks for, the token setting's
	// spellings among them.
	words *needles
	// maxParse is Config.MaxParse, for the parses a text's analysis
	// makes besides the rewrite's (see tooLong).
	maxParse int
}

// tooLong refuses sql when it is longer than the rewriter parses
// (Config.MaxParse): every parse of a client's text takes about 13 times
// its size, the rewrite's or another (red team 8: a 3 MB SELECT naming
// pgfence.* took pgfence to 550 MB).
func (ts TokenSettings) tooLong(sql string) *Refusal {
	if ts.maxParse > 0 && len(sql) > ts.maxParse {
		return tooLarge(len(sql), ts.maxParse)
	}
	return nil
}

// NewTokenSettings returns the recognizer for token and the lock domains'
// settings.
func NewTokenSettings(token string, domains []string) TokenSettings {
	var ts TokenSettings
	token = asciiLower(token)
	ts.words = newNeedles(token)
	for _, name := range append([]string{token}, domains...) {
		if name != token {
			name = token + "." + asciiLower(name)
		}
		if slices.Contains(ts.names, name) {
			continue
		}
		set, ok := parseTokenSet("SET "+name+" = '1'", 0)
		ts.names = append(ts.names, name)
		ts.plain = append(ts.plain, ok && !set.quoted && set.Value == "1" && plainSet(name))
	}
	return ts
}

// Names returns every token setting, lower case, the token setting first.
// The slice is shared: do not modify it.
func (ts TokenSettings) Names() []string { return ts.names }

// isToken reports whether name (as written in a statement, or given to
// set_config) names the token setting or a setting in its namespace
// (<token setting>.<anything>, where lock domains' settings are), as
// Postgres compares names: ASCII case folded.
func (ts TokenSettings) isToken(name string) bool {
	if len(ts.names) == 0 {
		return false
	}
	tok := ts.names[0]
	return len(name) >= len(tok) && equalFoldASCII(name[:len(tok)], tok) && (len(name) == len(tok) || name[len(tok)] == '.')
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
	// quoted says a part of the name was written in double quotes.
	quoted bool
}

// Match reports whether sql is exactly one statement that sets one of the
// token settings to a constant, and if so which setting, the text value
// Postgres would store, and whether the SET is LOCAL:
//
//	SET [SESSION | LOCAL] <name> { = | TO } { '<text>' | <integer> } [;]
//
// where name is written in any case, each of its dotted parts quoted or
// not. Such a statement can only fail on the server for reasons outside
// the statement (an aborted transaction, a cancel), so a proxy may answer
// it itself and run it later. Anything less plain (comments, escapes,
// DEFAULT, a second statement) is not recognized and so runs as sent:
// recognizing too little only costs speed. Name is the setting in lower
// case; Value shares sql's memory. Nothing is allocated, but for a name
// with a quoted part, which Postgres's parser confirms.
func (ts TokenSettings) Match(sql string) (TokenSet, bool) {
	i := space(sql, 0)
	if !word(sql, i, "set") {
		return TokenSet{}, false
	}
	set := ts.match(sql, i)
	return set, set.Name != ""
}

// match is Match of sql, whose first word, at sql[i], is SET: the zero
// TokenSet when it is not one plain SET of a token setting.
func (ts TokenSettings) match(sql string, i int) TokenSet {
	if len(ts.names) == 0 {
		return TokenSet{}
	}
	set, ok := parseTokenSet(sql, i)
	if !ok {
		return TokenSet{}
	}
	n, ok := ts.named(set.Name, set.quoted)
	if !ok || set.quoted && (ts.tooLong(sql) != nil || !parsedAs(sql, n, pg_query.VariableSetKind_VAR_SET_VALUE, set.Local)) {
		return TokenSet{}
	}
	set.Name, set.quoted = n, false
	return set
}

// named returns the token setting that spelled (a name as written: dotted
// parts, quoted or not) names. Unquoted, it must be one Postgres's parser
// takes unquoted.
func (ts TokenSettings) named(spelled string, quoted bool) (string, bool) {
	for i, n := range ts.names {
		if (quoted || ts.plain[i]) && spells(spelled, n) {
			return n, true
		}
	}
	return "", false
}

// parsedAs reports whether Postgres's parser reads sql as one SET (kind
// VAR_SET_VALUE, LOCAL or not) or RESET (VAR_RESET) of the setting name.
func parsedAs(sql, name string, kind pg_query.VariableSetKind, local bool) bool {
	counted("parse", sql)
	tree, err := pg_query.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		return false
	}
	set := tree.Stmts[0].Stmt.GetVariableSetStmt()
	return set != nil && set.Kind == kind && set.IsLocal == local && asciiLower(set.Name) == name
}

// settingName reads a setting's name at sql[i:] as a SET or RESET spells
// it: parts that are unquoted words or double-quoted identifiers, joined by
// dots with nothing between. It returns where the name ends and whether a
// part was quoted.
func settingName(sql string, i int) (end int, quoted, ok bool) {
	for {
		if i < len(sql) && sql[i] == '"' {
			j, ok := quotedToken(sql, i, '"', false) // "" is refused
			if !ok {
				return 0, false, false
			}
			i, quoted = j, true
		} else {
			j := i
			for j < len(sql) && isIdentCont(sql[j]) {
				j++
			}
			if j == i {
				return 0, false, false
			}
			i = j
		}
		if i < len(sql) && sql[i] == '.' {
			i++
			continue
		}
		return i, quoted, true
	}
}

// spells reports whether spelled, a name settingName read, names the
// setting lower (lower case) as Postgres compares them: quotes taken off,
// ASCII case folded.
func spells(spelled, lower string) bool {
	j := 0
	match := func(c byte) bool {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		ok := j < len(lower) && lower[j] == c
		j++
		return ok
	}
	for i := 0; i < len(spelled); i++ {
		if spelled[i] != '"' {
			if !match(spelled[i]) {
				return false
			}
			continue
		}
		for i++; i < len(spelled); i++ {
			if spelled[i] == '"' {
				if i+1 < len(spelled) && spelled[i+1] == '"' {
					i++
				} else {
					break
				}
			}
			if !match(spelled[i]) {
				return false
			}
		}
	}
	return j == len(lower)
}

// parseTokenSet reads sql, whose first word, at sql[i], is SET, as SET
// [SESSION | LOCAL] <name> { = | TO } <constant>, where name is dotted
// parts (see settingName), returned as written.
func parseTokenSet(sql string, i int) (set TokenSet, ok bool) {
	counted("token setting", sql)
	i = space(sql, i+len("set"))
	switch {
	case word(sql, i, "session"):
		i = space(sql, i+len("session"))
	case word(sql, i, "local"):
		set.Local = true
		i = space(sql, i+len("local"))
	}
	start := i
	i, set.quoted, ok = settingName(sql, i)
	if !ok {
		return set, false
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
		end, ok := quotedEnd(sql, i, '\'', true)
		if !ok {
			return "", 0, false
		}
		value = sql[i+1 : end-1]
		for j := 0; j < len(value); j++ {
			if c := value[j]; c == '\'' || c < ' ' || c > '~' { // a doubled quote is an escape
				return "", 0, false
			}
		}
		return value, end, true
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

// word reports whether sql spells the keyword kw at i, as a word of its own.
func word(sql string, i int, kw string) bool {
	return i < len(sql) && spellsKeyword(sql, i, kw)
}
