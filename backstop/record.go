package backstop

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// One configuration across instances: the database records the
// configuration its backstop was installed with (pgfence.settings, and per
// table pgfence.guarded), and that is the one every instance installs. The
// first instance to install a table records it; an instance whose flags
// differ keeps the recorded one and says where they differ
// (Report.Differences); 'pgfence init' (Options.Replace) records its own.
// Two instances with different flags would otherwise replace each other's
// trigger functions at every discovery.

// recorded is the configuration recorded in the database.
type recorded struct {
	settings *recordedSettings
	tables   map[uint32]recordedTable
	// ddl is the discovered tables' row function the DDL watch uses ("":
	// none recorded).
	ddl ddlRecord
}

type recordedSettings struct {
	tokenSetting  string
	allowTruncate bool
	exemptRoles   []string
	pooledRoles   []string
}

type recordedTable struct {
	column       string
	rollout      sqlrewrite.Rollout
	allowMissing bool
	domain       string
}

type ddlRecord struct {
	column, row, trunc string
	// rollout and allowMissing are what the row function was made from
	// (nil: not recorded, by a version before 0.1.0).
	rollout      *string
	allowMissing *bool
}

// discovered is d, the configuration of tables found by their epoch
// column, with the recorded one in place of its own, unless o replaces
// it or none is recorded.
func (r *recorded) discovered(d sqlrewrite.Guard, o Options) sqlrewrite.Guard {
	if o.Replace || r.ddl.rollout == nil || r.ddl.allowMissing == nil {
		return d
	}
	d.Column, d.Rollout, d.AllowMissingToken = r.ddl.column, rolloutOf(*r.ddl.rollout), *r.ddl.allowMissing
	return d
}

// readRecorded reads the recorded configuration (none before Setup).
func readRecorded(ctx context.Context, conn *pgx.Conn) (*recorded, error) {
	r := &recorded{tables: map[uint32]recordedTable{}}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('pgfence.guarded') IS NOT NULL AND pg_catalog.to_regclass('pgfence.settings') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading the backstop's recorded configuration: %w", err)
	}
	if !exists {
		return r, nil
	}
	var s recordedSettings
	err := conn.QueryRow(ctx, "SELECT token_setting, allow_truncate, exempt_roles::text[], pooled_roles::text[] FROM pgfence.settings").Scan(&s.tokenSetting, &s.allowTruncate, &s.exemptRoles, &s.pooledRoles)
	switch {
	case err == nil:
		r.settings = &s
	case err != pgx.ErrNoRows:
		return nil, fmt.Errorf("reading the backstop's recorded configuration: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT relid::int8, epoch_column::text, rollout, allow_missing, coalesce(domain, '') FROM pgfence.guarded")
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's recorded configuration: %w", err)
	}
	for rows.Next() {
		var oid int64
		var t recordedTable
		var rollout string
		if err := rows.Scan(&oid, &t.column, &rollout, &t.allowMissing, &t.domain); err != nil {
			return nil, fmt.Errorf("reading the backstop's recorded configuration: %w", err)
		}
		t.rollout = rolloutOf(rollout)
		r.tables[uint32(oid)] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the backstop's recorded configuration: %w", err)
	}
	err = conn.QueryRow(ctx, "SELECT epoch_column::text, row_function::text, coalesce(truncate_function::text, ''), rollout, allow_missing FROM pgfence.ddl_backstop").
		Scan(&r.ddl.column, &r.ddl.row, &r.ddl.trunc, &r.ddl.rollout, &r.ddl.allowMissing)
	if err != nil && err != pgx.ErrNoRows {
		return nil, fmt.Errorf("reading the backstop's recorded configuration: %w", err)
	}
	return r, nil
}

func rolloutOf(s string) sqlrewrite.Rollout {
	switch s {
	case "shadow":
		return sqlrewrite.Shadow
	case "observe":
		return sqlrewrite.Observe
	}
	return sqlrewrite.Enforce
}

// wanted are the functions a table's triggers run ("" for none): its row
// trigger's and its TRUNCATE trigger's.
type wanted struct {
	row, trunc Function
}

func wantedFor(g sqlrewrite.Guard, o Options) wanted {
	var w wanted
	w.row, _ = RowFunction(g, o)
	w.trunc, _ = TruncateFunction(o)
	return w
}

// options is o with the recorded settings in place of its own, unless o
// replaces them or none are recorded.
func (r *recorded) options(o Options) Options {
	if r.settings == nil || o.Replace {
		return o
	}
	o.TokenSetting, o.AllowTruncate, o.ExemptRoles, o.PooledRoles = r.settings.tokenSetting, r.settings.allowTruncate, r.settings.exemptRoles, r.settings.pooledRoles
	return o
}

// guard is g, the guard of the table oid, with its recorded configuration
// in place of its own, unless o replaces it or none is recorded. Where
// the table is recorded without a lock domain, the domain g has stands:
// serve hands guards over with the database's membership
// (pgfence.domain_members) applied, which every instance's rewrite
// follows, and which serve adds a --domain to where the table has none;
// the backstop of a table put in a domain so must claim it too, or the
// writes only it fences (a DO block, a view, a direct session) would go
// on unclaimed while the rewrite refused them (red team 7a). A recorded
// domain stays: g's may be an instance's flag (red team 8), and moving a
// table to another domain is pgfence init's.
func (r *recorded) guard(g sqlrewrite.Guard, oid uint32, o Options) sqlrewrite.Guard {
	t, ok := r.tables[oid]
	if !ok || o.Replace {
		return g
	}
	g.Column, g.Rollout, g.AllowMissingToken = t.column, t.rollout, t.allowMissing
	if t.domain != "" {
		g.Domain = t.domain
	}
	return g
}

// differences says where this instance's configuration (guards, o)
// differs from the recorded one, which stays.
func (r *recorded) differences(guards []sqlrewrite.Guard, oids []uint32, o Options) []string {
	if o.Replace {
		return nil
	}
	var out []string
	if s := r.settings; s != nil {
		if s.tokenSetting != o.setting() {
			out = append(out, fmt.Sprintf("--token-setting: %s in the database, %s here", s.tokenSetting, o.setting()))
		}
		if s.allowTruncate != o.AllowTruncate {
			out = append(out, fmt.Sprintf("--allow-truncate: %v in the database, %v here", s.allowTruncate, o.AllowTruncate))
		}
		out = appendRoleDifference(out, "--backstop-exempt-role", s.exemptRoles, o.ExemptRoles)
		out = appendRoleDifference(out, "--backstop-pooled-role", s.pooledRoles, o.PooledRoles)
	}
	if d := o.Discovered; d != nil && r.ddl.rollout != nil && r.ddl.allowMissing != nil {
		rec := r.discovered(*d, o)
		var diff []string
		if rec.Column != d.Column {
			diff = append(diff, fmt.Sprintf("--discover-column %s in the database, %s here", rec.Column, d.Column))
		}
		if rec.Rollout != d.Rollout {
			diff = append(diff, fmt.Sprintf("--mode %s in the database, %s here", rec.Rollout, d.Rollout))
		}
		if rec.AllowMissingToken != d.AllowMissingToken {
			diff = append(diff, fmt.Sprintf("--missing-token %s in the database, %s here", missingWord(rec.AllowMissingToken), missingWord(d.AllowMissingToken)))
		}
		if len(diff) > 0 {
			out = append(out, "tables found by their epoch column: "+strings.Join(diff, "; "))
		}
	}
	for i, g := range guards {
		t, ok := r.tables[oids[i]]
		if !ok || oids[i] == 0 {
			continue
		}
		var d []string
		if t.column != g.Column {
			d = append(d, fmt.Sprintf("epoch column %s in the database, %s here", t.column, g.Column))
		}
		if t.rollout != g.Rollout {
			d = append(d, fmt.Sprintf("--mode/--table-mode %s in the database, %s here", t.rollout, g.Rollout))
		}
		if t.allowMissing != g.AllowMissingToken {
			d = append(d, fmt.Sprintf("--missing-token %s in the database, %s here", missingWord(t.allowMissing), missingWord(g.AllowMissingToken)))
		}
		if t.domain != g.Domain {
			d = append(d, fmt.Sprintf("--domain %q in the database, %q here", t.domain, g.Domain))
		}
		if len(d) > 0 {
			out = append(out, "table "+g.Name()+": "+strings.Join(d, "; "))
		}
	}
	return out
}

// appendRoleDifference appends to out a line for flag when the roles
// recorded (theirs) are not this instance's (mine).
func appendRoleDifference(out []string, flag string, theirs, mine []string) []string {
	t, m := slices.Sorted(slices.Values(theirs)), slices.Sorted(slices.Values(mine))
	if slices.Equal(t, m) {
		return out
	}
	return append(out, fmt.Sprintf("%s: [%s] in the database, [%s] here", flag, strings.Join(t, ", "), strings.Join(m, ", ")))
}

func missingWord(allow bool) string {
	if allow {
		return "allow"
	}
	return "reject"
}

// RolloutHint says how to roll a configuration change out, for a report
// with Differences.
const RolloutHint = "the database's configuration stays, as every pgfence instance installs the one the database records; " +
	"to roll a change out, run 'pgfence init' once with the new flags (it records them and installs them), then restart every instance with the same flags"

// record writes the configuration each table's backstop was installed
// with (effective: the recorded one, or this instance's where none is or
// o replaces it), and forgets the tables that are gone.
func record(ctx context.Context, tx pgx.Tx, state []tableState, eff []sqlrewrite.Guard, want []wanted, o Options) error {
	if _, err := tx.Exec(ctx, `INSERT INTO pgfence.settings (token_setting, allow_truncate, exempt_roles, pooled_roles) VALUES ($1, $2, $3, $5)
		ON CONFLICT (one) DO UPDATE SET token_setting = excluded.token_setting, allow_truncate = excluded.allow_truncate,
		    exempt_roles = excluded.exempt_roles, pooled_roles = excluded.pooled_roles
		WHERE $4 AND (pgfence.settings.token_setting, pgfence.settings.allow_truncate, pgfence.settings.exempt_roles, pgfence.settings.pooled_roles)
		      IS DISTINCT FROM (excluded.token_setting, excluded.allow_truncate, excluded.exempt_roles, excluded.pooled_roles)`,
		o.setting(), o.AllowTruncate, sortedRoles(o.ExemptRoles), o.Replace, sortedRoles(o.PooledRoles)); err != nil {
		return fmt.Errorf("recording the backstop's configuration: %w", err)
	}
	for i, st := range state {
		if st.oid == 0 {
			continue
		}
		g := eff[i]
		var domain, row, trunc *string
		if g.Domain != "" {
			domain = &g.Domain
		}
		if f := want[i].row.Name; f != "" {
			row = &f
		}
		if f := want[i].trunc.Name; f != "" {
			trunc = &f
		}
		if _, err := tx.Exec(ctx, `INSERT INTO pgfence.guarded AS g (relid, epoch_column, rollout, allow_missing, domain, row_function, truncate_function)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (relid) DO UPDATE SET epoch_column = excluded.epoch_column, rollout = excluded.rollout, allow_missing = excluded.allow_missing,
			    domain = excluded.domain, row_function = excluded.row_function, truncate_function = excluded.truncate_function
			WHERE (g.epoch_column, g.rollout, g.allow_missing, g.domain, g.row_function, g.truncate_function)
			      IS DISTINCT FROM (excluded.epoch_column, excluded.rollout, excluded.allow_missing, excluded.domain, excluded.row_function, excluded.truncate_function)`,
			int64(st.oid), g.Column, g.Rollout.String(), g.AllowMissingToken, domain, row, trunc); err != nil {
			return fmt.Errorf("recording the backstop's configuration of table %s: %w", g.Name(), err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM pgfence.guarded g WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = g.relid)`); err != nil {
		return fmt.Errorf("recording the backstop's configuration: %w", err)
	}
	return nil
}

func sortedRoles(roles []string) []string {
	r := slices.Clone(roles)
	slices.Sort(r)
	if r == nil {
		r = []string{}
	}
	return r
}
