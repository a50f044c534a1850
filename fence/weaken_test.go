package fence_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Through pgfence, DDL that would weaken a guarded table's backstop is
// refused in the text, whether or not the database's own DDL guard is in
// place (here it is not: no backstop is installed at all), and runs
// nowhere: a disable-write-enable transaction leaves the row and the
// table's triggers as they were. Ordinary DDL passes.
func TestWeakeningDDLRefused(t *testing.T) {
	tb := table(t, [3]any{1, "a", 5})
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "CREATE OR REPLACE FUNCTION "+tb+"_keep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$")
	pgtest.Exec(t, db, "CREATE TRIGGER keep BEFORE UPDATE ON "+tb+" FOR EACH ROW EXECUTE FUNCTION "+tb+"_keep()")
	p := pgtest.StartProxy(t, []string{tb})
	c := p.Connect(t)
	for _, sql := range []string{
		"ALTER TABLE " + tb + " DISABLE TRIGGER USER",
		"BEGIN; ALTER TABLE " + tb + " DISABLE TRIGGER USER; DO $$ BEGIN UPDATE " + tb + " SET val = 'stale' WHERE id = 1; END $$; ALTER TABLE " + tb + " ENABLE TRIGGER USER; COMMIT",
		"ALTER TABLE " + tb + " ALTER COLUMN fence_epoch TYPE bigint USING 0",
		"ALTER TABLE " + tb + " RENAME COLUMN fence_epoch TO e",
		`DROP TRIGGER "~pgfence_backstop" ON ` + tb,
	} {
		_, err := c.Exec(ctx, sql)
		if pe := pgErr(t, err); pe.Code != "42501" {
			t.Fatalf("%s: %v, want 42501", sql, err)
		}
		pgtest.Exec(t, c, "ROLLBACK") // a warning outside a block
	}
	if v, e := row(t, tb, 1); v != "a" || e != 5 {
		t.Fatalf("row 1 after the refusals: %q at %d", v, e)
	}
	var enabled string
	if err := db.QueryRow(ctx, "SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = '"+tb+"'::regclass AND tgname = 'keep'").Scan(&enabled); err != nil || enabled != "O" {
		t.Fatalf("the table's trigger: %q %v", enabled, err)
	}
	pgtest.Exec(t, c, "ALTER TABLE "+tb+" ADD COLUMN note text")
	pgtest.Exec(t, c, "CREATE INDEX ON "+tb+" (note)")
}
