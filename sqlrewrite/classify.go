package sqlrewrite

// Class is what one pass over a text tells the policy about it (see
// Classify): a set of conservative facts, each false only when the text
// cannot be what it names.
type Class uint16

const (
	// Writes: the text spells a write keyword (INSERT, UPDATE, DELETE,
	// MERGE, TRUNCATE, COPY, EXECUTE) as a word of its own, ignoring ASCII
	// case as the scanner does. Without one it holds none, whatever its
	// literals, comments and quoting, and Rewrite passes it unchanged.
	Writes Class = 1 << iota
	// Executes: "execute" appears anywhere, ignoring case: the text may
	// EXECUTE a statement the session PREPAREd, which it need not name.
	Executes
	// Invalidates: the text may drop prepared statements or change the
	// tables their names stand for: it spells DEALLOCATE, DISCARD or
	// search_path, calls set_config on the role (or on a setting it cannot
	// name), or has a statement that is RESET ALL, sets the role (SET
	// ROLE, SET SESSION AUTHORIZATION, their RESETs), or may undo such a
	// change while a transaction goes on (ROLLBACK TO SAVEPOINT, COMMIT
	// AND CHAIN). (Postgres plans a statement again after a search_path
	// change, but with the parameter types it was first prepared with,
	// which a table of the same name elsewhere may not take. The role is
	// what "$user" in search_path stands for.)
	Invalidates
	// EndsTx: a statement of the text starts COMMIT, END, ROLLBACK, ABORT
	// or PREPARE TRANSACTION.
	EndsTx
	// ChangesTables: the text may create, rename, move, attach or inherit a
	// table: it spells CREATE, ALTER or IMPORT (FOREIGN SCHEMA). After it
	// the guarded tables must be read from the catalog again. (SELECT ...
	// INTO a new table is not caught.)
	ChangesTables
	// ChangesReading: the text may change how Postgres reads the
	// session's later texts, which the proxy learns only from the server's
	// reply: it spells client_encoding, NAMES (SET NAMES) or
	// standard_conforming_strings, or RESET or DISCARD together with ALL.
	// (A setting changed by a function, or by a set_config whose name is
	// computed, is not caught.)
	ChangesReading
	// Touches: the text may name a guarded table: it holds the name of one
	// as it must appear in SQL text, ignoring ASCII case, or a Unicode
	// escape (U&"..."). Only Rewriter.Classify says it.
	Touches
)

// Has reports whether every fact of f holds for c.
func (c Class) Has(f Class) bool { return c&f == f }

// Classify is one pass over sql, the whole text of a Query or Parse, that
// says everything the policy needs to decide what to do with it without
// parsing (all but Touches, which needs the guards: see
// Rewriter.Classify). It allocates nothing.
func Classify(sql string) Class { return classify(sql, nil) }

// Classify is the package's Classify with Touches: whether sql may name
// one of r's guarded tables.
func (r *Rewriter) Classify(sql string) Class { return classify(sql, r) }

func classify(sql string, r *Rewriter) Class {
	var s scan
	return s.run(sql, r, nil)
}

// word is what the word starting at sql[i] says (see scan.run): the
// facts of the keywords it may be; and it notes whether it is RESET or
// DISCARD, ALL, or a word that starts a statement that may end a
// transaction (see spellsTxEnd).
func (s *scan) word(sql string, i int) Class {
	var c Class
	switch sql[i] | 0x20 { // ASCII lower case; other bytes match no letter
	case 'a':
		if spellsKeyword(sql, i, "alter") {
			c |= ChangesTables
		}
		s.all = s.all || spellsKeyword(sql, i, "all")
		s.txEnd = s.txEnd || spellsKeyword(sql, i, "abort")
	case 'c':
		switch {
		case spellsKeyword(sql, i, "copy"):
			c |= Writes
		case spellsKeyword(sql, i, "create"):
			c |= ChangesTables
		case spellsKeyword(sql, i, "client_encoding"):
			c |= ChangesReading
		case spellsKeyword(sql, i, "commit"):
			s.txEnd = true
		}
	case 'd':
		switch {
		case spellsKeyword(sql, i, "delete"):
			c |= Writes
		case spellsKeyword(sql, i, "deallocate"):
			c |= Invalidates
		case spellsKeyword(sql, i, "discard"):
			c |= Invalidates
			s.reset = true
		}
	case 'e':
		switch {
		case spellsKeyword(sql, i, "execute"):
			c |= Writes
		case spellsKeyword(sql, i, "end"):
			s.txEnd = true
		}
	case 'i':
		switch {
		case spellsKeyword(sql, i, "insert"):
			c |= Writes
		case spellsKeyword(sql, i, "import"):
			c |= ChangesTables
		}
	case 'm':
		if spellsKeyword(sql, i, "merge") {
			c |= Writes
		}
	case 'n':
		if spellsKeyword(sql, i, "names") {
			c |= ChangesReading
		}
	case 'p':
		s.txEnd = s.txEnd || spellsKeyword(sql, i, "prepared")
	case 'r':
		s.reset = s.reset || spellsKeyword(sql, i, "reset")
		s.txEnd = s.txEnd || spellsKeyword(sql, i, "rollback")
	case 's':
		if spellsKeyword(sql, i, "standard_conforming_strings") {
			c |= ChangesReading
		}
	case 't':
		switch {
		case spellsKeyword(sql, i, "truncate"):
			c |= Writes
		case spellsKeyword(sql, i, "transaction"):
			s.txEnd = true
		}
	case 'u':
		if spellsKeyword(sql, i, "update") {
			c |= Writes
		}
	}
	return c
}

// statementClass is what the statement at sql[i:] (up to the next ";",
// which errs on the safe side) says by how it starts: EndsTx,
// and Invalidates for one that sets the role or ends part of a
// transaction (see statementMayInvalidate).
func statementClass(sql string, i int) Class {
	var c Class
	if statementMayInvalidate(sql, i) {
		c |= Invalidates
	}
	j := skipSpace(sql, i)
	if j < len(sql) {
		switch sql[j] | 0x20 {
		case 'c', 'e', 'r', 'a', 'p':
			if spellsKeyword(sql, j, "commit") || spellsKeyword(sql, j, "end") ||
				spellsKeyword(sql, j, "rollback") || spellsKeyword(sql, j, "abort") ||
				spellsKeyword(sql, j, "prepare") && spellsKeyword(sql, skipSpace(sql, j+len("prepare")), "transaction") {
				c |= EndsTx
			}
		}
	}
	return c
}

// nameAt reports whether a guarded table's name (as it must appear in SQL
// text) or a Unicode escape ("u&") starts at sql[i], ignoring ASCII case.
func (r *Rewriter) nameAt(sql string, i int) bool {
	b := sql[i]
	if !r.firsts[b] {
		return false
	}
	if 'A' <= b && b <= 'Z' {
		b += 'a' - 'A'
	}
	if b == 'u' && i+1 < len(sql) && sql[i+1] == '&' {
		return true
	}
	for _, n := range r.needles {
		if n[0] == b && i+len(n) <= len(sql) && equalFoldASCII(sql[i:i+len(n)], n) {
			return true
		}
	}
	return false
}

// The single facts, for callers that need one.

// MayWrite reports Classify(sql).Has(Writes).
func MayWrite(sql string) bool { return Classify(sql).Has(Writes) }
