package backstop_test

import (
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// pgfence.domains is granted to PUBLIC when it is made, and a DBA's
// narrower grant (to the writers alone: red team 7a, any role could raise
// a domain's token or hold its row) stands when setup runs again.
func TestDomainsGrantStands(t *testing.T) {
	db := pgtest.Direct(t)
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, "DROP ROLE IF EXISTS dg_nobody; CREATE ROLE dg_nobody")
	t.Cleanup(func() {
		c := pgtest.Direct(t)
		pgtest.Exec(t, c, "GRANT SELECT, UPDATE ON pgfence.domains TO PUBLIC")
		pgtest.Exec(t, c, "DROP ROLE IF EXISTS dg_nobody")
	})
	may := func() bool {
		var ok bool
		if err := db.QueryRow(ctx, "SELECT pg_catalog.has_table_privilege('dg_nobody', 'pgfence.domains', 'UPDATE')").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !may() {
		t.Fatal("PUBLIC may not update pgfence.domains after setup")
	}
	pgtest.Exec(t, db, "REVOKE SELECT, UPDATE ON pgfence.domains FROM PUBLIC")
	pgtest.Exec(t, db, "COMMENT ON SCHEMA pgfence IS 'an older version'") // setup runs again
	if err := backstop.Setup(ctx, db); err != nil {
		t.Fatal(err)
	}
	if ok, err := backstop.IsSetUp(ctx, db); err != nil || !ok {
		t.Fatalf("set up again: %v, %v", ok, err)
	}
	if may() {
		t.Fatal("setup granted pgfence.domains to PUBLIC again over the DBA's revoke")
	}
}
