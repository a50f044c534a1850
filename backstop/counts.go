package backstop

import (
	"context"
	"fmt"

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

const countsQuery = `
SELECT 'rejects', coalesce(n.nspname::text || '.' || c.relname::text, ''),
       coalesce(pg_catalog.pg_sequence_last_value(s.oid), 0)
FROM pg_catalog.pg_class s
JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace
LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.substr(s.relname, 9)::oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE sn.nspname = 'pgfence' AND s.relkind = 'S' AND s.relname::text ~ '^rejects_[0-9]+$'
UNION ALL
SELECT 'exempt', '', coalesce(pg_catalog.pg_sequence_last_value(pg_catalog.to_regclass('pgfence.exempt_writes')), 0)
WHERE pg_catalog.to_regclass('pgfence.exempt_writes') IS NOT NULL`

// ReadCounts reads the counters (none before Setup). It names no object
// of pgfence's schema in its text, which would fail before Setup.
func ReadCounts(ctx context.Context, conn *pgx.Conn) (Counts, error) {
	c := Counts{Rejects: map[string]int64{}}
	rows, err := conn.Query(ctx, countsQuery)
	if err != nil {
		return c, fmt.Errorf("reading the backstop's counters: %w", err)
	}
	for rows.Next() {
		var kind, table string
		var n int64
		if err := rows.Scan(&kind, &table, &n); err != nil {
			return c, fmt.Errorf("reading the backstop's counters: %w", err)
		}
		switch {
		case kind == "exempt":
			c.Exempt = n
		case table != "": // "" is the counter of a dropped table
			c.Rejects[table] += n
		}
	}
	return c, rows.Err()
}
