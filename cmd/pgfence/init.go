package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/sqlrewrite"
)

func initCmd() *cobra.Command {
	var upstream string
	var domains []string
	cmd := &cobra.Command{
		Use:   "init --upstream URL --domain DOMAIN...",
		Short: "Create the lock-domain table and rows ahead of time (for teams that forbid runtime DDL)",
		Long: `init creates ` + sqlrewrite.DomainTable + ` and a row for each lock domain, then exits.
serve does the same at start-up unless --init-domains=false.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if upstream == "" {
				return errors.New("--upstream is required: the postgres:// URL of the database holding the guarded tables")
			}
			if len(domains) == 0 {
				return errors.New("--domain is required: the lock domains to create, e.g. --domain billing")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, upstream)
			if err != nil {
				return fmt.Errorf("connecting to --upstream %s: %w", redact(upstream), err)
			}
			defer conn.Close(context.Background())
			if err := prepareDomains(ctx, conn, domains, true); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s ready with lock domains %v\n", sqlrewrite.DomainTable, domains)
			return nil
		},
	}
	cmd.Flags().StringVar(&upstream, "upstream", "", "postgres:// URL of the database (a role that may create the pgfence schema)")
	cmd.Flags().StringSliceVar(&domains, "domain", nil, "lock domain to create (repeatable or comma-separated)")
	return cmd
}
