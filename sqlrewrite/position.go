package sqlrewrite

import (
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// An error Postgres raises while it parses or analyses a statement says
// where in the text it is (the P field of an ErrorResponse, which psql
// turns into its LINE 1: ... ^ cursor). For a text pgfence rewrote, that is
// a place in pgfence's text, not in the client's: Position maps it back.
//
// Positions are as Postgres reports them: 1-based, and counted in
// characters, which are a UTF-8 text's runes unless the server's encoding
// is SQL_ASCII, where they are bytes (bytes set).

// Position maps pos, a position in r.SQL, to the same character of src,
// the text r was rewritten from. It returns 0 when pos is in text pgfence
// added, where the client wrote nothing to point at, or is not in r.SQL.
func (r *Result) Position(src string, pos int, bytes bool) int {
	if r.Refusal != nil {
		return 0
	}
	off, ok := r.inputOffset(pos, bytes, len(src))
	if !ok {
		return 0
	}
	return charPosition(src, off, bytes)
}

// inputOffset is the byte offset in the input (n bytes long) of the
// character at position pos of r.SQL; ok is false for a character
// pgfence added, or a position outside the texts.
func (r *Result) inputOffset(pos int, bytes bool, n int) (int, bool) {
	off, ok := byteOffset(r.SQL, pos, bytes)
	if !ok {
		return 0, false
	}
	if off, ok = sourceOffset(off, r.edits); !ok || off > n {
		return 0, false
	}
	return off, true
}

// TemplatePositions maps positions in the rewrite of a template (see
// RewriteTemplate) back to the texts it was made from, whose literals the
// template has as parameters.
type TemplatePositions struct {
	res   *Result
	sql   string      // the template
	spans []textRange // its parameters, in order, each with the space put before it, if any
	strs  []bool      // which parameters stand for string literals
}

// Positions returns what maps positions in res, the result of
// RewriteTemplate(p), back to the texts of p's template. It keeps neither
// p's text nor its values.
func (p Parameterized) Positions(res *Result) *TemplatePositions {
	scan, err := pg_query.Scan(p.SQL)
	if err != nil {
		return nil
	}
	t := &TemplatePositions{res: res, sql: p.SQL}
	for _, tok := range scan.Tokens {
		if tok.Token == pg_query.Token_PARAM {
			t.spans = append(t.spans, textRange{int(tok.Start), int(tok.End)})
		}
	}
	if len(t.spans) != len(p.Values) {
		return nil
	}
	t.strs = make([]bool, len(p.Types))
	for i, oid := range p.Types {
		t.strs[i] = oid == 0
	}
	for _, i := range p.spaced {
		t.spans[i].start--
	}
	return t
}

// Position maps pos, a position in the rewrite, to the same character of
// the text of the template whose literals had the values params (see
// Parameterized.Values). It returns 0 as Result.Position does.
func (t *TemplatePositions) Position(pos int, params []string, bytes bool) int {
	if t == nil || len(params) != len(t.spans) {
		return 0
	}
	off, ok := t.res.inputOffset(pos, bytes, len(t.sql))
	if !ok {
		return 0
	}
	// A parameter is ASCII: it is as many characters long as bytes.
	shift := 0
	for i, sp := range t.spans {
		if off < sp.start {
			break
		}
		if off < sp.end {
			off = sp.start // in a parameter: at its literal's first character
			break
		}
		shift += t.literalLen(i, params[i], bytes) - (sp.end - sp.start)
	}
	return charPosition(t.sql, off, bytes) + shift
}

// Param returns the position of parameter n's literal (1-based) in the
// text of the template whose literals had the values params, 0 if there
// is no such parameter.
func (t *TemplatePositions) Param(n int, params []string, bytes bool) int {
	if t == nil || len(params) != len(t.spans) || n < 1 || n > len(t.spans) {
		return 0
	}
	shift := 0
	for i := range n - 1 {
		shift += t.literalLen(i, params[i], bytes) - (t.spans[i].end - t.spans[i].start)
	}
	return charPosition(t.sql, t.spans[n-1].start, bytes) + shift
}

// literalLen is the length, in characters or bytes, of the literal whose
// value parameter i had.
func (t *TemplatePositions) literalLen(i int, v string, bytes bool) int {
	if !t.strs[i] {
		return len(v) // a number: ASCII
	}
	n := len(v)
	if !bytes {
		n = utf8.RuneCountInString(v)
	}
	return n + 2 + strings.Count(v, "'") // the quotes, and each quote doubled
}

// byteOffset is the byte offset in s of the character at position pos; the
// position just past the last character (an error at the end of the text)
// is len(s).
func byteOffset(s string, pos int, bytes bool) (int, bool) {
	if pos < 1 {
		return 0, false
	}
	if bytes {
		return pos - 1, pos-1 <= len(s)
	}
	off := 0
	for range pos - 1 {
		if off == len(s) {
			return 0, false
		}
		_, size := utf8.DecodeRuneInString(s[off:])
		off += size
	}
	return off, true
}

// charPosition is the position of the character at byte offset off of s.
func charPosition(s string, off int, bytes bool) int {
	if bytes {
		return off + 1
	}
	return utf8.RuneCountInString(s[:off]) + 1
}

// sourceOffset maps byte offset off in a text made by edits (in offset
// order) to the offset of the same byte in the text they were applied to;
// ok is false when off is in an edit's text.
func sourceOffset(off int, edits []edit) (int, bool) {
	shift := 0 // offset in the edited text minus offset in the source, so far
	for _, e := range edits {
		start := e.at + shift
		if off < start {
			break
		}
		if off < start+len(e.text) {
			return 0, false
		}
		shift += len(e.text) - e.del
	}
	return off - shift, true
}
