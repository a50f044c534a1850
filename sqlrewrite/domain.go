package sqlrewrite

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// Lock domains: see the package documentation (doc.go).

// domainCTEPrefix starts the names of the WITH queries that claim lock
// domains; a client's WITH query may not use it in a statement that gets
// one, since it could hide pgfence's.
const domainCTEPrefix = "pgfence_domain_"

// codeStaleDomain is the marker code of a stale INSERT into a domain table.
const codeStaleDomain = "PF001"

// codeReservedName refuses a client's WITH query named like pgfence's.
const codeReservedName = "42939" // reserved_name

// domainInfo is a lock domain with the SQL fragments derived from it.
type domainInfo struct {
	name  string
	index int    // K in pgfence_domain_K: the domain's index in Rewriter.domains
	cte   string // quoted WITH query name
	// exists is true in a statement when the domain was claimed.
	exists string
	// query is the WITH query that claims the domain (see claim).
	query string
	text  string // the token's text (see tokenText)
	// winner is the domain's token as the statement sees it, as text
	// (unknownEpoch if the domain has no row): what beat a stale writer.
	winner string
}

// The PF001 message ends with the stale token and the domain's newer one,
// which StaleDomainTokens reads back.
const (
	staleDomainToken = "; token: "
	staleDomainNewer = "; newer token: "
)

// StaleDomainTokens reads the stale token and the lock domain's newer
// token ("" if unknown) from the message of a PF001 refusal (see
// ParseErrorMarker).
func StaleDomainTokens(message string) (token, newer string, ok bool) {
	i := strings.LastIndex(message, staleDomainToken)
	if i < 0 {
		return "", "", false
	}
	token, newer, ok = strings.Cut(message[i+len(staleDomainToken):], staleDomainNewer)
	if newer == unknownEpoch {
		newer = ""
	}
	return token, newer, ok
}

// raise is the expression that raises a domain-fenced guard's flag for a
// matched row of ref that was not written (see flagValue): the stale flag,
// set to the greatest epoch among such rows, when the domain was claimed
// (the row's epoch was newer), else the domain flag, set to the domain's
// token.
func (g *guardInfo) domainRaise(ref string) string {
	d := g.domain
	return g.raise("CASE WHEN "+d.exists+" THEN "+g.flag+" ELSE "+g.dflag+" END",
		flagValue("CASE WHEN "+d.exists+" THEN "+g.epochText(ref)+" ELSE "+d.winner+" END"))
}

// domainNamed returns the lock domain called name, creating it.
func (r *Rewriter) domainNamed(name string) *domainInfo {
	for _, d := range r.domains {
		if d.name == name {
			return d
		}
	}
	d := &domainInfo{name: name, index: len(r.domains), text: tokenText(r.setting, name)}
	d.cte = quoteIdent(domainCTEPrefix + strconv.Itoa(d.index))
	d.exists = "EXISTS (SELECT 1 FROM " + d.cte + ")"
	d.winner = "COALESCE(CAST((SELECT " + quoteIdent("token") + " FROM " + quoteIdent("pgfence") + "." + quoteIdent("domains") +
		" WHERE " + quoteIdent("domain") + " OPERATOR(pg_catalog.=) " + quoteLiteral(d.name) + ") AS pg_catalog.text), " + quoteLiteral(unknownEpoch) + ")"
	d.query = d.claim(r.setting)
	r.domains = append(r.domains, d)
	return d
}

// claim is the WITH query that claims the domain (see the package
// documentation):
//
//	"pgfence_domain_K" AS (UPDATE "pgfence"."domains" SET "token" = T::pg_catalog.int8
//	    WHERE "domain" OPERATOR(pg_catalog.=) E'<domain>' AND pg_catalog.int8le("token", CLAIM)
//	    RETURNING "token")
//
// where T is the token's text (see tokenText) and CLAIM is
//
//	(CASE WHEN NULLIF(d, E'') IS NULL THEN NULLIF(g, E'')
//	      WHEN NULLIF(g, E'') IS NULL OR d OPERATOR(pg_catalog.=) g THEN d END)::pg_catalog.int8
//
// with d the domain's setting and g the general one: the token the
// precedence rule picks (see tokenConflict), NULL when it is missing or
// the settings conflict, so that such a session claims nothing. The claim
// checks no more than that: the writes that read it check the token with
// pgfence's errors first (GATE, TOKA, the INSERT stamp: see
// fenceByDomain). It is kept this small because it is what every writer of
// the domain waits for: a writer that waited re-checks the domain's row
// under READ COMMITTED (EvalPlanQual), and that re-check sets up again every
// subquery of the statement and evaluates the claim's qual and SET, all
// while the writers behind it wait. Straight to Postgres, 8 clients
// writing one domain with -M prepared, the claim with the checks and their
// error texts in it (twice) ran at 0.74 of the same claim written by hand,
// this one at about 0.9 (BENCHMARKS.md, Write shapes). SET casts T
// alone, as Postgres computes it only for a row the qual passed, where T is
// CLAIM's token; int8le is a call, not the operator, so that the planner
// does not evaluate CLAIM to estimate the qual (see strictCheck).
func (d *domainInfo) claim(setting string) string {
	return d.cte + " AS (UPDATE " + quoteIdent("pgfence") + "." + quoteIdent("domains") + " SET " + quoteIdent("token") + " = " + d.text + "::pg_catalog.int8" +
		" WHERE " + quoteIdent("domain") + " OPERATOR(pg_catalog.=) " + quoteLiteral(d.name) +
		" AND pg_catalog.int8le(" + quoteIdent("token") + ", " + claimToken(setting, d.name) + ") RETURNING " + quoteIdent("token") + ")"
}

// claimToken is CLAIM (see claim).
func claimToken(setting, domain string) string {
	ds := "pg_catalog.current_setting(" + quoteLiteral(setting+"."+domain) + ", true)"
	gs := "pg_catalog.current_setting(" + quoteLiteral(setting) + ", true)"
	empty := quoteLiteral("")
	return "(CASE WHEN NULLIF(" + ds + ", " + empty + ") IS NULL THEN NULLIF(" + gs + ", " + empty + ")" +
		" WHEN NULLIF(" + gs + ", " + empty + ") IS NULL OR " + ds + " OPERATOR(pg_catalog.=) " + gs + " THEN " + ds + " END)::pg_catalog.int8"
}

// domainFenced reports whether writes to the guard's table are checked
// against its lock domain: it has one and is Enforce.
func (g *guardInfo) domainFenced() bool {
	return g.domain != nil && g.Rollout == Enforce
}

// fenceByDomain sets the fragments of a domain-fenced guard: the flag it
// raises, and the values its INSERTs stamp,
//
//	CASE WHEN GATE THEN COALESCE((SELECT "token" FROM "pgfence_domain_K"), STALE) END
//	CASE WHEN TOKA IS NULL THEN 0 ELSE COALESCE((SELECT "token" FROM "pgfence_domain_K"), STALE) END   allow-missing
//
// where STALE raises PF001 (the cast of marker text, which cannot be
// folded at plan time as it holds the token's text). The token is checked
// first, by GATE or TOKA (see strictCheck, tokenSubqueries): the claim
// itself does not raise pgfence's errors (see claim), and reading it runs
// it. Rows after the first of a VALUES list stamp the COALESCE alone, as
// Postgres computes them in order (see rowStamp).
func (g *guardInfo) fenceByDomain() {
	d := g.domain
	i := strconv.Itoa(g.index)
	g.dflag = quoteLiteral(dflagPrefix + i)
	msg := "pgfence " + codeStaleDomain + ": stale fencing token for lock domain \"" + d.name +
		"\" (guarded table \"" + g.name + "\"): a newer holder has written to it; stop writing and re-acquire the lock" + staleDomainToken
	stale := "(" + quoteLiteral(msg) + " OPERATOR(pg_catalog.||) COALESCE(" + d.text + ", " + quoteLiteral("") + ") OPERATOR(pg_catalog.||) " +
		quoteLiteral(staleDomainNewer) + " OPERATOR(pg_catalog.||) " + d.winner + ")::pg_catalog.int8"
	stamp := "COALESCE((SELECT " + quoteIdent("token") + " FROM " + d.cte + "), " + stale + ")"
	if g.AllowMissingToken {
		g.insert, g.insertLater = "CASE WHEN "+g.tok+" IS NULL THEN 0 ELSE "+stamp+" END", ""
		return
	}
	g.insert, g.insertLater = "CASE WHEN "+g.gate+" THEN "+stamp+" END", stamp
}

// ValidDomain checks a lock domain's name (see Guard.Domain), for a
// configuration that names one before any guard has it.
func ValidDomain(name string) error {
	if name == "" {
		return errors.New("an empty lock domain name")
	}
	if err := validDomain(Guard{Domain: name}); err != nil {
		_, msg, _ := strings.Cut(err.Error(), ": ")
		return errors.New(msg)
	}
	return nil
}

// validDomain checks a guard's lock domain name.
func validDomain(g Guard) error {
	d := g.Domain
	if d == "" {
		return nil
	}
	bad := len(d) > MaxDomainLen || d[0] >= '0' && d[0] <= '9'
	for i := 0; i < len(d) && !bad; i++ {
		c := d[i]
		bad = !(c == '_' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9')
	}
	if bad {
		return fmt.Errorf("guard %q: invalid lock domain %q: expected a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most %d bytes), e.g. billing",
			g.Name(), strings.ToValidUTF8(d, "\uFFFD"), MaxDomainLen)
	}
	return nil
}

// planDomains finds the lock domains a statement's fenced writes need
// checked, and where their WITH queries go: the statement's top-level
// query.
func (r *Rewriter) planDomains(p *plan, top proto.Message) *Refusal {
	outer := outerQuery(top)
	for _, w := range p.writes {
		g := w.guard
		if w.node == nil || !g.domainFenced() {
			continue
		}
		if w.node != outer && !isWithQueryOf(outer, w.node) {
			return &Refusal{
				Code: codeUnsupported,
				Message: "pgfence: the " + w.kind + " of guarded table \"" + g.name + "\" in lock domain \"" + g.domain.name +
					"\" is nested below the top level of its statement, where the lock domain cannot be checked",
				Hint: "Postgres only runs a data-modifying WITH at the top level of a statement; move it there",
			}
		}
		if !slices.Contains(p.domains, g.domain) {
			p.domains = append(p.domains, g.domain)
		}
	}
	if len(p.domains) == 0 {
		return nil
	}
	slices.SortFunc(p.domains, func(a, b *domainInfo) int { return a.index - b.index })
	p.outer = outer
	var ref *Refusal
	eachMessage(top.ProtoReflect(), func(m proto.Message) {
		if c, ok := m.(*pg_query.CommonTableExpr); ok && ref == nil && strings.HasPrefix(c.Ctename, domainCTEPrefix) {
			ref = &Refusal{
				Code:    codeReservedName,
				Message: "pgfence: WITH query name \"" + c.Ctename + "\" is reserved for pgfence in a statement that writes a lock domain",
				Hint:    hintReservedName,
			}
		}
	})
	return ref
}

// outerQuery is the query a top-level statement runs as its top level:
// the statement itself, or the one that EXPLAIN, PREPARE, COPY, CREATE
// TABLE AS or DECLARE holds.
func outerQuery(m proto.Message) proto.Message {
	for {
		var q *pg_query.Node
		switch s := m.(type) {
		case *pg_query.ExplainStmt:
			q = s.Query
		case *pg_query.PrepareStmt:
			q = s.Query
		case *pg_query.CopyStmt:
			q = s.Query
		case *pg_query.CreateTableAsStmt:
			q = s.Query
		case *pg_query.DeclareCursorStmt:
			q = s.Query
		default:
			return m
		}
		if q == nil {
			return nil
		}
		m = inner(q)
	}
}

// withOf returns the WITH clause of a query, or nil.
func withOf(m proto.Message) *pg_query.WithClause {
	switch s := m.(type) {
	case *pg_query.SelectStmt:
		return s.WithClause
	case *pg_query.InsertStmt:
		return s.WithClause
	case *pg_query.UpdateStmt:
		return s.WithClause
	case *pg_query.DeleteStmt:
		return s.WithClause
	case *pg_query.MergeStmt:
		return s.WithClause
	}
	return nil
}

// isWithQueryOf reports whether stmt is one of the WITH queries of q.
func isWithQueryOf(q, stmt proto.Message) bool {
	for _, c := range withOf(q).GetCtes() {
		if cte := c.GetCommonTableExpr(); cte != nil && cte.Ctequery != nil && inner(cte.Ctequery) == stmt {
			return true
		}
	}
	return false
}

// domainEdit puts the WITH queries of a statement's lock domains first in
// the WITH list of its top-level query, or gives that query a WITH.
func (r *Rewriter) domainEdit(sql string, st stmtTokens, p *plan) (edit, error) {
	queries := make([]string, len(p.domains))
	for i, d := range p.domains {
		queries[i] = d.query
	}
	list := strings.Join(queries, ", ")
	if wc := withOf(p.outer); wc != nil {
		i := st.at(int(wc.Location))
		if i < 0 || st.toks[i].Token != pg_query.Token_WITH && st.toks[i].Token != pg_query.Token_WITH_LA {
			return edit{}, fmt.Errorf("sqlrewrite: no WITH keyword at byte %d", wc.Location)
		}
		if wc.Recursive {
			if i = st.nextCode(i+1, len(st.toks)); i < 0 || st.toks[i].Token != pg_query.Token_RECURSIVE {
				return edit{}, fmt.Errorf("sqlrewrite: no RECURSIVE after the WITH at byte %d", wc.Location)
			}
		}
		return edit{at: st.end(i), text: " " + list + ","}, nil
	}
	// Without a WITH, the top-level query is the write itself.
	var rv *pg_query.RangeVar
	var want []pg_query.Token // keywords before the relation, last first
	switch n := p.outer.(type) {
	case *pg_query.UpdateStmt:
		rv, want = n.Relation, []pg_query.Token{pg_query.Token_UPDATE}
	case *pg_query.DeleteStmt:
		rv, want = n.Relation, []pg_query.Token{pg_query.Token_FROM, pg_query.Token_DELETE_P}
	case *pg_query.InsertStmt:
		rv, want = n.Relation, []pg_query.Token{pg_query.Token_INTO, pg_query.Token_INSERT}
	default:
		return edit{}, errors.New("sqlrewrite: a lock domain's writes are in a query without a WITH")
	}
	k := st.at(int(rv.Location))
	if k >= 0 {
		k = st.lastCode(k)
	}
	for k >= 0 && (st.toks[k].Token == '(' || st.toks[k].Token == pg_query.Token_ONLY) {
		k = st.lastCode(k)
	}
	for _, t := range want {
		if k < 0 || st.toks[k].Token != t {
			return edit{}, fmt.Errorf("sqlrewrite: no start of the statement writing the relation at byte %d", rv.Location)
		}
		if t != want[len(want)-1] {
			k = st.lastCode(k)
		}
	}
	at := st.start(k)
	return edit{at: at, text: pad(sql, at, "WITH "+list+" ")}, nil
}
