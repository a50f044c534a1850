package fence

import (
	"strings"

	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// unreadable refuses text that may write a guarded table when the session
// reads SQL differently from the parser pgfence uses: with
// standard_conforming_strings off a backslash can end a literal elsewhere,
// in a client-only multibyte encoding a quote byte can hide inside a
// character, and a non-ASCII guarded name is spelled in other bytes than
// pgfence looks for (see misreadsNonASCII). Any of them could hide a write
// from the rewriter (fail closed). The refusal reaches the client through the
// server, which drops its hint: Error gives it back (see unreadableHint).
func unreadable(st *state, c *proxy.Client, sql string) *sqlrewrite.Refusal {
	if !c.StandardConformingStrings() {
		return &sqlrewrite.Refusal{Code: "0A000", Message: msgNonStandardStrings, Hint: hintNonStandardStrings}
	}
	enc := c.ClientEncoding()
	if enc == "UTF8" || isASCII(sql) {
		return nil
	}
	if st.nonASCIINames && misreadsNonASCII(c) {
		// The text need not mention a guarded table that pgfence can see.
		return &sqlrewrite.Refusal{Code: "0A000",
			Message: "pgfence: while a guarded table's name is not ASCII, writes with non-ASCII text " + msgNeedUTF8 + encodingOf(c),
			Hint:    hintEncoding}
	}
	if enc != "SQL_ASCII" {
		return &sqlrewrite.Refusal{Code: "0A000",
			Message: "pgfence: statements that mention a guarded table and contain non-ASCII text " + msgNeedUTF8 + enc,
			Hint:    hintEncoding}
	}
	return nil
}

// The messages and hints of unreadable's refusals.
const (
	msgNonStandardStrings  = "pgfence: statements that mention a guarded table need standard_conforming_strings = on"
	hintNonStandardStrings = "SET standard_conforming_strings = on (the default since PostgreSQL 9.1)"
	msgNeedUTF8            = "need client_encoding UTF8, not "
	hintEncoding           = "SET client_encoding = 'UTF8'"
)

// unreadableHint is the hint of an unreadable refusal whose marker message
// is msg, "" for any other.
func unreadableHint(msg string) string {
	switch {
	case msg == msgNonStandardStrings:
		return hintNonStandardStrings
	case strings.Contains(msg, msgNeedUTF8):
		return hintEncoding
	}
	return ""
}

// misreadsNonASCII reports whether c's server may read non-ASCII bytes from
// c as other characters than the bytes guarded names are compared in, by
// the name prefilter (sqlrewrite.Rewriter.MayTouch) and by the rewriter,
// and spliced into rewrites in: UTF-8, or raw bytes on a SQL_ASCII server,
// whose names are raw bytes too. (ASCII bytes are the same characters in
// every encoding Postgres speaks, so ASCII text and ASCII names are safe
// anywhere.) That is wherever Postgres neither takes UTF-8 from the client
// nor leaves bytes alone on both sides: a client encoding other than UTF8
// and SQL_ASCII is converted (a LATIN1 "ö" is byte F6, not C3 B6), and
// SQL_ASCII bytes are taken as they are, in the server's encoding, which is
// UTF-8 only on a UTF8 server. The encodings are those the server reported;
// nothing is converted here.
func misreadsNonASCII(c *proxy.Client) bool {
	enc := c.ClientEncoding()
	if enc == "UTF8" {
		return false
	}
	srv := c.ServerEncoding()
	return srv != "SQL_ASCII" && (enc != "SQL_ASCII" || srv != "UTF8")
}

// encodingOf names c's client encoding, and the server's when that is
// what SQL_ASCII bytes are read in.
func encodingOf(c *proxy.Client) string {
	if enc := c.ClientEncoding(); enc != "SQL_ASCII" {
		return enc
	}
	return "SQL_ASCII (read as " + c.ServerEncoding() + ")"
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// readingProbe reads a session's standard_conforming_strings and
// client_encoding in the middle of an extended-protocol batch (see
// proxy.Interceptor.ReadingProbe).
var readingProbe = proxy.NewReadingProbe(sqlrewrite.ReadingProbeSQL)

// ReadingProbe implements proxy.Interceptor.
func (p *Policy) ReadingProbe() *proxy.Probe { return readingProbe }

// DependsOnReading implements proxy.Interceptor: it reports whether sql,
// which the client sent before the server said how it reads SQL after
// what came before, must wait for that. A text that reads the same
// whatever the settings (sqlrewrite.ReadsAlike), as nearly all do, need
// not; nor does one that cannot write a guarded table however it is read:
// the write keywords and guarded names Analyze looks for are ASCII
// letters, which a client encoding may swallow into a character (SJIS's
// second bytes include them) but never makes of other bytes, and Analyze
// looks for them across literals and comments, wherever they end. (A
// guarded name that is not ASCII is spelled in other bytes in another
// encoding: a write with non-ASCII text waits then.) Behind a transaction
// pooler every other text waits, as a misread one could also change the
// token for the session.
//
// Any statement may change the settings, not only one that spells them:
// a function call, DO, CALL, a trigger of a write, an operator or a
// cast, so what came before is not looked at.
func (p *Policy) DependsOnReading(c *proxy.Client, sql string) bool {
	if sqlrewrite.ReadsAlike(sql) {
		return false
	}
	st := p.state.Load()
	if st.cfg.TransactionPooling {
		return true
	}
	a := st.rw.Analyze(sql, false)
	if !a.Class.Has(sqlrewrite.Writes) && !a.MayBeDDL() {
		return false // neither a write nor DDL that may weaken a backstop (see sqlrewrite/weaken.go)
	}
	return a.Class.Has(sqlrewrite.Touches) || sessionOf(c).mayExecute(a.Class) || st.nonASCIINames && !isASCII(sql)
}
