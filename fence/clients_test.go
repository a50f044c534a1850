package fence_test

import (
	"bytes"
	osexec "os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// psql's script through pgfence: a stale UPDATE changes nothing, a fresh
// one writes its token, and the probes pgfence adds (the stale flag's
// read) show nothing in psql's output.
func TestPsqlThroughProxy(t *testing.T) {
	psql, err := osexec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not installed: run scripts/ensure-postgres.sh")
	}
	pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS psql_g; CREATE TABLE psql_g (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO psql_g VALUES (1, 'a', 10)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS psql_g") })
	p := pgtest.StartProxy(t, []string{"psql_g"})
	script := "SET fence.token = '9';\nUPDATE psql_g SET v = 'stale' WHERE id = 1;\nSET fence.token = '11';\nUPDATE psql_g SET v = 'fresh' WHERE id = 1 RETURNING v, fence_epoch;\nSELECT v FROM psql_g;\n"
	cmd := osexec.Command(psql, p.URL(), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if want := "SET\nUPDATE 0\nSET\nfresh|11\nUPDATE 1\nfresh\n"; string(out) != want {
		t.Fatalf("psql printed %q, want %q (probe results must not show)", out, want)
	}
}

// COPY beside a guarded table: into and out of a table that is not
// guarded it passes both ways, binary (pgx's CopyFrom) and text; into the
// guarded one it is refused (0A000: pgfence cannot fence its rows), both
// ways of sending it, before any row lands; and the session goes on after
// either refusal, as after a COPY whose data Postgres refuses.
func TestCopyBesideGuardedTable(t *testing.T) {
	guarded := table(t, [3]any{1, "x", 5})
	p := pgtest.StartProxy(t, []string{guarded})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '5'")
	pgtest.Exec(t, c, "DROP TABLE IF EXISTS copy_t; CREATE TABLE copy_t (id int, s text)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_t") })

	n, err := c.CopyFrom(ctx, pgx.Identifier{"copy_t"}, []string{"id", "s"}, pgx.CopyFromRows([][]any{{1, "one"}, {2, "two"}, {3, "three"}}))
	if err != nil || n != 3 {
		t.Fatalf("COPY FROM (binary, pgx) into a table not guarded: %d %v", n, err)
	}
	tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader("4\tfour\n5\tfive\n"), "COPY copy_t FROM STDIN")
	if err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("COPY FROM STDIN (text) into a table not guarded: %v %v", tag, err)
	}
	var out bytes.Buffer
	tag, err = c.PgConn().CopyTo(ctx, &out, "COPY (SELECT * FROM copy_t ORDER BY id) TO STDOUT")
	if err != nil || tag.RowsAffected() != 5 {
		t.Fatalf("COPY TO: %v %v", tag, err)
	}
	if want := "1\tone\n2\ttwo\n3\tthree\n4\tfour\n5\tfive\n"; out.String() != want {
		t.Fatalf("COPY TO gave %q", out.String())
	}

	_, err = c.CopyFrom(ctx, pgx.Identifier{guarded}, []string{"id", "val", "fence_epoch"}, pgx.CopyFromRows([][]any{{2, "binary", int64(0)}}))
	if pe := pgErr(t, err); pe.Code != "0A000" {
		t.Errorf("COPY FROM (binary, pgx) into the guarded table: %s %q, want 0A000", pe.Code, pe.Message)
	}
	_, err = c.PgConn().CopyFrom(ctx, strings.NewReader("3\ttext\t0\n"), "COPY "+guarded+" FROM STDIN")
	if pe := pgErr(t, err); pe.Code != "0A000" {
		t.Errorf("COPY FROM STDIN (text) into the guarded table: %s %q, want 0A000", pe.Code, pe.Message)
	}
	if got := epochs(t, guarded); got != "1:x:5" {
		t.Fatalf("the guarded table after refused COPYs: %s", got)
	}
	if tag := pgtest.Exec(t, c, "SELECT 1"); tag != "SELECT 1" {
		t.Fatal(tag)
	}
	// A COPY whose data Postgres refuses leaves a working session too.
	if _, err := c.PgConn().CopyFrom(ctx, strings.NewReader("not-a-number\tx\n"), "COPY copy_t FROM STDIN"); err == nil {
		t.Fatal("bad COPY data accepted")
	}
	if tag := pgtest.Exec(t, c, "SELECT 1"); tag != "SELECT 1" {
		t.Fatal(tag)
	}
}
