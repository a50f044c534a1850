package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/backstop"
)

// uninstallOptions are the flags of 'pgfence uninstall'.
type uninstallOptions struct {
	configFile string
	upstream   string
	pooling    string
	dryRun     bool
	yes        bool
}

func uninstallCmd() *cobra.Command {
	var o uninstallOptions
	cmd := &cobra.Command{
		Use:   "uninstall --upstream URL (--dry-run | --yes)",
		Short: "Remove everything pgfence put in a database: the backstop's triggers, the event triggers, the schema pgfence and its grants",
		Long: `uninstall removes from the --upstream URL's database what pgfence put there:
the event triggers (the DDL guard and the discovery watch), the backstop's
triggers on every table that carries them, and the schema pgfence with all
it holds (lock domains, the recorded configuration, the reject counters,
the trigger functions) and the grants on it. Your tables and their rows,
epoch columns included, stay.

It prints what it will drop, and drops it only with --yes on the command
line (not from the environment nor a config file), in one transaction:
all of it, or nothing. --dry-run only prints. Stop every
pgfence serve of the database first (or run them with --backstop=off
--init-domains=false): the next read of the catalog would install it all
again. Each database pgfence served has its own: run uninstall against
each. It takes a superuser, or a role that owns the schema, every
table listed and the event triggers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Asked for on the command line only: a PGFENCE_YES left in
			// an environment, or a yes: in a file, must not drop anything.
			asked := cmd.Flags().Changed("yes") && o.yes
			if err := loadEnv(cmd); err != nil {
				return err
			}
			if err := applyConfigFile(cmd, o.configFile, isServeFlag); err != nil {
				return err
			}
			o.yes = asked
			if o.upstream == "" {
				return errors.New("--upstream is required: the postgres:// URL of the database to remove pgfence from; put the password in PGPASSWORD or ~/.pgpass, not in the URL")
			}
			if o.dryRun && o.yes {
				return errors.New("--dry-run and --yes: give one (--dry-run lists what uninstall would drop, --yes drops it)")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			conn, err := connectUpstream(ctx, o.upstream, "", o.pooling)
			if err != nil {
				return fmt.Errorf("connecting to --upstream %s: %w", redact(o.upstream), err)
			}
			defer conn.Close(context.Background())
			var db, role string
			if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_database()::text, CURRENT_USER::text").Scan(&db, &role); err != nil {
				return err
			}
			plan, err := backstop.PlanUninstall(ctx, conn)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if plan.Empty() {
				fmt.Fprintf(out, "database %q holds nothing of pgfence's: nothing to drop\n", db)
				return nil
			}
			fmt.Fprintf(out, "pgfence uninstall, database %q, as role %s, would run in one transaction:\n", db, role)
			for _, sql := range plan.Statements() {
				fmt.Fprintf(out, "  %s;\n", sql)
			}
			if plan.Schema {
				fmt.Fprintf(out, "the schema pgfence (owner %s) holds, dropped with it, with the grants on them:\n", plan.Owner)
				for _, c := range plan.Contents {
					fmt.Fprintf(out, "  %s\n", c)
				}
			}
			fmt.Fprintln(out, "note: stop every pgfence serve of this database first (or run it with --backstop=off --init-domains=false): its next read of the catalog would install it all again")
			switch {
			case o.dryRun:
				fmt.Fprintln(out, "dry run: nothing dropped")
				return nil
			case !o.yes:
				return errors.New("nothing dropped: run again with --yes to drop the above, or with --dry-run to only list it")
			}
			if err := backstop.Uninstall(ctx, conn, plan); err != nil {
				return err
			}
			fmt.Fprintf(out, "dropped: database %q holds nothing of pgfence's now\n", db)
			if plan.Owner != "" {
				fmt.Fprintf(out, "note: pgfence's role (%s owned the schema) keeps what was granted to it for pgfence (CREATE on the database, TRIGGER on the tables): REVOKE it if the role goes too\n", plan.Owner)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "serve's YAML file: upstream (and upstream-pooling) are read from it, serve's other keys left (flags win)")
	f.StringVar(&o.upstream, "upstream", "", "postgres:// URL of the database, as a superuser or a role that owns pgfence's schema, the guarded tables and the event triggers")
	f.StringVar(&o.pooling, "upstream-pooling", "none", "what answers at --upstream, as for serve: none, session or transaction")
	f.BoolVar(&o.dryRun, "dry-run", false, "only print what would be dropped")
	f.BoolVar(&o.yes, "yes", false, "drop it: without this (or --dry-run) uninstall only prints what it would drop, and fails; only the command line's counts, not PGFENCE_YES nor a config file's")
	return cmd
}
