package backstop_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

// tableName is a table name of the test's own.
func tableName(t *testing.T, suffix string) string {
	return strings.ToLower(strings.NewReplacer("/", "_", " ", "_", "-", "_").Replace(t.Name())) + suffix
}

// guarded creates a table with an epoch column and rows (id, val, epoch),
// dropped when the test ends.
func guarded(t *testing.T, name string, rows ...[3]any) string {
	t.Helper()
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s CASCADE; CREATE TABLE %[1]s (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)", name))
	for _, r := range rows {
		pgtest.Exec(t, db, fmt.Sprintf("INSERT INTO %s VALUES ($1, $2, $3)", name), r[0], r[1], r[2])
	}
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+name+" CASCADE") })
	return name
}

// install puts the backstop on the public tables named and fails the test
// unless every one is OK.
func install(t *testing.T, o backstop.Options, tables ...string) *backstop.Report {
	t.Helper()
	var gs []sqlrewrite.Guard
	for _, tb := range tables {
		gs = append(gs, sqlrewrite.Guard{Schema: "public", Table: tb, Column: "fence_epoch"})
	}
	return installGuards(t, o, gs...)
}

func installGuards(t *testing.T, o backstop.Options, gs ...sqlrewrite.Guard) *backstop.Report {
	t.Helper()
	o.Replace = true // each test's configuration is its own, as 'pgfence init' records one
	r, err := backstop.Reconcile(ctx, pgtest.Direct(t), gs, o, backstop.Install)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range r.Tables {
		if !tb.OK {
			t.Fatalf("backstop not installed: %s", tb.Problem)
		}
	}
	return r
}

// session opens a direct connection with token tok ("" for none).
func session(t *testing.T, tok string) *pgx.Conn {
	t.Helper()
	c := pgtest.Direct(t)
	if tok != "" {
		pgtest.Exec(t, c, "SET fence.token = '"+tok+"'")
	}
	return c
}

// rowOf reads (val, epoch) of row id.
func rowOf(t *testing.T, tbl string, id int) (string, int64) {
	t.Helper()
	var val string
	var epoch int64
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT val, fence_epoch FROM "+tbl+" WHERE id = $1", id).Scan(&val, &epoch); err != nil {
		t.Fatalf("reading row %d of %s: %v", id, tbl, err)
	}
	return val, epoch
}

func code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
