package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// errRefused makes 'pgfence rewrite' exit 1 after printing the refusal.
var errRefused = errors.New("statement refused")

func rewriteCmd() *cobra.Command {
	var o policyOptions
	var prepared bool
	cmd := &cobra.Command{
		Use:   "rewrite [flags] SQL",
		Short: "Print the SQL pgfence would send for SQL, or the error a client would get; no server needed",
		Long: `rewrite shows what pgfence does to a statement, offline: the text Postgres
would receive (probe statements included), or the error the client would get.
It takes the same policy flags as serve. SQL "-" reads the text from stdin.
The exit status is 1 when the statement is refused.`,
		Example: `  pgfence rewrite --guard accounts "UPDATE accounts SET balance = 0 WHERE id = 1"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sql := args[0]
			if sql == "-" {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				sql = string(b)
			}
			cfg, _, err := o.config()
			if err != nil {
				return err
			}
			rw, err := sqlrewrite.New(sqlrewrite.Config{Guards: cfg.Guards, TokenSetting: cfg.TokenSetting, Allow: cfg.Allow})
			if err != nil {
				return err
			}
			mode := sqlrewrite.Simple
			if prepared {
				mode = sqlrewrite.Prepared
			}
			res, err := rw.Rewrite(sql, mode, nil)
			if err != nil {
				return err
			}
			return printRewrite(cmd.OutOrStdout(), sql, res)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().BoolVar(&prepared, "prepared", false, "treat SQL as an extended-protocol Parse (one statement; the probe runs separately after each Execute)")
	return cmd
}

func printRewrite(w io.Writer, sql string, res *sqlrewrite.Result) error {
	if r := res.Refusal; r != nil {
		fmt.Fprintf(w, "ERROR:  %s\n", r.Message)
		if r.Hint != "" {
			fmt.Fprintf(w, "HINT:  %s\n", r.Hint)
		}
		fmt.Fprintf(w, "SQLSTATE: %s\n", r.Code)
		return errRefused
	}
	if len(res.Probes) == 0 && res.SQL == sql {
		fmt.Fprintln(w, "-- unchanged: no guarded table is written")
		fmt.Fprintln(w, sql)
		return nil
	}
	for _, f := range res.Fenced {
		where := ""
		if f.Nested {
			where = ", nested"
		}
		fmt.Fprintf(w, "-- %s %s (%s%s)\n", f.Kind, f.Table, f.Rollout, where)
	}
	for _, p := range res.Probes {
		tables := make([]string, len(p.Tables))
		for i, t := range p.Tables {
			tables[i] = t.Table
		}
		if p.Index >= 0 {
			fmt.Fprintf(w, "-- statement %d is pgfence's probe for %s (its result is kept from the client)\n", p.Index+1, strings.Join(tables, ", "))
		} else {
			fmt.Fprintf(w, "-- after each Execute, pgfence runs its probe for %s:\n--   %s\n", strings.Join(tables, ", "), p.SQL)
		}
	}
	fmt.Fprintln(w, res.SQL)
	return nil
}
