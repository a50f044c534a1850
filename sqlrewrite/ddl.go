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
