package catalog

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// Querier runs catalog queries: a *pgx.Conn or a pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Discovery is what the catalog says about guarded tables.
type Discovery struct {
	// Guards are the explicit guards, each partition or inheritance child
	// of a guarded table, and (when discovering) every table with the
	// epoch column, schema-qualified.
	Guards []sqlrewrite.Guard
	// Tables are the tables that exist among them, each once and
	// schema-qualified (an unqualified guard stands for every table of its
	// name): what the database backstop is installed on.
	Tables []sqlrewrite.Guard
	// Problems describe guarded tables that cannot be fenced as configured:
	// missing, or whose epoch column is missing, nullable or not an integer.
	Problems []string
	// Parents are the tables' direct parents (partitioned tables or
	// inheritance parents), both as schema.table: what a write naming a
	// parent may write besides it (see mixedTrees).
	Parents map[string][]string
}

// catalogQuery lists ordinary and partitioned tables with their epoch-column
// candidates and parents. $1 is the default epoch column name. Temporary
// tables are left out: only their own session can write them, so fencing
// one protects nothing, and another session's would make every session's
// writes to a guard of its name refused (red team 6b), or hold /readyz at
// 503 while it cannot be given a backstop.
const catalogQuery = `
SELECT n.nspname, c.relname,
       coalesce((SELECT pg_catalog.array_agg(pn.nspname::text || '.' || pc.relname::text)
                 FROM pg_catalog.pg_inherits i
                 JOIN pg_catalog.pg_class pc ON pc.oid = i.inhparent
                 JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace
                 WHERE i.inhrelid = c.oid), '{}') AS parents,
       cols.names, cols.types, cols.notnull
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (
    SELECT coalesce(pg_catalog.array_agg(a.attname::text ORDER BY a.attnum), '{}') AS names,
           coalesce(pg_catalog.array_agg(t.typname::text ORDER BY a.attnum), '{}') AS types,
           coalesce(pg_catalog.array_agg(a.attnotnull ORDER BY a.attnum), '{}') AS notnull
    FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) cols
WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname::text NOT LIKE 'pg\_toast%'
ORDER BY n.nspname, c.relname`

type catalogTable struct {
	schema, name string
	parents      []string
	columns      map[string]columnInfo
}

type columnInfo struct {
	typ     string
	notNull bool
}

// Discover reads the catalog through q. Explicit guards are checked and
// extended to their partitions and inheritance children (recursively); with
// auto, every table that has a bigint column named column is guarded too,
// with the rollout template gives it.
func Discover(ctx context.Context, q Querier, explicit []sqlrewrite.Guard, auto bool, column string, template func(sqlrewrite.Guard) sqlrewrite.Guard) (*Discovery, error) {
	rows, err := q.Query(ctx, catalogQuery)
	if err != nil {
		return nil, fmt.Errorf("reading the catalog: %w", err)
	}
	var tables []*catalogTable
	for rows.Next() {
		var t catalogTable
		var names, types []string
		var notNull []bool
		if err := rows.Scan(&t.schema, &t.name, &t.parents, &names, &types, &notNull); err != nil {
			return nil, fmt.Errorf("reading the catalog: %w", err)
		}
		t.columns = make(map[string]columnInfo, len(names))
		for i, name := range names {
			t.columns[name] = columnInfo{typ: types[i], notNull: notNull[i]}
		}
		tables = append(tables, &t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the catalog: %w", err)
	}
	return discover(tables, explicit, auto, column, template), nil
}

func discover(tables []*catalogTable, explicit []sqlrewrite.Guard, auto bool, column string, template func(sqlrewrite.Guard) sqlrewrite.Guard) *Discovery {
	d := &Discovery{Parents: make(map[string][]string)}
	byName := make(map[string]*catalogTable, len(tables))
	children := make(map[string][]*catalogTable)
	for _, t := range tables {
		byName[t.schema+"."+t.name] = t
		for _, p := range t.parents {
			children[p] = append(children[p], t)
		}
		if len(t.parents) > 0 {
			d.Parents[t.schema+"."+t.name] = t.parents
		}
	}
	seen := make(map[string]bool)
	tableSeen := make(map[string]bool)
	// A table without an integer epoch column gets no backstop: its
	// trigger could only fail every write (the problem says so).
	addTable := func(t *catalogTable, g sqlrewrite.Guard) {
		if ci, ok := t.columns[g.Column]; !ok || !isInteger(ci.typ) {
			return
		}
		if key := t.schema + "." + t.name; !tableSeen[key] {
			tableSeen[key] = true
			g.Schema, g.Table = t.schema, t.name
			d.Tables = append(d.Tables, g)
		}
	}
	add := func(g sqlrewrite.Guard) {
		key := g.Schema + "." + g.Table
		if g.Schema == "" {
			key = "*." + g.Table
		}
		if !seen[key] {
			seen[key] = true
			d.Guards = append(d.Guards, g)
		}
	}
	// A guard covers its table's partitions and children, whatever their
	// depth: writes can name them directly.
	var addTree func(t *catalogTable, g sqlrewrite.Guard)
	addTree = func(t *catalogTable, g sqlrewrite.Guard) {
		for _, child := range children[t.schema+"."+t.name] {
			cg := g
			cg.Schema, cg.Table, cg.As = child.schema, child.name, ""
			if !seen[cg.Schema+"."+cg.Table] {
				add(cg)
				addTable(child, g)
				addTree(child, g)
			}
		}
	}
	covers := func(g sqlrewrite.Guard, t *catalogTable) bool {
		return t.name == g.Table && (g.Schema == "" || g.Schema == t.schema)
	}
	for _, g := range explicit {
		var matches []*catalogTable
		for _, t := range tables {
			if covers(g, t) {
				matches = append(matches, t)
			}
		}
		// An unqualified guard of one table is labelled with the table's
		// schema, as a discovered or qualified guard of it would be.
		if g.Schema == "" && len(matches) == 1 {
			g.As = sqlrewrite.Guard{Schema: matches[0].schema, Table: matches[0].name}.Name()
		}
		// A table that cannot be fenced has its writes refused, saying
		// why: the guard of it, or, for an unqualified guard of several
		// tables, a guard of its own beside it (a write naming it
		// unqualified is then refused too, as it may be that one).
		var broken []*catalogTable
		for _, t := range matches {
			if unfenceable(t, g.Column) != "" && g.Rollout != sqlrewrite.Observe {
				broken = append(broken, t)
			}
		}
		if len(broken) > 0 && (g.Schema != "" || len(matches) == 1) {
			g.Unfenceable = unfenceable(broken[0], g.Column)
			broken = nil
		}
		add(g)
		for _, t := range broken {
			b := g
			b.Schema, b.Table, b.As, b.Unfenceable = t.schema, t.name, "", unfenceable(t, g.Column)
			add(b)
		}
		for _, t := range matches {
			if p := columnProblem(t, g.Column); p != "" {
				d.Problems = append(d.Problems, p)
			}
			g := g
			g.As, g.Unfenceable = "", ""
			addTable(t, g)
			addTree(t, g)
		}
		if len(matches) == 0 {
			d.Problems = append(d.Problems, fmt.Sprintf("guarded table %s does not exist in this database; writes naming it are still fenced", g.Name()))
		}
	}
	if auto {
		for _, t := range tables {
			ci, ok := t.columns[column]
			if !ok {
				continue
			}
			// A table an explicit guard covers is guarded as that guard
			// says, once: a second guard would double its series.
			if slices.ContainsFunc(explicit, func(g sqlrewrite.Guard) bool { return covers(g, t) }) {
				continue
			}
			g := template(sqlrewrite.Guard{Schema: t.schema, Table: t.name, Column: column})
			if !isInteger(ci.typ) {
				d.Problems = append(d.Problems, fmt.Sprintf("table %s.%s has a column %q of type %s, not bigint: not guarded; make it bigint NOT NULL to guard it", t.schema, t.name, column, ci.typ))
				continue
			}
			if p := columnProblem(t, column); p != "" {
				d.Problems = append(d.Problems, p)
			}
			addTable(t, g)
			add(g)
			addTree(t, g)
		}
	}
	sort.Strings(d.Problems)
	return d
}

func isInteger(typ string) bool { return typ == "int8" || typ == "int4" || typ == "int2" }

// unfenceable says why writes to t cannot be fenced with epoch column
// column, and how to fix it ("" when they can): the column is missing, or
// not an integer (see sqlrewrite.Guard.Unfenceable).
func unfenceable(t *catalogTable, column string) string {
	name := sqlrewrite.Guard{Schema: t.schema, Table: t.name}.Name()
	col := sqlrewrite.Guard{Table: column}.Name()
	switch ci, ok := t.columns[column]; {
	case !ok:
		return fmt.Sprintf("it has no epoch column %q; add it: ALTER TABLE %s ADD COLUMN %s bigint NOT NULL DEFAULT 0", column, name, col)
	case !isInteger(ci.typ):
		return fmt.Sprintf("its epoch column %q is of type %s, not bigint; make it one: ALTER TABLE %s ALTER COLUMN %s TYPE bigint USING 0 (which sets every epoch to 0)", column, ci.typ, name, col)
	}
	return ""
}

// columnProblem describes what is wrong with t's epoch column, if anything.
func columnProblem(t *catalogTable, column string) string {
	ci, ok := t.columns[column]
	switch {
	case !ok:
		return fmt.Sprintf("guarded table %s.%s has no column %q: its writes are refused (but in observe mode) until it has; add it: ALTER TABLE %s.%s ADD COLUMN %s bigint NOT NULL DEFAULT 0", t.schema, t.name, column, t.schema, t.name, column)
	case !isInteger(ci.typ):
		return fmt.Sprintf("epoch column %q of guarded table %s.%s is %s, not bigint: its writes are refused (but in observe mode) until it is", column, t.schema, t.name, ci.typ)
	case ci.typ != "int8":
		return fmt.Sprintf("epoch column %q of guarded table %s.%s is %s: tokens above its range will fail; make it bigint", column, t.schema, t.name, ci.typ)
	case !ci.notNull:
		return fmt.Sprintf("epoch column %q of guarded table %s.%s is nullable: a row with a NULL epoch can never be written through pgfence; make it NOT NULL", column, t.schema, t.name)
	}
	return ""
}
