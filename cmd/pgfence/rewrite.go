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
	var prepared, asText, backstop bool
	cmd := &cobra.Command{
		Use:   "rewrite [flags] SQL",
		Short: "Print the SQL pgfence would send for SQL, or the error a client would get; no server needed",
		Long: `rewrite shows what pgfence does to a statement, offline: the text Postgres
would receive (probe statements included), or the error the client would get.
A write sent as a simple-protocol Query is shown as the statement pgfence
prepares once per session and binds the write's literals to, when it does
(--as-text shows the text rewritten as sent, which is what a Query in the
middle of an extended-protocol batch gets). It takes the same policy flags as
serve. --backstop shows what serve does where the database backstop is in
place on the guarded tables (serve installs it by default): MERGE, COPY FROM
and WHERE CURRENT OF then run unrewritten, fenced by Postgres, and a stale row
raises its flag through the backstop's helper pgfence.note_stale. SQL "-" reads
the text from stdin. The exit status is 1 when the statement is refused.`,
		Example: `  pgfence rewrite --guard accounts "UPDATE accounts SET balance = 0 WHERE id = 1"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := loadEnv(cmd); err != nil {
				return err
			}
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
			for i := range cfg.Guards {
				cfg.Guards[i].Backstop = backstop
			}
			rw, err := sqlrewrite.New(sqlrewrite.Config{Guards: cfg.Guards, TokenSetting: cfg.TokenSetting, Allow: cfg.Allow, StaleNotice: backstop, MaxParse: cfg.MaxParse})
			if err != nil {
				return err
			}
			if !prepared && !asText {
				p, res, ok, err := rw.Template(sql)
				if err != nil {
					return err
				}
				if ok {
					printBinding(cmd.OutOrStdout(), p)
					return printRewrite(cmd.OutOrStdout(), p.SQL, res, backstop)
				}
			}
			mode := sqlrewrite.Simple
			if prepared {
				mode = sqlrewrite.Prepared
			}
			res, err := rw.Rewrite(sql, mode, nil)
			if err != nil {
				return err
			}
			return printRewrite(cmd.OutOrStdout(), sql, res, backstop)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().BoolVar(&prepared, "prepared", false, "treat SQL as an extended-protocol Parse (one statement; the probe runs separately after each Execute)")
	cmd.Flags().BoolVar(&asText, "as-text", false, "show a simple-protocol write rewritten as sent, not as the prepared statement pgfence binds its literals to")
	// Not a policy flag: serve has its own --backstop, which installs or
	// verifies the backstop rather than assuming it.
	cmd.Flags().BoolVar(&backstop, "backstop", false, "assume the database backstop is in place on every guarded table, as serve's default --backstop=install makes it: MERGE, COPY FROM and WHERE CURRENT OF run unrewritten, fenced by Postgres")
	return cmd
}

// printBinding says that a Query runs as the template p, bound to its
// literals.
func printBinding(w io.Writer, p sqlrewrite.Parameterized) {
	fmt.Fprintln(w, "-- a simple-protocol Query: pgfence prepares the statement below once per session and binds each execution's literals to it")
	if len(p.Values) == 0 {
		return
	}
	params := make([]string, len(p.Values))
	for i, v := range p.Values {
		if p.Types[i] == 0 {
			v = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		}
		params[i] = fmt.Sprintf("$%d = %s (%s)", i+1, v, typeName(p.Types[i]))
	}
	fmt.Fprintf(w, "--   %s\n", strings.Join(params, ", "))
	if p.Strings() {
		fmt.Fprintln(w, "-- (an untyped parameter gets the type Postgres gives the string literal in its place)")
	}
}

// typeName names a parameter type Parameterize declares.
func typeName(oid uint32) string {
	switch oid {
	case 0:
		return "untyped"
	case 20:
		return "int8"
	case 23:
		return "int4"
	case 1700:
		return "numeric"
	}
	return fmt.Sprintf("type %d", oid)
}

// printRewrite prints res, the rewrite of sql; helpers says the
// backstop's helpers are in place (see sqlrewrite.Config.StaleNotice).
func printRewrite(w io.Writer, sql string, res *sqlrewrite.Result, helpers bool) error {
	if r := res.Refusal; r != nil {
		fmt.Fprintf(w, "ERROR:  %s\n", r.Message)
		if r.Hint != "" {
			fmt.Fprintf(w, "HINT:  %s\n", r.Hint)
		}
		fmt.Fprintf(w, "SQLSTATE: %s\n", r.Code)
		return errRefused
	}
	if len(res.Probes) == 0 && res.SQL == sql && len(res.Fenced) == 0 {
		fmt.Fprintln(w, "-- unchanged: no guarded table is written")
		fmt.Fprintln(w, sql)
		return nil
	}
	for _, f := range res.Fenced {
		where := ""
		if f.Nested {
			where = ", nested"
		}
		if f.Backstop {
			where += ", fenced by the database backstop"
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
		if helpers && p.Index < 0 {
			fmt.Fprintln(w, "-- (but not after a write right after a SET of the token that pgfence answered: its stale rows raise notices through pgfence.note_stale, which pgfence counts instead)")
		}
	}
	fmt.Fprintln(w, res.SQL)
	return nil
}
