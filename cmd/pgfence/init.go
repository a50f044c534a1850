package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/catalog"
)

// initOptions are the flags of 'pgfence init': serve's policy and catalog
// flags, so that init installs what serve with the same flags would.
type initOptions struct {
	policyOptions
	configFile     string
	upstream       string
	discover       bool
	discoverColumn string
	exemptRoles    []string
	pooledRoles    []string
	pooling        string
}

func initCmd() *cobra.Command {
	var o initOptions
	cmd := &cobra.Command{
		Use:   "init --upstream URL [serve's --guard, --domain, --mode ... flags]",
		Short: "Install pgfence's schema, lock domains and database backstop once (for teams that forbid runtime DDL)",
		Long: `init does once what serve does at start-up and after each discovery: it creates
the pgfence schema (lock domains, their membership, the backstop's helpers),
a row for each lock domain, and the database backstop on every guarded
table, then reports each table and exits (1 if a table's backstop could not
be installed). Give it the flags serve runs with; then run serve with
--init-domains=false --backstop=verify.

--domain takes TABLE=DOMAIN as serve does; a bare DOMAIN only creates the
domain's row. --config takes serve's YAML file: init reads the keys it
shares with serve and leaves serve's others.

When pgfence's role lacks a privilege the backstop needs, init prints the
GRANT statements that would give it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadEnv(cmd); err != nil {
				return err
			}
			if err := applyConfigFile(cmd, o.configFile, isServeFlag); err != nil {
				return err
			}
			if o.upstream == "" {
				return errors.New("--upstream is required: the postgres:// URL of the database holding the guarded tables, as pgfence's role; put the password in PGPASSWORD or ~/.pgpass, not in the URL")
			}
			var bare []string
			var tableDomains []string
			for _, d := range o.domains {
				if strings.Contains(d, "=") {
					tableDomains = append(tableDomains, d)
				} else {
					bare = append(bare, d)
				}
			}
			o.domains = tableDomains
			cfg, apply, err := o.policyOptions.config()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			conn, err := connectUpstream(ctx, o.upstream, "", o.pooling)
			if err != nil {
				return fmt.Errorf("connecting to --upstream %s: %w", redact(o.upstream), err)
			}
			defer conn.Close(context.Background())
			read, err := catalog.Read(ctx, conn, catalog.Options{
				Discover: o.discover, DiscoverColumn: o.discoverColumn, InitDomains: true,
				Backstop: true, BackstopMode: backstop.Install, ExemptRoles: o.exemptRoles, PooledRoles: o.pooledRoles,
				TokenSetting: o.tokenSetting, AllowTruncate: o.allowTruncate,
				Replace: true, // init is how a configuration is rolled out
			}, cfg.Guards, apply)
			if err != nil {
				return err
			}
			if err := catalog.AddDomains(ctx, conn, bare); err != nil {
				return err
			}
			rep := read.Backstop
			out := cmd.OutOrStdout()
			failed := 0
			tableProblems := map[string]bool{}
			for _, t := range rep.Tables {
				switch {
				case !t.OK:
					failed++
					tableProblems["backstop: "+t.Problem] = true
					fmt.Fprintf(out, "%s: NOT fenced by the database: %s\n", t.Guard.Name(), t.Problem)
				case t.Changed != "":
					fmt.Fprintf(out, "%s: backstop %s\n", t.Guard.Name(), t.Changed)
				default:
					fmt.Fprintf(out, "%s: backstop in place\n", t.Guard.Name())
				}
			}
			if rep.SetUp {
				if len(rep.DroppedFunctions) > 0 {
					fmt.Fprintf(out, "dropped the trigger functions no trigger runs any more: %s\n", strings.Join(rep.DroppedFunctions, ", "))
				}
				if w := rep.NotGuardingDDL; w != "" {
					fmt.Fprintf(out, "note: %s\n", w)
				} else {
					fmt.Fprintf(out, "event triggers %s, %s and %s in place: DDL that would weaken a backstop, or rewrite a guarded table's column values, is refused, but for pgfence's role and the exempt ones\n", backstop.GuardTrigger, backstop.DropGuardTrigger, backstop.RewriteGuardTrigger)
				}
				if rep.Recorded {
					fmt.Fprintln(out, "configuration recorded in the database: every pgfence instance installs it; restart them with the same flags")
				}
				if w := rep.NotWatchingDDL; w != "" {
					fmt.Fprintf(out, "note: %s\n", w)
				} else if rep.WatchingDDL {
					fmt.Fprintf(out, "event trigger %s in place: DDL that gives a table the epoch column gets it the backstop at once\n", backstop.EventTrigger)
				}
			}
			// Each problem once: a table's is on its line above.
			for _, p := range read.Problems {
				if !tableProblems[p] {
					fmt.Fprintf(out, "problem: %s\n", p)
				}
			}
			if doms := append(catalog.Domains(read.Guards), bare...); len(doms) > 0 && rep.SetUp {
				fmt.Fprintf(out, "lock domains ready: %s\n", strings.Join(doms, ", "))
			}
			switch {
			case !rep.SetUp:
				return errors.New("pgfence's schema objects could not be set up, so no backstop was installed")
			case failed > 0:
				return fmt.Errorf("the backstop could not be installed on %d of %d guarded tables", failed, len(rep.Tables))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "serve's YAML file: the keys init shares with serve are read from it, serve's others left (flags win)")
	f.StringVar(&o.upstream, "upstream", "", "postgres:// URL of the database, as pgfence's role (see docs/backstop.md for the privileges it needs)")
	o.policyOptions.addFlags(cmd)
	f.StringVar(&o.pooling, "upstream-pooling", "none", "what answers at --upstream, as for serve: none, session or transaction (a transaction pooler: pgfence then prepares no statements)")
	f.BoolVar(&o.discover, "discover", true, "also install on every table that has a bigint --discover-column, as serve guards them")
	f.StringVar(&o.discoverColumn, "discover-column", "fence_epoch", "epoch column name that discovery looks for")
	f.StringArrayVar(&o.exemptRoles, "backstop-exempt-role", nil, "a role whose writes the backstop lets through unfenced (migrations), counted and logged in the server log (repeatable)")
	f.StringArrayVar(&o.pooledRoles, "backstop-pooled-role", nil, "a login role that reaches Postgres only through pgfence behind a transaction pooler (the pooler's user for its server connections): the backstop counts its sessions' fencing token only in a transaction pgfence set it in, so that a token one client left on a shared server connection (in a function) never fences another's write (repeatable)")
	return cmd
}

// isServeFlag reports whether serve has a flag of that name: a key of
// serve's config file that init and uninstall leave.
func isServeFlag(name string) bool { return serveCmd().Flags().Lookup(name) != nil }
