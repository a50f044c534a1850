package sqlrewrite

import (
	"fmt"
	"strconv"
	"strings"
)

// flagPrefix starts the names of the transaction-local flags a fenced
// statement raises when a row it matched was stale: pgfence.stale_<i> for
// the guard at index i of the Rewriter. dflagPrefix starts those it raises
// when rows it matched were skipped because their lock domain was stale:
// pgfence.dstale_<i>. The token setting may not use the pgfence namespace.
const (
	flagPrefix  = "pgfence.stale_"
	dflagPrefix = "pgfence.dstale_"
)

// Rewriter rewrites SQL for one configuration. It is immutable and safe for
// concurrent use.
type Rewriter struct {
	guards   []guardInfo
	domains  []*domainInfo // in order of first use by a guard
	setting  string
	allow    Allow
	ddlGuard bool
	// server is Config.ServerVersion.
	server int
	// unfenceable is set when a guard cannot be fenced (see
	// Guard.Unfenceable): only then are writes checked for it.
	unfenceable bool
	// needles are the lower-cased table names as they must appear in SQL
	// text, and "pgfence", the schema of the backstop's objects (see
	// weaken.go).
	needles []string
	// firsts are the bytes a needle, or a Unicode escape (u&), may start
	// with, either case.
	firsts [256]bool
	// tokens are the token settings: the token setting and its lock
	// domains'.
	tokens TokenSettings
	// maxParse is Config.MaxParse.
	maxParse int
}

// guardInfo is a guard with the SQL fragments derived from it.
type guardInfo struct {
	Guard
	index  int
	name   string // Guard.Label()
	column string // quoted epoch column
	flag   string // literal naming the guard's stale flag
	// tok is the token expression the guard's rollout uses: TOK (Enforce),
	// TOKA (Enforce with AllowMissingToken) or TOKL (Shadow).
	tok string
	// cast and gate are what a strict guard's UPDATE and DELETE use
	// instead of TOK: TOKC and GATE (see strictCheck); its DO UPDATE uses
	// TOKC alone (see fenceWhere). INSERT stamps still use TOK.
	cast, gate string
	// insert is the epoch value an INSERT stamps on new rows, and
	// insertLater the one rows after the first of a VALUES list stamp
	// instead, when it is not "" (see rowStamp).
	insert, insertLater string
	// domain is the guard's lock domain, nil for none.
	domain *domainInfo
	// dflag is the literal naming the guard's domain-stale flag, when the
	// guard is fenced by its domain (see domainFenced).
	dflag string
	// notice is Config.StaleNotice (see raise).
	notice bool
}

// New validates cfg and builds a Rewriter.
func New(cfg Config) (*Rewriter, error) {
	if !validSettingName(cfg.TokenSetting) {
		return nil, fmt.Errorf("invalid token setting %q: expected a custom setting name like fence.token (prefix.name: letters, digits and _, parts separated by dots, no part starting with a digit)", cfg.TokenSetting)
	}
	if strings.HasPrefix(asciiLower(cfg.TokenSetting), "pgfence.") {
		return nil, fmt.Errorf("invalid token setting %q: pgfence uses the pgfence.* settings itself", cfg.TokenSetting)
	}
	r := &Rewriter{setting: cfg.TokenSetting, allow: cfg.Allow, ddlGuard: cfg.DDLGuard, server: cfg.ServerVersion, maxParse: cfg.MaxParse}
	for i, g := range cfg.Guards {
		if err := g.validate(); err != nil {
			return nil, err
		}
		gi := guardInfo{
			Guard:  g,
			index:  i,
			name:   g.Label(),
			column: quoteIdent(g.Column),
			flag:   quoteLiteral(flagPrefix + strconv.Itoa(i)),
			notice: cfg.StaleNotice,
		}
		if g.Domain != "" {
			gi.domain = r.domainNamed(g.Domain)
		}
		strict, allowMissing, lenient := tokenExprs(cfg.TokenSetting, gi.name, g.Domain)
		switch {
		case g.Rollout == Shadow:
			gi.tok, gi.insert = lenient, "COALESCE("+lenient+", 0)"
		case g.AllowMissingToken:
			gi.tok, gi.insert = allowMissing, "COALESCE("+allowMissing+", 0)"
		default:
			gi.tok, gi.insert = strict, strict
			gi.cast, gi.gate = strictCheck(cfg.TokenSetting, gi.name, g.Domain)
			gi.insertLater = gi.cast
		}
		if gi.domainFenced() {
			gi.fenceByDomain()
		}
		r.guards = append(r.guards, gi)
		r.unfenceable = r.unfenceable || g.Unfenceable != ""
		n := asciiLower(strings.ReplaceAll(g.Table, `"`, `""`))
		r.needles = append(r.needles, n)
		r.firsts[n[0]], r.firsts[toUpper(n[0])] = true, true
		r.firsts['u'], r.firsts['U'] = true, true
	}
	if len(r.guards) > 0 {
		r.needles = append(r.needles, "pgfence")
		r.firsts['p'], r.firsts['P'] = true, true
	}
	var domains []string
	for _, g := range cfg.Guards {
		if g.Domain != "" {
			domains = append(domains, g.Domain)
		}
	}
	r.tokens = NewTokenSettings(cfg.TokenSetting, domains)
	r.tokens.maxParse = cfg.MaxParse
	return r, nil
}

func (g Guard) validate() error {
	if g.Rollout < Enforce || g.Rollout > Observe {
		return fmt.Errorf("guard %q has an unknown rollout %d", g.Name(), int(g.Rollout))
	}
	if err := g.validateNames(); err != nil {
		return err
	}
	return validDomain(g)
}

// validSettingName mirrors Postgres's valid_custom_variable_name (ASCII
// only): two or more dot-separated parts, each a letter or _ followed by
// letters, digits or _.
func validSettingName(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || '0' <= p[0] && p[0] <= '9' {
			return false
		}
		for i := 0; i < len(p); i++ {
			c := p[i]
			if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
				return false
			}
		}
	}
	return true
}

// ContainsFold reports whether s contains needle, which must be lower-case,
// ignoring ASCII case.
func ContainsFold(s, needle string) bool {
	counted("prefilter", s)
	n := len(needle)
	if n == 0 {
		return true
	}
	first, upper := needle[0], toUpper(needle[0])
	for i := 0; i+n <= len(s); i++ {
		if c := s[i]; c != first && c != upper {
			continue
		}
		if equalFoldASCII(s[i+1:i+n], needle[1:]) {
			return true
		}
	}
	return false
}

func equalFoldASCII(s, lower string) bool {
	for i := 0; i < len(lower); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func toUpper(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

// tokenRE is what a token must look like to be cast to int8.
const tokenRE = `^\s*[-+]?[0-9]{1,19}\s*$`

// tokenExprs returns the three token expressions of a guarded table, each
// a scalar subquery that reads the token once (see tokenSubqueries); the
// strict and allow-missing ones name the table (and its lock domain, if
// any) in their errors.
func tokenExprs(setting, table, domain string) (strict, allowMissing, lenient string) {
	return tokenSubqueries(setting, domain, tableSubject(table, domain))
}

// tableSubject is how errors name a guarded table.
func tableSubject(table, domain string) string {
	subject := "guarded table \"" + table + "\""
	if domain != "" {
		subject += " in lock domain \"" + domain + "\""
	}
	return subject
}

// domainSubject is how errors name a lock domain, when they name no table.
func domainSubject(domain string) string {
	return "lock domain \"" + domain + "\""
}

// tokenText is the token's text: the setting's or, for a table in a lock
// domain, the domain's own setting (<setting>.<domain>) unless that is
// unset or empty, then the setting's. In a lock domain that is the token
// the precedence rule picks (see tokenConflict) unless both settings are
// set to different tokens: an expression reading it checks that first,
// unless a check that has already run did (TOKC after GATE, the PF001
// message after the domain's claim).
func tokenText(setting, domain string) string {
	general := "pg_catalog.current_setting(" + quoteLiteral(setting) + ", true)"
	if domain == "" {
		return general
	}
	return "COALESCE(NULLIF(pg_catalog.current_setting(" + quoteLiteral(setting+"."+domain) + ", true), " +
		quoteLiteral("") + "), " + general + ")"
}

// The precedence of a lock domain's token settings. For a table in lock
// domain D, with d the value of <setting>.D and g that of <setting>, an
// empty one counting as unset:
//
//   - d unset: the token is g (missing if g is unset too);
//   - g unset, or both set to the same text: the token is d;
//   - both set, to different texts: the write fails with 22023.
//
// A per-domain setting left on a pooled connection by the holder of
// another lease must not silently override the token a session has just
// set: the stale holder's writes would land with the newer holder's token.
// The database backstop's trigger applies the same rule.
const (
	conflictStart = "both "                           // then <setting>.D
	conflictAnd   = " and "                           // then <setting>
	conflictSet   = " are set, to different tokens (" // then 'd' and 'g'
	conflictHint  = "a per-domain token left over from another lease must not override the one you set: " +
		"RESET the setting of the lease you do not hold (RESET %s), or set both to the same token"
)

// tokenConflict is the branch that the CASE of every expression reading a
// lock domain's token starts with, " WHEN <conflict> THEN <22023 marker>",
// and "" outside a lock domain; text is the token text as the expression
// has it (v, or tokenText itself), and subject names what is written, for
// the error:
//
//	pgfence 22023: both S.D and S are set, to different tokens ('50' and '40'), for a write to SUBJECT
//
// The text is the domain's setting d whenever that is set, and the general
// setting g otherwise, so the settings conflict exactly when g is set (not
// empty) and the text differs from it. The marker's text holds the
// settings' values, which keeps its cast from being folded at plan time: a
// statement reading the token fails when it runs, where it would read the
// token (see tokenSubqueries and strictCheck).
func tokenConflict(setting, domain, subject, text string) string {
	if domain == "" {
		return ""
	}
	g := "pg_catalog.current_setting(" + quoteLiteral(setting) + ", true)"
	pct := func(s string) string { return strings.ReplaceAll(s, "%", "%%") }
	marker := "pgfence " + codeBadToken + ": " + conflictStart + setting + "." + domain + conflictAnd + setting + conflictSet +
		"%L and %L), for a write to " + pct(subject)
	return " WHEN " + text + " OPERATOR(pg_catalog.<>) " + g + " AND " + g + " OPERATOR(pg_catalog.<>) " + quoteLiteral("") +
		" THEN pg_catalog.format(" + quoteLiteral(marker) + ", " + text + ", " + g + ")::pg_catalog.int8"
}

// TokenConflictHint returns the hint for the error of a write to a lock
// domain's table whose per-domain token setting and general one are set to
// different tokens, given its message as ParseErrorMarker returns it, and
// whether message is that error.
func TokenConflictHint(message string) (string, bool) {
	rest, ok := strings.CutPrefix(message, "pgfence: "+conflictStart)
	if !ok {
		return "", false
	}
	ds, rest, ok := strings.Cut(rest, conflictAnd)
	if !ok || !validSettingName(ds) {
		return "", false
	}
	setting, _, ok := strings.Cut(rest, conflictSet)
	if !ok || !validSettingName(setting) || !strings.HasPrefix(ds, setting+".") {
		return "", false
	}
	return fmt.Sprintf(conflictHint, ds), true
}

// settingNames is how errors name the settings a token is read from.
func settingNames(setting, domain string) string {
	if domain == "" {
		return setting
	}
	return setting + "." + domain + " or " + setting
}

// tokenSubqueries returns the three token expressions, each a scalar
// subquery (which Postgres runs at most once per statement) that reads the
// token text (see tokenText) once; subject names what is written, for the
// errors:
//
//   - TOK (strict) is the token as int8. A missing or malformed token is
//     cast as marker text, so Postgres raises 22P02 carrying a "pgfence
//     CODE: ..." message (see ParseErrorMarker): 55000 when the token is
//     missing or empty, 22023 when it is not an integer. Concatenating v
//     keeps the cast from being folded at plan time, so the error only
//     fires when the statement runs. Strict guards use it for their INSERT
//     stamps outside a lock domain; their UPDATE and DELETE use the
//     cheaper TOKC and GATE, and DO UPDATE TOKC (see strictCheck).
//   - TOKA (allow-missing) is NULL when the token is missing or empty and
//     raises 22023 when it is not an integer.
//   - TOKL (lenient) is NULL when the token is missing, empty, not an
//     integer or out of int8's range; it never raises for the token
//     itself.
//
// In a lock domain all three first raise 22023 when the domain's setting
// and the general one are set to different tokens (see tokenConflict);
// TOKL's error names the lock domain only, as it names no table.
//
// Operators are schema-qualified so that no search_path can swap them.
func tokenSubqueries(setting, domain, subject string) (strict, allowMissing, lenient string) {
	missing, bad := tokenMarkers(setting, domain, subject)
	empty := quoteLiteral("")
	from := " END FROM " + tokenText(setting, domain) + " AS pgfence_token(v))"
	isInt := "(SELECT CASE" + tokenConflict(setting, domain, subject, "v") + " WHEN v OPERATOR(pg_catalog.~) " + quoteLiteral(tokenRE) + " THEN "
	isEmpty := " WHEN coalesce(v, " + empty + ") OPERATOR(pg_catalog.=) " + empty + " THEN "
	badCast := " ELSE (" + bad + " OPERATOR(pg_catalog.||) v)::pg_catalog.int8"
	strict = isInt + "v::pg_catalog.int8" +
		isEmpty + "(" + missing + " OPERATOR(pg_catalog.||) coalesce(v, " + empty + "))::pg_catalog.int8" +
		badCast + from
	allowMissing = isInt + "v::pg_catalog.int8" + isEmpty + "NULL::pg_catalog.int8" + badCast + from
	// The regex admits 19 digits, more than int8 holds: range-check as
	// numeric first (the regex guarantees the numeric cast succeeds).
	lenient = "(SELECT CASE" + tokenConflict(setting, domain, domainSubject(domain), "v") +
		" WHEN v OPERATOR(pg_catalog.~) " + quoteLiteral(tokenRE) + " THEN " +
		"CASE WHEN v::pg_catalog.numeric OPERATOR(pg_catalog.<=) 9223372036854775807::pg_catalog.numeric" +
		" AND v::pg_catalog.numeric OPERATOR(pg_catalog.>=) (-9223372036854775808)::pg_catalog.numeric" +
		" THEN v::pg_catalog.int8 END" + from
	return strict, allowMissing, lenient
}

// tokenMarkers returns the marker texts, as literals, of a missing or empty
// token (55000) and of one that is not an integer (22023; the token follows
// it); subject names what is written.
func tokenMarkers(setting, domain, subject string) (missing, bad string) {
	names := settingNames(setting, domain)
	return quoteLiteral("pgfence 55000: no fencing token is set for this write to " + subject + "; set " + names + " first"),
		quoteLiteral("pgfence 22023: " + names + " must be an integer fencing token for a write to " + subject + ", got: ")
}

// intChars holds the characters Postgres's int8 input accepts: white space
// (isspace: space, \t, \n, \r, \f, \v), a sign and digits; escapes, so the
// SQL holds no control bytes.
const intChars = `E' \t\n\r\f\x0B+-0123456789'`

// strictCheck returns the token expressions a strict guard (Enforce without
// AllowMissingToken) fences UPDATE and DELETE with (DO UPDATE with TOKC
// alone, see fenceWhere), v being the
// token's text (see tokenText):
//
//	TOKC: v::pg_catalog.int8
//	GATE: CASE [WHEN <conflict> THEN <22023 marker>]   (in a lock domain: see tokenConflict)
//	           WHEN coalesce(v, E'') = E'' THEN (<55000 marker> || coalesce(v, E''))::pg_catalog.int8
//	           WHEN pg_catalog.btrim(v, <intChars>) <> E'' THEN (<22023 marker> || v)::pg_catalog.int8
//	           ELSE v::pg_catalog.int8 END IS NOT NULL
//
// They are much cheaper for Postgres to parse and plan than TOK's three
// scalar subqueries and regex. GATE has no column and nothing volatile in
// it, so Postgres runs it once, as a one-time filter, before it reads any
// row: a missing, empty or non-integer token, or in a lock domain two
// settings set to different tokens, fails the statement with pgfence's
// error even when no row matches, and the per-row casts of TOKC only ever
// see a valid token, the one the precedence rule picks. Concatenating v
// keeps the marker casts from being folded at plan time (as the settings'
// values do tokenConflict's). A token made only of intChars that is still
// no int8 ('1-2', '+', blanks, out of range) fails with Postgres's own
// 22P02 or 22003 from the cast instead of pgfence's 22023: it still fails.
//
// To estimate the selectivity of REF.C <= TOKC the planner would evaluate
// TOKC with the token's current value, so an empty or non-integer token
// would raise the cast's plain 22P02 at plan time, before GATE runs. So
// fenceWhere writes the epoch check as pg_catalog.int8le(REF.C, TOKC), a
// function call the planner does not evaluate (it estimates it as it did
// REF.C <= TOK, whose InitPlan it could not evaluate either).
func strictCheck(setting, table, domain string) (cast, gate string) {
	v := tokenText(setting, domain)
	missing, bad := tokenMarkers(setting, domain, tableSubject(table, domain))
	empty := quoteLiteral("")
	cast = v + "::pg_catalog.int8"
	gate = "CASE" + tokenConflict(setting, domain, tableSubject(table, domain), v) + " WHEN coalesce(" + v + ", " + empty + ") OPERATOR(pg_catalog.=) " + empty +
		" THEN (" + missing + " OPERATOR(pg_catalog.||) coalesce(" + v + ", " + empty + "))::pg_catalog.int8" +
		" WHEN pg_catalog.btrim(" + v + ", " + intChars + ") OPERATOR(pg_catalog.<>) " + empty +
		" THEN (" + bad + " OPERATOR(pg_catalog.||) " + v + ")::pg_catalog.int8" +
		" ELSE " + cast + " END IS NOT NULL"
	return cast, gate
}
