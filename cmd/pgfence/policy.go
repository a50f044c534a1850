package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// policyOptions are the flags that say what is fenced and how; 'serve' and
// 'rewrite' share them so that a rewrite shown offline is the one served.
type policyOptions struct {
	guards         []string
	tokenSetting   string
	mode           string
	tableModes     []string
	domains        []string
	missingToken   string
	notifyStale    bool
	allowTruncate  bool
	allowCopyFrom  bool
	allowCurrentOf bool
	cacheSize      int
	maxParse       int
}

func (o *policyOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringArrayVar(&o.guards, "guard", nil, "guarded table as TABLE[:COLUMN] or SCHEMA.TABLE[:COLUMN] (repeatable; COLUMN defaults to fence_epoch)")
	f.StringVar(&o.tokenSetting, "token-setting", "fence.token", "session setting that holds the fencing token")
	f.StringVar(&o.mode, "mode", "enforce", "rollout for guarded tables: enforce, shadow (count what would be rejected, block nothing) or observe (count writes with and without a token)")
	f.StringArrayVar(&o.tableModes, "table-mode", nil, "rollout for one table, as TABLE=MODE (repeatable; wins over --mode)")
	f.StringArrayVar(&o.domains, "domain", nil, "put a guarded table in a lock domain, as TABLE=DOMAIN (repeatable): all tables of a domain share one token stream, read from <token-setting>.<domain> then <token-setting>")
	f.StringVar(&o.missingToken, "missing-token", "reject", "a write to an enforced table without a token: reject (fail with SQLSTATE 55000) or allow (let it through unfenced, counted and logged)")
	f.BoolVar(&o.notifyStale, "notify-stale", false, "send a stale writer a WARNING naming the table and its token, besides counting it")
	f.BoolVar(&o.allowTruncate, "allow-truncate", false, "let TRUNCATE of a guarded table through unfenced (refused by default)")
	f.BoolVar(&o.allowCopyFrom, "allow-copy-from", false, "let COPY FROM into a guarded table through unfenced (refused by default)")
	f.BoolVar(&o.allowCurrentOf, "allow-current-of", false, "let UPDATE/DELETE ... WHERE CURRENT OF on a guarded table through unfenced (refused by default)")
	f.IntVar(&o.maxParse, "max-parse-size", 8<<20, "longest SQL text, in bytes, that pgfence parses to fence it: a longer one that may write a guarded table is refused (SQLSTATE 54000); parsing takes about 13 times the text's size in memory, per event loop at once (0: no limit)")
	f.IntVar(&o.cacheSize, "rewrite-cache-size", 4096, "distinct statement texts whose rewrite each event loop keeps (LRU; texts over 4 KiB are not kept; 0 disables); as many again of parameterized writes, and of pooled texts that run as sent (where their transactions start)")
}

func parseRollout(s string) (sqlrewrite.Rollout, error) {
	switch s {
	case "enforce", "":
		return sqlrewrite.Enforce, nil
	case "shadow":
		return sqlrewrite.Shadow, nil
	case "observe":
		return sqlrewrite.Observe, nil
	}
	return 0, fmt.Errorf("rollout %q: want enforce, shadow or observe", s)
}

// tableRollout is one --table-mode entry.
type tableRollout struct {
	guard   sqlrewrite.Guard
	rollout sqlrewrite.Rollout
}

// tableDomain is one --domain entry.
type tableDomain struct {
	guard  sqlrewrite.Guard
	domain string
}

// matches reports whether a TABLE spec names g (a spec without a schema
// names the table in every schema).
func matches(spec, g sqlrewrite.Guard) bool {
	return spec.Table == g.Table && (spec.Schema == "" || spec.Schema == g.Schema)
}

// applier returns the function that gives a guard its rollout and
// missing-token policy from the flags.
func (o *policyOptions) applier() (func(sqlrewrite.Guard) sqlrewrite.Guard, error) {
	def, err := parseRollout(o.mode)
	if err != nil {
		return nil, fmt.Errorf("--mode: %w", err)
	}
	var allowMissing bool
	switch o.missingToken {
	case "reject", "":
	case "allow":
		allowMissing = true
	default:
		return nil, fmt.Errorf("--missing-token %q: want reject or allow", o.missingToken)
	}
	var per []tableRollout
	for _, spec := range o.tableModes {
		table, mode, ok := strings.Cut(spec, "=")
		if !ok {
			return nil, fmt.Errorf("--table-mode %q: want TABLE=MODE, e.g. accounts=shadow", spec)
		}
		g, err := sqlrewrite.ParseGuard(table)
		if err != nil {
			return nil, fmt.Errorf("--table-mode %q: %w", spec, err)
		}
		r, err := parseRollout(mode)
		if err != nil {
			return nil, fmt.Errorf("--table-mode %q: %w", spec, err)
		}
		per = append(per, tableRollout{g, r})
	}
	var doms []tableDomain
	for _, spec := range o.domains {
		table, domain, ok := strings.Cut(spec, "=")
		if !ok || domain == "" {
			return nil, fmt.Errorf("--domain %q: want TABLE=DOMAIN, e.g. accounts=billing", spec)
		}
		if err := sqlrewrite.ValidDomain(domain); err != nil {
			return nil, fmt.Errorf("--domain %q: %w", spec, err)
		}
		g, err := sqlrewrite.ParseGuard(table)
		if err != nil {
			return nil, fmt.Errorf("--domain %q: %w", spec, err)
		}
		doms = append(doms, tableDomain{g, domain})
	}
	return func(g sqlrewrite.Guard) sqlrewrite.Guard {
		g.Rollout, g.AllowMissingToken = def, allowMissing
		for _, tr := range per {
			if matches(tr.guard, g) {
				g.Rollout = tr.rollout
			}
		}
		for _, td := range doms {
			if matches(td.guard, g) {
				g.Domain = td.domain
			}
		}
		return g
	}, nil
}

// config builds the fencing policy the flags describe, for the explicit
// guards (discovery adds more).
func (o *policyOptions) config() (fence.Config, func(sqlrewrite.Guard) sqlrewrite.Guard, error) {
	apply, err := o.applier()
	if err != nil {
		return fence.Config{}, nil, err
	}
	var guards []sqlrewrite.Guard
	for _, spec := range o.guards {
		for _, s := range strings.Split(spec, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			g, err := sqlrewrite.ParseGuard(s)
			if err != nil {
				return fence.Config{}, nil, fmt.Errorf("--guard: %w", err)
			}
			guards = append(guards, apply(g))
		}
	}
	cache := o.cacheSize
	if cache == 0 {
		cache = -1
	}
	return fence.Config{
		Guards:       guards,
		TokenSetting: o.tokenSetting,
		Allow:        sqlrewrite.Allow{Truncate: o.allowTruncate, CopyFrom: o.allowCopyFrom, CurrentOf: o.allowCurrentOf},
		NotifyStale:  o.notifyStale,
		CacheSize:    cache,
		MaxParse:     o.maxParse,
	}, apply, nil
}
