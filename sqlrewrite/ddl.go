package sqlrewrite

// MayChangeTables reports, conservatively, whether sql could create,
// rename, move, attach or inherit a table: whether it spells CREATE, ALTER
// or IMPORT (FOREIGN SCHEMA) as a word of its own (see spellsKeyword),
// ignoring ASCII case. After such a text the guarded tables must be read
// from the catalog again: a new table with the epoch column, a table
// renamed or moved to another schema, a new partition or inheritance child.
// (SELECT ... INTO a new table is not caught.)
func MayChangeTables(sql string) bool {
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
func MayChangeReading(sql string) bool {
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
