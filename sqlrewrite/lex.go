package sqlrewrite

import "strings"

// scanLiterals is parameterize's scanner: it reads sql the way Postgres's
// lexer does, as far as parameterize needs (where the numeric and plain
// string literals are, see lexed.plainString, and which keywords occur),
// without pg_query's cgo call and token
// allocations, which cost several times the rest of a simple-protocol
// write's plan. It reads whitespace, comments (nested /* */ too), string
// literals ('...', E'...', B'...', X'...', N'...', U&'...', dollar-quoted),
// quoted identifiers, words, plain decimal numbers, parameters and the single
// characters Postgres's operators and punctuation are made of. For
// anything else (a number with junk after it, "1..", an unterminated
// literal, a byte Postgres would reject, ...) ok is false and the caller
// asks pg_query, so that this never has to be right about the unusual.
// FuzzParameterize checks that the two agree whenever ok is true.
func scanLiterals(sql string, literals []textRange) (lx lexed, ok bool) {
	counted("literals", sql)
	if strings.IndexByte(sql, 0) >= 0 {
		return lx, false // where Postgres's lexer, reading a C string, stops
	}
	lx.literals = literals
	semicolon := false // only ';' and comments may follow one
	operator := 0      // the length of the run of operator characters so far
	for i := 0; i < len(sql); {
		c := sql[i]
		if strings.IndexByte(operatorChars, c) < 0 || c == '-' && i+1 < len(sql) && sql[i+1] == '-' ||
			c == '/' && i+1 < len(sql) && sql[i+1] == '*' {
			operator = 0
		} else if operator++; operator >= 64 {
			return lx, false // Postgres rejects an operator that long
		}
		switch {
		case isSpace(c):
			i++
			continue
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			i = lineComment(sql, i)
			continue
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			if i, ok = blockComment(sql, i); !ok {
				return lx, false
			}
			continue
		case c == ';':
			semicolon = true
			lx.token(tokOther)
			i++
			continue
		}
		if semicolon {
			lx.refuse = true // a second statement
		}
		end, ok := 0, true
		switch {
		case isDigit(c) || c == '.' && i+1 < len(sql) && isDigit(sql[i+1]):
			if end, ok = number(sql, i); !ok {
				return lx, false
			}
			lx.literals = append(lx.literals, textRange{i, end})
			lx.token(tokOther)
		case c == '.' && i+1 < len(sql) && sql[i+1] == '.':
			end = i + 2 // "..", which is not the start of a number
			lx.token(tokOther)
		case isIdentStart(c):
			end = i + 1
			for end < len(sql) && isIdentCont(sql[end]) {
				end++
			}
			word := sql[i:end]
			switch {
			case end < len(sql) && sql[end] == '\'' && len(word) == 1 && strings.IndexByte("eEbBxXnN", c) >= 0:
				end, ok = quotedToken(sql, end, '\'', c|0x20 == 'e') // a prefixed string
				lx.token(tokString)
			case end+1 < len(sql) && sql[end] == '&' && (sql[end+1] == '\'' || sql[end+1] == '"') && c|0x20 == 'u' && len(word) == 1:
				kind := tokWord // U&"", an identifier
				if sql[end+1] == '\'' {
					kind = tokString
				}
				end, ok = quotedToken(sql, end+1, sql[end+1], true) // U&'' and U&""
				lx.token(kind)
			default:
				switch {
				case len(word) == len("conflict") && equalFoldASCII(word, "conflict"):
					lx.conflict(i, len(sql))
				case len(word) == len("do") && equalFoldASCII(word, "do"):
					lx.do(i, len(sql))
				}
				lx.keyword(word)
				lx.word(word)
			}
		case c == '\'':
			if end, ok = quotedToken(sql, i, c, false); ok {
				lx.literals = lx.plainString(lx.literals, sql, i, end, true)
			}
		case c == '"':
			end, ok = quotedToken(sql, i, c, false)
			lx.token(tokWord)
		case c == '$':
			end, ok = dollar(sql, i, &lx)
		case strings.IndexByte(punctuation, c) >= 0:
			end = i + 1
			lx.token(tokOther)
		default:
			return lx, false
		}
		if !ok {
			return lx, false
		}
		i = end
	}
	return lx, true
}

// punctuation is every character Postgres's lexer reads as an operator or
// as a token of its own, but for the ones scanLiterals reads itself.
const punctuation = ",()[].:" + operatorChars

// operatorChars are the characters operators are made of.
const operatorChars = "+-*/%^<>=~!@#&|`?"

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// keyword notes a word parameterize looks for. Postgres folds only ASCII
// letters when it looks a word up as a keyword.
func (lx *lexed) keyword(word string) {
	if len(word) < 4 || len(word) > 8 {
		return
	}
	for _, k := range [...]struct {
		word                string
		writes, dml, refuse bool
	}{
		{"insert", true, true, false}, {"update", true, true, false}, {"delete", true, true, false},
		{"merge", true, false, false}, {"truncate", true, false, false}, {"copy", true, false, false},
		{"execute", true, false, false},
		{"order", false, false, true}, {"group", false, false, true}, {"distinct", false, false, true},
	} {
		if len(word) == len(k.word) && equalFoldASCII(word, k.word) {
			lx.writes = lx.writes || k.writes
			lx.dml = lx.dml || k.dml
			lx.refuse = lx.refuse || k.refuse
			return
		}
	}
}

// number returns the end of the plain decimal number at sql[i:]: digits
// with an optional point and exponent. ok is false where Postgres would
// read something else: an exponent without digits, "1..", or a letter,
// digit, "_", "$" or "." right after it (hexadecimal and underscored forms,
// or junk Postgres 15 rejects).
func number(sql string, i int) (end int, ok bool) {
	j := i
	for j < len(sql) && isDigit(sql[j]) {
		j++
	}
	if j < len(sql) && sql[j] == '.' {
		if j+1 < len(sql) && sql[j+1] == '.' {
			return 0, false
		}
		j++
		for j < len(sql) && isDigit(sql[j]) {
			j++
		}
	}
	if j < len(sql) && sql[j]|0x20 == 'e' {
		j++
		if j < len(sql) && (sql[j] == '+' || sql[j] == '-') {
			j++
		}
		if j == len(sql) || !isDigit(sql[j]) {
			return 0, false
		}
		for j < len(sql) && isDigit(sql[j]) {
			j++
		}
	}
	if j < len(sql) && (isIdentCont(sql[j]) || sql[j] == '.') {
		return 0, false
	}
	return j, true
}

// quotedToken is quotedEnd, but for a zero-length quoted identifier, which
// Postgres rejects (ok is false).
func quotedToken(sql string, i int, q byte, noBackslash bool) (end int, ok bool) {
	end, ok = quotedEnd(sql, i, q, noBackslash)
	if q == '"' && end == i+2 {
		return 0, false
	}
	return end, ok
}

// blockComment returns the end of the comment that starts at sql[i]
// ("/*"); Postgres's comments nest.
func blockComment(sql string, i int) (end int, ok bool) {
	depth := 0
	for i+1 < len(sql) {
		switch {
		case sql[i] == '/' && sql[i+1] == '*':
			depth++
			i += 2
		case sql[i] == '*' && sql[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i, true
			}
		default:
			i++
		}
	}
	return 0, false
}

// dollar reads what starts with "$" at sql[i]: a parameter ($1, which
// rules a template out) or a dollar-quoted string ($$...$$, $tag$...$tag$).
func dollar(sql string, i int, lx *lexed) (end int, ok bool) {
	j := i + 1
	if j < len(sql) && isDigit(sql[j]) {
		for j < len(sql) && isDigit(sql[j]) {
			j++
		}
		if j < len(sql) && isIdentCont(sql[j]) {
			return 0, false
		}
		lx.refuse = true
		lx.token(tokOther)
		return j, true
	}
	tag, ok := dollarTag(sql, i)
	if !ok {
		return 0, false
	}
	if end, ok = dollarQuotedEnd(sql, i, tag); ok {
		lx.token(tokString)
	}
	return end, ok
}

// Plain string literals ('...') are taken out like numbers where the
// tokens around one leave no doubt that it is a value of its own: not
// after a word (DATE '2024-01-01' and INTERVAL '1' DAY are typed literals,
// which a parameter cannot stand in for) but for the few that begin an
// expression (see valueWords), not touching a word (a parameter would run
// into it), and not next to another string (two strings with a newline
// between them are one literal). Whether the parameter means what the
// literal did is then decided on the template's parse tree (see
// stringParamsSafe), and for the value by plainStringValue.

// tokKind is what a token is, for the plain string literal after it.
type tokKind uint8

const (
	tokOther  tokKind = iota
	tokWord           // an identifier or keyword but a valueWord: it may name a type
	tokString         // a string literal of any form
)

// token notes a token that is not a plain string literal.
func (lx *lexed) token(k tokKind) {
	lx.prev, lx.prevTaken = k, false
}

// word notes an unquoted identifier or keyword.
func (lx *lexed) word(w string) {
	for _, v := range valueWords {
		if len(w) == len(v) && equalFoldASCII(w, v) {
			lx.token(tokOther)
			return
		}
	}
	lx.token(tokWord)
}

// valueWords are the keywords a value can follow, as in "WHERE 'a' = b"
// or "x LIKE 'a%'"; after any other word a string may be a typed literal.
var valueWords = [...]string{"and", "or", "not", "then", "else", "when", "case", "like", "ilike",
	"between", "symmetric", "escape", "where", "select", "returning", "from"}

// plainString notes the plain string literal sql[start:end], a candidate
// to take out unless the tokens around it say otherwise (see above), and
// returns literals with it added, or with the string before it dropped.
// (The caller assigns literals: an append through lx would move the
// caller's array to the heap.) single is false for strings continued over
// a newline, which Postgres's scanner reads as one token: not a candidate
// either.
func (lx *lexed) plainString(literals []textRange, sql string, start, end int, single bool) []textRange {
	take := lx.prev == tokOther && single && (start == 0 || !isIdentCont(sql[start-1])) &&
		(end == len(sql) || !isIdentCont(sql[end]))
	if lx.prev == tokString && lx.prevTaken {
		literals = literals[:len(literals)-1] // it continues here
	}
	if take {
		literals = append(literals, textRange{start, end})
	}
	lx.prev, lx.prevTaken = tokString, take
	return literals
}

// The blanks between tokens, one reading for every scan of the package:
// Postgres's white space (PostgreSQL 16's scanner, and pg_query's, read
// \v as one too; to 15's a \v outside a literal is a syntax error either
// way), "--" comments to the end of the line, and "/* */" comments, which
// nest.

// isSpace reports whether c is white space to Postgres's scanner.
func isSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\f', '\v':
		return true
	}
	return false
}

// space returns the offset of the first byte at or after sql[i] that is
// not white space (comments are not skipped: a text with one is not
// plain to the callers that read only plain texts).
func space(sql string, i int) int {
	for i < len(sql) && isSpace(sql[i]) {
		i++
	}
	return i
}

// blank returns the offset of the first byte at or after sql[i] that is
// neither white space nor in a comment. closed is false when a /* comment
// there is not closed (end is then len(sql)); a "--" comment may end the
// text.
func blank(sql string, i int) (end int, closed bool) {
	for {
		i = space(sql, i)
		switch {
		case strings.HasPrefix(sql[i:], "--"):
			if i = lineComment(sql, i); i == len(sql) {
				return i, true
			}
		case strings.HasPrefix(sql[i:], "/*"):
			j, ok := blockComment(sql, i)
			if !ok {
				return len(sql), false
			}
			i = j
		default:
			return i, true
		}
	}
}

// lineComment returns the end of the "--" comment at sql[i]: the line
// break that ends it (Postgres's is \n or \r), or the end of the text.
func lineComment(sql string, i int) int {
	if j := strings.IndexAny(sql[i:], "\n\r"); j >= 0 {
		return i + j
	}
	return len(sql)
}

// Strings, quoted identifiers and dollar quotes: one reading of each for
// every scan of the package that must know where they end.

// quotedEnd returns the end of the '...' literal or "..." quoted identifier
// whose opening quote q is at sql[i]; a doubled quote stands for one. With
// noBackslash, a backslash inside makes ok false: in E'...' and U&'...' it
// starts an escape, which Postgres's lexer checks and may reject, and in a
// plain '...' literal it is one with standard_conforming_strings off. ok
// is false too when the quote is not closed.
func quotedEnd(sql string, i int, q byte, noBackslash bool) (end int, ok bool) {
	for j := i + 1; j < len(sql); j++ {
		switch sql[j] {
		case '\\':
			if noBackslash {
				return 0, false
			}
		case q:
			if j+1 < len(sql) && sql[j+1] == q {
				j++
				continue
			}
			return j + 1, true
		}
	}
	return 0, false
}

// escapeLiteralEnd returns the end of the E'...' literal whose quote is at
// sql[i]: a backslash escapes the byte after it, and a doubled quote is
// one.
func escapeLiteralEnd(sql string, i int) (end int, ok bool) {
	for j := i + 1; j < len(sql); j++ {
		switch sql[j] {
		case '\\':
			j++
		case '\'':
			if j+1 < len(sql) && sql[j+1] == '\'' {
				j++
				continue
			}
			return j + 1, true
		}
	}
	return 0, false
}

// dollarTag returns the end of the dollar-quote delimiter ($$ or $tag$)
// at sql[i], the start of a token; ok is false when no delimiter starts
// there. A tag is a letter, "_" or non-ASCII byte, then those or digits.
func dollarTag(sql string, i int) (end int, ok bool) {
	j := i + 1
	if j < len(sql) && isIdentStart(sql[j]) {
		for j < len(sql) && isIdentCont(sql[j]) && sql[j] != '$' {
			j++
		}
	}
	if j == len(sql) || sql[j] != '$' {
		return 0, false
	}
	return j + 1, true
}

// dollarQuotedEnd returns the end of the dollar-quoted string whose
// delimiter is sql[i:tag]: right after the first same delimiter after it,
// as Postgres's lexer finds it; ok is false when there is none.
func dollarQuotedEnd(sql string, i, tag int) (end int, ok bool) {
	k := strings.Index(sql[tag:], sql[i:tag])
	if k < 0 {
		return 0, false
	}
	return tag + k + tag - i, true
}

// skipSpace is blank's offset: an unclosed comment runs to the end.
func skipSpace(sql string, i int) int {
	end, _ := blank(sql, i)
	return end
}

// castFollows reports whether "::" is the next token at sql[i:].
func castFollows(sql string, i int) bool {
	end, closed := blank(sql, i)
	return closed && strings.HasPrefix(sql[end:], "::")
}
