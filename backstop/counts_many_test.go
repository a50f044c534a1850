package backstop_test

import (
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The counters are read in queries of a bounded number of sequences each,
// every query its transaction, so that a database with thousands of
// guarded tables does not take a lock per table at once from Postgres's
// shared lock table (red team 7b); every counter is still read.
func TestReadCountsMany(t *testing.T) {
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	const n = 1100 // more than two queries' worth
	pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS rc_many CASCADE; CREATE SCHEMA rc_many;
		DO $$ DECLARE r oid; BEGIN
		  FOR i IN 1..1100 LOOP
		    EXECUTE pg_catalog.format('CREATE TABLE rc_many.t%s (id int)', i);
		    r := pg_catalog.to_regclass(pg_catalog.format('rc_many.t%s', i));
		    EXECUTE pg_catalog.format('CREATE SEQUENCE pgfence.rejects_%s', r);
		    PERFORM pg_catalog.setval(pg_catalog.format('pgfence.rejects_%s', r)::regclass, i);
		  END LOOP;
		END $$`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), `DO $$ DECLARE s record; BEGIN
		  FOR s IN SELECT c.oid::regclass AS q FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class t ON t.oid = pg_catalog.substr(c.relname, 9)::oid
		    JOIN pg_catalog.pg_namespace tn ON tn.oid = t.relnamespace
		    WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relkind = 'S' AND c.relname ~ '^rejects_[0-9]+$' AND tn.nspname = 'rc_many' LOOP
		    EXECUTE pg_catalog.format('DROP SEQUENCE %s', s.q);
		  END LOOP;
		END $$; DROP SCHEMA rc_many CASCADE`)
	})
	c, err := backstop.ReadCounts(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	got, sum := 0, int64(0)
	for table, v := range c.Rejects {
		if len(table) > len("rc_many.") && table[:len("rc_many.")] == "rc_many." {
			got++
			sum += v
		}
	}
	if got != n || sum != n*(n+1)/2 {
		t.Fatalf("read %d counters of rc_many summing %d, want %d summing %d", got, sum, n, n*(n+1)/2)
	}
}
