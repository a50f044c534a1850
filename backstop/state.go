package backstop

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// trigger is one of pgfence's triggers on a table, as the catalog has it.
type trigger struct {
	exists   bool
	name     string
	function string // in Schema; "" for a function elsewhere
	enabled  string // pg_trigger.tgenabled: O (origin), D, R, A
	// ok: of the shape pgfence creates, running an unedited function of
	// pgfence's (its name says its body).
	ok bool
}

// tableState is one guard's table in the catalog.
type tableState struct {
	guard     sqlrewrite.Guard
	oid       uint32 // 0: no such table
	kind      string // pg_class.relkind: r or p
	partition bool
	ancestors []uint32
	owner     string
	// own is the table's own row trigger; cloned says it has one cloned
	// from a partitioned ancestor's (and enabled what state that one is
	// in).
	own    trigger
	cloned bool
	clone  trigger
	trunc  trigger
	// epoch is the state (pg_trigger.tgenabled) of EpochTrigger when it
	// ties the epoch column, "" when it does not.
	epoch   string
	counter bool // its rejects_<oid> sequence exists
	// mayTrigger: the current role has the TRIGGER privilege on the
	// table; owns: it is the table's owner or a member of it (which
	// dropping a trigger, or enabling a partition's clone, takes).
	mayTrigger, owns bool
	// problem is what pgfence.backstop_problem says of the table, for the
	// functions the effective configuration wants ("" for none).
	problem string
}

// ownRowTrigger is the name of the row trigger a table of relkind kind
// gets of its own: a partitioned table's carries its oid, so that the
// clones Postgres makes of it on partitions never meet a trigger of the
// same name (ATTACH PARTITION of a table that has its own backstop, or of
// a partitioned table with its own, would fail).
func ownRowTrigger(kind string, oid uint32) string {
	if kind == "p" {
		return RowTrigger + "_p" + strconv.FormatUint(uint64(oid), 10)
	}
	return RowTrigger
}

// rowTriggerName matches the names of pgfence's row triggers (see
// ownRowTrigger), as a regular expression for SQL.
const rowTriggerName = `^~pgfence_backstop(_p[0-9]+)?$`

const stateQuery = `
SELECT g.i::int, coalesce(c.oid, 0)::int8, coalesce(c.relkind::text, ''), coalesce(c.relispartition, false),
       coalesce(ARRAY(SELECT a.relid::oid::int8 FROM pg_catalog.pg_partition_ancestors(c.oid) a WHERE a.relid::oid <> c.oid), '{}'),
       coalesce(pg_catalog.pg_get_userbyid(c.relowner)::text, ''),
       own.tgname IS NOT NULL, coalesce(own.tgname::text, ''), coalesce(own.fn, ''), coalesce(own.tgenabled::text, ''), coalesce(own.ok, false),
       cl.tgname IS NOT NULL, coalesce(cl.tgname::text, ''), coalesce(cl.fn, ''), coalesce(cl.tgenabled::text, ''),
       tt.tgname IS NOT NULL, coalesce(tt.fn, ''), coalesce(tt.tgenabled::text, ''), coalesce(tt.ok, false),
       coalesce((SELECT e.tgenabled::text FROM pg_catalog.pg_trigger e
               JOIN pg_catalog.pg_attribute a ON a.attrelid = e.tgrelid AND a.attname = g.col AND NOT a.attisdropped
               WHERE e.tgrelid = c.oid AND e.tgname = $6 AND pg_catalog.cardinality(e.tgattr::int2[]) = 1 AND e.tgattr[0] = a.attnum), ''),
       c.oid IS NOT NULL AND pg_catalog.to_regclass('pgfence.' || pg_catalog.quote_ident('rejects_' || c.oid::text)) IS NOT NULL,
       CASE WHEN c.oid IS NOT NULL THEN coalesce(pgfence.backstop_problem(c.oid, g.col, g.want_row, g.want_trunc), '') ELSE '' END,
       c.oid IS NOT NULL AND pg_catalog.has_table_privilege(c.oid, 'TRIGGER'),
       c.oid IS NOT NULL AND pg_catalog.pg_has_role(c.relowner, 'USAGE')
FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::text[]))
     WITH ORDINALITY AS g(schema, name, col, want_row, want_trunc, i)
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = g.schema
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = g.name AND c.relkind IN ('r', 'p')
LEFT JOIN LATERAL (
    SELECT t.tgname, CASE WHEN p.pronamespace = 'pgfence'::regnamespace::oid THEN p.proname::text END AS fn, t.tgenabled,
           pgfence.row_shaped(t) AND p.pronamespace = 'pgfence'::regnamespace::oid AND pgfence.unedited(p) AS ok
    FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid = c.oid AND t.tgparentid = 0::oid AND t.tgname::text ~ $7::text
    ORDER BY t.tgname COLLATE "C" LIMIT 1) own ON true
LEFT JOIN LATERAL (
    SELECT t.tgname, CASE WHEN p.pronamespace = 'pgfence'::regnamespace::oid THEN p.proname::text END AS fn, t.tgenabled
    FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid = c.oid AND t.tgparentid <> 0::oid AND t.tgname::text ~ $7::text
    ORDER BY t.tgname COLLATE "C" LIMIT 1) cl ON true
LEFT JOIN LATERAL (
    SELECT t.tgname, CASE WHEN p.pronamespace = 'pgfence'::regnamespace::oid THEN p.proname::text END AS fn, t.tgenabled,
           pgfence.unedited(p) AND t.tgtype = 34 AND t.tgqual IS NULL AS ok
    FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid = c.oid AND t.tgname = $8) tt ON true
ORDER BY g.i`

// readState reads the tables of guards as the catalog has them. want are
// the functions each table's triggers must run (see effective), for its
// problem. It needs pgfence's schema objects as Setup leaves them.
func readState(ctx context.Context, conn *pgx.Conn, guards []sqlrewrite.Guard, want []wanted) ([]tableState, error) {
	n := len(guards)
	schemas, names, cols := make([]string, n), make([]string, n), make([]string, n)
	rows, truncs := make([]*string, n), make([]*string, n)
	for i, g := range guards {
		schemas[i], names[i], cols[i] = g.Schema, g.Table, g.Column
		if f := want[i].row.Name; f != "" {
			rows[i] = &f
		}
		if f := want[i].trunc.Name; f != "" {
			truncs[i] = &f
		}
	}
	res, err := conn.Query(ctx, stateQuery, schemas, names, cols, rows, truncs, EpochTrigger, rowTriggerName, TruncateTrigger)
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	out := make([]tableState, 0, n)
	for res.Next() {
		var i int
		var oid int64
		var anc []int64
		var st tableState
		if err := res.Scan(&i, &oid, &st.kind, &st.partition, &anc, &st.owner,
			&st.own.exists, &st.own.name, &st.own.function, &st.own.enabled, &st.own.ok,
			&st.cloned, &st.clone.name, &st.clone.function, &st.clone.enabled,
			&st.trunc.exists, &st.trunc.function, &st.trunc.enabled, &st.trunc.ok,
			&st.epoch, &st.counter, &st.problem, &st.mayTrigger, &st.owns); err != nil {
			return nil, fmt.Errorf("reading the backstop's state: %w", err)
		}
		st.guard, st.oid = guards[i-1], uint32(oid)
		for _, a := range anc {
			st.ancestors = append(st.ancestors, uint32(a))
		}
		out = append(out, st)
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	return out, nil
}

// clonedFromGuarded reports whether the table's row trigger comes, or will
// come, from a partitioned ancestor that is guarded too, as w, the table's
// own, says: Postgres clones a partitioned table's row triggers to its
// partitions. An ancestor configured otherwise would fence it otherwise.
func (st tableState) clonedFromGuarded(all []tableState, want []wanted, w wanted) bool {
	for _, a := range st.ancestors {
		for i, o := range all {
			if o.oid == a && want[i].row.Name == w.row.Name {
				return true
			}
		}
	}
	return false
}

func enabledWord(e string) string {
	switch e {
	case "D":
		return "disabled"
	case "R":
		return "enabled for replicas only"
	case "A":
		return "enabled always"
	}
	return "in state " + strconv.Quote(e)
}
