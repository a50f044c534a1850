package backstop

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Counts are the backstop's counters in the database: every path's, not
// only pgfence's sessions'.
type Counts struct {
	// Rejects are the stale rows the backstop kept out (shadow: would
	// have), by table as schema.table.
	Rejects map[string]int64
	// Exempt are the rows exempt roles wrote without the fence.
	Exempt int64
}

// rejectCounters lists the reject counters, each a sequence pgfence.rejects_<oid>
// of the table it counts for ("" for a dropped table's).
const rejectCounters = `
SELECT s.oid::int8, coalesce(n.nspname::text || '.' || c.relname::text, '')
FROM pg_catalog.pg_class s
JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace
LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.substr(s.relname, 9)::oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE sn.nspname = 'pgfence' AND s.relkind = 'S' AND s.relname::text ~ '^rejects_[0-9]+$'`

// counterValues reads the sequences $1 (oids) still there.
const counterValues = `
SELECT g.s, coalesce(pg_catalog.pg_sequence_last_value(g.s::oid::regclass), 0)
FROM pg_catalog.unnest($1::int8[]) AS g(s)
WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = g.s::oid)`

const exemptCounter = `
SELECT coalesce(pg_catalog.pg_sequence_last_value(pg_catalog.to_regclass('pgfence.exempt_writes')), 0)
WHERE pg_catalog.to_regclass('pgfence.exempt_writes') IS NOT NULL`

// countersPerQuery bounds the sequences one query reads: reading one takes
// a lock on it until the query's transaction ends, and Postgres's lock
// table is shared by the whole server (red team 7b: a database with 10,000
// guarded tables failed every read with "out of shared memory", and a
// session in another database met it once).
const countersPerQuery = 500

// ReadCounts reads the counters (none before Setup). It names no object
// of pgfence's schema in its text, which would fail before Setup.
func ReadCounts(ctx context.Context, conn *pgx.Conn) (Counts, error) {
	c := Counts{Rejects: map[string]int64{}}
	rows, err := conn.Query(ctx, rejectCounters)
	if err != nil {
		return c, fmt.Errorf("reading the backstop's counters: %w", err)
	}
	tables := map[int64]string{}
	var oids []int64
	for rows.Next() {
		var oid int64
		var table string
		if err := rows.Scan(&oid, &table); err != nil {
			return c, fmt.Errorf("reading the backstop's counters: %w", err)
		}
		if table != "" { // "" is the counter of a dropped table
			tables[oid] = table
			oids = append(oids, oid)
		}
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("reading the backstop's counters: %w", err)
	}
	for batch := range slices.Chunk(oids, countersPerQuery) {
		rows, err := conn.Query(ctx, counterValues, batch)
		if err != nil {
			return c, fmt.Errorf("reading the backstop's counters: %w", err)
		}
		for rows.Next() {
			var oid, n int64
			if err := rows.Scan(&oid, &n); err != nil {
				return c, fmt.Errorf("reading the backstop's counters: %w", err)
			}
			c.Rejects[tables[oid]] += n
		}
		if err := rows.Err(); err != nil {
			return c, fmt.Errorf("reading the backstop's counters: %w", err)
		}
	}
	if err := conn.QueryRow(ctx, exemptCounter).Scan(&c.Exempt); err != nil && err != pgx.ErrNoRows {
		return c, fmt.Errorf("reading the backstop's counters: %w", err)
	}
	return c, nil
}
