package sqlrewrite

import (
	"fmt"
	"strings"
)

// staleSetting is the transaction-local flag a fenced statement raises when
// it skipped a row because the row's epoch was newer than the token.
const staleSetting = "pgfence.stale"

// Rewriter rewrites SQL for one configuration. It is immutable and safe for
// concurrent use.
type Rewriter struct {
	guards  []guardInfo
	setting string
	needles []string // lower-cased table names as they must appear in SQL text
	probe   string
}

// guardInfo is a guard with the SQL fragments derived from it.
type guardInfo struct {
	Guard
	name   string // Guard.Name()
	column string // quoted epoch column
	token  string // TOK: the validated token, read from the session setting
}

// New validates cfg and builds a Rewriter.
func New(cfg Config) (*Rewriter, error) {
	if !validSettingName(cfg.TokenSetting) {
		return nil, fmt.Errorf("invalid token setting %q: expected a custom setting name like fence.token (prefix.name: letters, digits and _, parts separated by dots, no part starting with a digit)", cfg.TokenSetting)
	}
	if strings.EqualFold(cfg.TokenSetting, staleSetting) {
		return nil, fmt.Errorf("invalid token setting %q: pgfence uses that setting itself", cfg.TokenSetting)
	}
	r := &Rewriter{setting: cfg.TokenSetting}
	for _, g := range cfg.Guards {
		if err := g.validate(); err != nil {
			return nil, err
		}
		r.guards = append(r.guards, guardInfo{
			Guard:  g,
			name:   g.Name(),
			column: quoteIdent(g.Column),
			token:  tokenExpr(cfg.TokenSetting, g.Name()),
		})
		r.needles = append(r.needles, asciiLower(strings.ReplaceAll(g.Table, `"`, `""`)))
	}
	r.probe = "SELECT pg_catalog.current_setting(" + quoteLiteral(staleSetting) + ", true) AS stale, " +
		"pg_catalog.current_setting(" + quoteLiteral(r.setting) + ", true) AS token, " +
		"pg_catalog.set_config(" + quoteLiteral(staleSetting) + ", " + quoteLiteral("") + ", true)"
	return r, nil
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

// ProbeSQL returns a statement that yields the stale flag and the token as
// text, and clears the flag, in the current transaction.
func (r *Rewriter) ProbeSQL() string { return r.probe }

// MayTouch is a conservative, allocation-free prefilter: it returns false
// only when sql certainly cannot name a guarded table, because no guarded
// table name occurs in it (ASCII case-insensitively, with any " doubled as
// a quoted name must be written) and it has no U& escaped identifier.
func (r *Rewriter) MayTouch(sql string) bool {
	if len(r.needles) == 0 {
		return false
	}
	if containsFold(sql, "u&") {
		return true
	}
	for _, n := range r.needles {
		if containsFold(sql, n) {
			return true
		}
	}
	return false
}

// containsFold reports whether s contains needle, which must be lower-case,
// ignoring ASCII case.
func containsFold(s, needle string) bool {
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

// tokenExpr is TOK: a scalar subquery that reads the token setting once and
// casts it to int8. A missing or malformed token is cast as marker text, so
// Postgres raises 22P02 carrying a "pgfence CODE: ..." message (see
// ParseErrorMarker). Concatenating v keeps the cast from being folded at plan
// time, so the error only fires when the statement runs.
func tokenExpr(setting, table string) string {
	missing := "pgfence 55000: no fencing token is set for this write to guarded table \"" + table + "\"; set " + setting + " first"
	bad := "pgfence 22023: " + setting + " must be an integer fencing token for a write to guarded table \"" + table + "\", got: "
	empty := quoteLiteral("")
	// Operators are schema-qualified so that no search_path can swap them.
	return "(SELECT CASE WHEN v OPERATOR(pg_catalog.~) " + quoteLiteral(`^\s*[-+]?[0-9]{1,19}\s*$`) + " THEN v::pg_catalog.int8" +
		" WHEN coalesce(v, " + empty + ") OPERATOR(pg_catalog.=) " + empty + " THEN (" + quoteLiteral(missing) + " OPERATOR(pg_catalog.||) coalesce(v, " + empty + "))::pg_catalog.int8" +
		" ELSE (" + quoteLiteral(bad) + " OPERATOR(pg_catalog.||) v)::pg_catalog.int8" +
		" END FROM pg_catalog.current_setting(" + quoteLiteral(setting) + ", true) AS pgfence_token(v))"
}
