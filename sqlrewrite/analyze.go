package sqlrewrite

import "math/bits"

// Analysis is what one pass over a text, the whole text of a Query or
// Parse, tells the policy (see Rewriter.Analyze): its Class, the token
// setting it sets or resets when it is one plain SET or RESET of one, and
// the facts each later stage needs to know whether it must read the text
// at all (InternalChange, SessionChange, TxStarts, the rewrite). Every
// fact is conservative: false only when the text cannot be what it names.
// It holds no memory of its own but sql's (the TokenSet's value) and the
// Rewriter's.
type Analysis struct {
	// Class is what Rewriter.Classify says of the text.
	Class Class
	// sql is the text, lent by the caller for as long as it asks the
	// analysis.
	sql string
	// set is the plain SET or RESET of a token setting the text is, when
	// facts has fSetsToken.
	set   TokenSet
	facts facts
	// tokens are the token settings of the Rewriter that made it.
	tokens *TokenSettings
}

// facts are an Analysis's facts beyond its Class.
type facts uint16

const (
	// fSetsToken: the text is one plain SET (TokenSettings.Match) or RESET
	// (MatchReset) of a token setting: Analysis.set holds it.
	fSetsToken facts = 1 << iota
	// fInternal: InternalChange's prefilter (see mayNameInternal).
	fInternal
	// fSessionChange: SessionChange's prefilter (see mayChangeSession).
	fSessionChange
	// fDrops: "drop" appears anywhere (see MayBeDDL).
	fDrops
	// fNamesToken: the token setting appears anywhere, ignoring ASCII case.
	fNamesToken
	// fWritesNothing: see WritesNothing.
	fWritesNothing
	// fShowsToken: see ShowsToken.
	fShowsToken
	// fCalls: a parenthesis appears anywhere: the text may call a function.
	fCalls
	// fTxStarts: the text has more than one statement and spells a word
	// that starts one that may end a transaction (see TxStarts).
	fTxStarts
	// fPooled: the analysis was made behind a transaction pooler, and
	// looked for what only that needs (see Analyze).
	fPooled
)

// Analyze is the one pass over sql, the whole text of a Query or Parse,
// whose result every decision of the policy about sql switches over: its
// Class (Classify, with Touches), whether it is a plain SET or RESET of a
// token setting and which (TokenSettings.Match, MatchReset), and the
// prefilters of the later stages, which then read sql only when it says
// they must. It allocates nothing. Besides the pass, it reads the first
// words of sql, and a SET or RESET statement to its end.
//
// Behind a transaction pooler (pooled) it says more: whether the text is
// a RESET of a token setting, may change one for the session, needs the
// session's token settings (MayUseToken) or starts transactions of its own
// (TxStarts). Without, those facts are not looked for: Setting is a SET's
// only, and SessionChange, MayUseToken and TxStarts, which are not meant
// to be asked then, fail closed (they read the text on their own, or say
// true).
func (r *Rewriter) Analyze(sql string, pooled bool) Analysis {
	a := Analysis{sql: sql, tokens: &r.tokens}
	s := scan{want: plainNeedles}
	if pooled {
		s.want = allNeedles
	}
	a.Class = s.run(sql, r, r.tokens.words)
	f := s.found
	if f.mayNameInternal() {
		a.facts |= fInternal
	}
	if f.mayChangeSession() {
		a.facts |= fSessionChange
	}
	if f.has(nDrop) {
		a.facts |= fDrops
	}
	if f.has(nToken) {
		a.facts |= fNamesToken
	}
	if f.has(nParen) {
		a.facts |= fCalls
	}
	// The first words: a SET (or RESET) of a token setting, and the
	// statements that run none of the user's SQL.
	i := space(sql, 0)
	switch {
	case word(sql, i, "set"):
		a.set = r.tokens.match(sql, i)
	case pooled && word(sql, i, "reset"):
		a.set = r.tokens.matchReset(sql, i)
	}
	if a.set.Name != "" {
		a.facts |= fSetsToken
	}
	if !pooled {
		return a
	}
	a.facts |= fPooled
	one := s.oneStatement(sql)
	if !one && s.txEnd {
		a.facts |= fTxStarts
	}
	i = skipSpace(sql, 0)
	if one && leadWritesNothing(sql, i, f.has(nSetConfig), f.has(nConcurrently)) {
		a.facts |= fWritesNothing
		if leadShows(leadWord(sql, i)) && (f.has(nTokenFirst) || f.has(nUAmp)) {
			a.facts |= fShowsToken
		}
	}
	return a
}

// Tokens returns r's token settings: the token setting and its lock
// domains'.
func (r *Rewriter) Tokens() TokenSettings { return r.tokens }

// Setting returns the token setting the text sets (TokenSettings.Match)
// or resets (MatchReset, with Reset set) when it is one plain SET or RESET
// of one.
func (a *Analysis) Setting() (TokenSet, bool) {
	return a.set, a.facts&fSetsToken != 0
}

// MayBeDDL is the package's MayBeDDL for the analysed text.
func (a *Analysis) MayBeDDL() bool {
	return a.Class.Has(ChangesTables) || a.facts&fDrops != 0
}

// MayUseToken reports whether the text, run on its own, may read or set a
// token setting or write at all: it names the token setting (however it
// spells it); or it is not one statement that can run none of the user's
// SQL (transaction control, SET, SHOW, LISTEN, VACUUM, CREATE INDEX
// CONCURRENTLY and the like: see leadWritesNothing) and spells a write
// keyword or a parenthesis (a function call); or it is one such SHOW, SET
// or RESET that spells the token setting's first part or a Unicode escape.
// Behind a transaction pooler its transaction then needs the session's
// token settings.
func (a *Analysis) MayUseToken() bool {
	switch {
	case a.facts&fPooled == 0:
		return true // not looked for: see Analyze
	case a.facts&fNamesToken != 0:
		return true
	case a.facts&fWritesNothing != 0:
		return a.facts&fShowsToken != 0
	}
	return a.Class.Has(Writes) || a.facts&fCalls != 0
}

// InternalChange is the package's InternalChange of the analysed text: it
// parses the text only when the analysis says it may set one of pgfence's
// own settings.
func (a *Analysis) InternalChange() *Refusal {
	if a.facts&fInternal == 0 {
		return nil
	}
	if ref := a.tokens.tooLong(a.sql); ref != nil {
		return ref // it may set one: refused unread
	}
	return internalChange(a.sql)
}

// SessionChange is TokenSettings.SessionChange of the analysed text: it
// parses the text only when the analysis says it may change a token
// setting for the session.
func (a *Analysis) SessionChange() (form string, ok bool, unread *Refusal) {
	switch {
	case a.facts&fPooled == 0:
		return a.tokens.SessionChange(a.sql) // not looked for: see Analyze
	case a.facts&fSessionChange == 0:
		return "", false, nil
	}
	return a.tokens.sessionChange(a.sql)
}

// TxStarts is the package's TxStarts of the analysed text: it parses the
// text only when the analysis says it may have such statements.
func (a *Analysis) TxStarts() ([]TxStart, *Refusal) {
	switch {
	case a.facts&fPooled == 0:
		if ref := a.tokens.tooLong(a.sql); ref != nil {
			return nil, ref
		}
		return TxStarts(a.sql) // not looked for: see Analyze
	case a.facts&fTxStarts == 0:
		return nil, nil
	}
	if ref := a.tokens.tooLong(a.sql); ref != nil {
		return nil, ref
	}
	return txStarts(a.sql)
}

// TxStartsParse reports whether TxStarts parses the text (or may: an
// analysis made outside a transaction pooler did not look), which a
// caller that sees the text again may spare by keeping what it found.
func (a *Analysis) TxStartsParse() bool {
	return a.facts&fPooled == 0 || a.facts&fTxStarts != 0
}

// The strings the pass looks for anywhere in a text, ignoring ASCII case:
// the prefilters' words (see Analyze). The token setting's are the
// Rewriter's (see newNeedles).
const (
	nPgfence = iota
	nUAmp
	nSetConfig
	nReset
	nDiscard
	nDrop
	nConcurrently
	nParen
	nBackslash
	nLF
	nCR
	nTokenFirst // the token setting's first part
	nToken      // the whole token setting
	nNeedles
)

// needles are the strings the pass looks for anywhere (see above), lower
// case, and by each byte the needles that start with it, either case.
type needles struct {
	words [nNeedles]string
	first [256]uint16
	// second are, by each byte, the needles whose second byte it is (either
	// case), and the needles of one byte: most bytes that start a needle
	// are not followed by its second.
	second [256]uint16
}

// found are the needles a pass found, a bit each.
type found uint16

// The needles a pass looks for: those of every analysis, and those only
// the pooled path needs besides (see Analyze).
const (
	internalNeedles = 1<<nPgfence | 1<<nUAmp | 1<<nSetConfig | 1<<nBackslash | 1<<nLF | 1<<nCR
	sessionNeedles  = 1<<nTokenFirst | 1<<nSetConfig | 1<<nReset | 1<<nDiscard | 1<<nUAmp
	plainNeedles    = internalNeedles | 1<<nDrop
	allNeedles      = 1<<nNeedles - 1
)

func (f found) has(n int) bool { return f&(1<<n) != 0 }

// mayNameInternal is InternalChange's prefilter: the text spells pgfence,
// a Unicode escape (U&), or set_config together with a backslash or a line
// break (the escapes and string continuations that could spell the name
// in a literal), ignoring ASCII case.
func (f found) mayNameInternal() bool {
	return f.has(nPgfence) || f.has(nUAmp) || f.has(nSetConfig) && (f.has(nBackslash) || f.has(nLF) || f.has(nCR))
}

// mayChangeSession is SessionChange's prefilter: the text spells the
// token setting's first part ("fence" of fence.token, which every spelling
// of it and of every lock domain's has, quoted or spaced out), set_config,
// RESET, DISCARD, or a Unicode escape (U&"...", which could spell any of
// them), ignoring ASCII case.
func (f found) mayChangeSession() bool {
	return f.has(nTokenFirst) || f.has(nSetConfig) || f.has(nReset) || f.has(nDiscard) || f.has(nUAmp)
}

// newNeedles returns the needles of a configuration whose token setting
// is token (lower case).
func newNeedles(token string) *needles {
	nd := &needles{words: [nNeedles]string{
		nPgfence: "pgfence", nUAmp: "u&", nSetConfig: "set_config", nReset: "reset", nDiscard: "discard",
		nDrop: "drop", nConcurrently: "concurrently", nParen: "(", nBackslash: `\`, nLF: "\n", nCR: "\r",
	}}
	if token != "" {
		first := token
		for i := 0; i < len(token); i++ {
			if token[i] == '.' {
				first = token[:i]
				break
			}
		}
		nd.words[nTokenFirst], nd.words[nToken] = first, token
	}
	for k, w := range nd.words {
		switch {
		case w == "":
			continue
		case len(w) == 1:
			for c := range nd.second {
				nd.second[c] |= 1 << k
			}
		default:
			nd.second[w[1]] |= 1 << k
			nd.second[toUpper(w[1])] |= 1 << k
		}
		nd.first[w[0]] |= 1 << k
		nd.first[toUpper(w[0])] |= 1 << k
	}
	return nd
}

// at returns the needles of m (a set of candidates) that start at sql[i].
func (nd *needles) at(sql string, i int, m uint16) found {
	var f found
	for m != 0 {
		k := bits.TrailingZeros16(m)
		m &^= 1 << k
		if w := nd.words[k]; i+len(w) <= len(sql) && equalFoldASCII(sql[i:i+len(w)], w) {
			f |= 1 << k
		}
	}
	return f
}

// scan is the state of one pass over a text (see run).
type scan struct {
	reset, all bool   // a RESET or DISCARD, and ALL, as words
	txEnd      bool   // a word that starts a statement that may end a transaction (see spellsTxEnd)
	semicolon  int    // the first ";", -1 for none
	want       uint16 // the needles to look for
	found      found
}

// oneStatement reports whether sql, which s ran over, has no semicolon
// but, at most, a last one followed by white space: a semicolon in a
// string counts, which errs towards "more than one".
func (s *scan) oneStatement(sql string) bool {
	return s.semicolon < 0 || space(sql, s.semicolon+1) == len(sql)
}

// fixedNeedles are the needles of no token setting, for the package's
// functions of one fact, which have no Rewriter.
var fixedNeedles = newNeedles("")

// run is the pass: it returns sql's Class (with Touches when r is not
// nil) and notes in s what Analyze needs besides, and which of nd (nil
// for none) appear.
func (s *scan) run(sql string, r *Rewriter, nd *needles) Class {
	counted("pass", sql)
	s.semicolon = -1
	c := statementClass(sql, 0)
	touch := r != nil && len(r.needles) > 0
	for i := 0; i < len(sql); i++ {
		b := sql[i]
		if b|0x20 == 'e' && i+len("execute") <= len(sql) && equalFoldASCII(sql[i:i+len("execute")], "execute") {
			c |= Executes // anywhere, not only as a word
		}
		// Keywords only start words: the letter before rules most bytes
		// out at once (spellsKeyword checks the same).
		if i == 0 || !isIdentStart(sql[i-1]) {
			c |= s.word(sql, i)
		}
		switch b {
		case '_':
			if i >= len("search") && spellsKeyword(sql, i-len("search"), "search_path") ||
				i >= len("set") && spellsKeyword(sql, i-len("set"), "set_config") &&
					setConfigMaySetRole(sql, i-len("set")+len("set_config")) {
				c |= Invalidates
			}
		case ';':
			if s.semicolon < 0 {
				s.semicolon = i
			}
			c |= statementClass(sql, i+1)
		}
		if touch && c&Touches == 0 && r.nameAt(sql, i) {
			c |= Touches
		}
		if nd != nil {
			if m := nd.first[b] & s.want &^ uint16(s.found); m != 0 {
				if i+1 < len(sql) {
					m &= nd.second[sql[i+1]]
				}
				if m != 0 {
					s.found |= nd.at(sql, i, m)
				}
			}
		}
	}
	if s.reset && s.all {
		c |= ChangesReading
	}
	return c
}

// countHook, set by the tests only (see export_test.go), is told of each
// read of a text by one of the package's scanners: what reads it, and the
// text.
var countHook func(what, sql string)

// counted tells countHook of a read of sql by what.
func counted(what, sql string) {
	if countHook != nil {
		countHook(what, sql)
	}
}
