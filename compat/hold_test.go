package compat

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// After DDL or a change of client_encoding, pgfence holds the session's
// next statement until the server has answered what came before (see
// Statement holds in proxy/doc.go). Drivers that pipeline send that next
// statement in the same extended-protocol batch, before the Sync, and
// Postgres answers nothing of a batch before its Sync or a Flush: a hold
// that only waited would wait for ever, and the driver with it. These
// checks pipeline DDL, SET client_encoding and guarded writes in one
// batch through a proxy whose catalog reads after DDL are counted, and
// must complete: holdDeadline is generous, only a deadlock reaches it.

// checkHoldBatch, in one batch or pipeline, with token 10: CREATE TABLE
// T_ddl, INSERT row 105 'hold', DROP TABLE T_ddl, SET client_encoding =
// 'UTF8', UPDATE row 5 to 'hold' with n = n + 1.
const checkHoldBatch = "hold_batch"

// holdDeadline bounds a hold check: the batch takes milliseconds.
const holdDeadline = 15 * time.Second

// newHoldFixture is newFixture with a DDL hook (see
// fence.Policy.SetDDLHook) that counts the catalog reads asked for.
func newHoldFixture(t *testing.T, name string) (*fixture, *atomic.Int32) {
	t.Helper()
	f := newFixture(t, name)
	var reads atomic.Int32
	f.Proxy.Policy.SetDDLHook(func() <-chan struct{} {
		reads.Add(1)
		done := make(chan struct{})
		go close(done) // a read that is done at once
		return done
	})
	pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+f.Table+"_ddl")
	return f, &reads
}

// verifyHold checks what checkHoldBatch left: the rows written with token
// 10, the scratch table dropped, and at least one catalog read asked for
// (so the batch was held at all).
func (f *fixture) verifyHold(t *testing.T, reads *atomic.Int32) {
	t.Helper()
	db := pgtest.Direct(t)
	for _, r := range []struct {
		id, n int
	}{{105, 0}, {5, 1}} {
		var val string
		var n int
		var epoch int64
		err := db.QueryRow(t.Context(), "SELECT val, n, fence_epoch FROM "+f.Table+" WHERE id = $1", r.id).Scan(&val, &n, &epoch)
		if err != nil || val != "hold" || n != r.n || epoch != 10 {
			t.Errorf("row %d of %s: (%q, n %d, epoch %d, %v), want (hold, n %d, epoch 10)", r.id, f.Table, val, n, epoch, err, r.n)
		}
	}
	var gone bool
	if err := db.QueryRow(t.Context(), "SELECT to_regclass($1) IS NULL", f.Table+"_ddl").Scan(&gone); err != nil || !gone {
		t.Errorf("%s_ddl still exists (%v): the batch's DROP did not run", f.Table, err)
	}
	if n := reads.Load(); n == 0 {
		t.Errorf("no catalog read was asked for: the batch's DDL was not held on")
	}
}

// TestHoldPgxBatch sends checkHoldBatch as a pgx.Batch in the modes that
// pipeline it in the extended protocol: pgx's default (CacheStatement:
// Parse and Describe of every statement, Sync, then Bind and Execute of
// each, Sync), and the unnamed-statement modes (Parse, Bind, Describe,
// Execute of each, one Sync). Also pgx's own tracelog test's batch
// (CREATE and DROP of one table), which hung until its deadline.
func TestHoldPgxBatch(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{
		{"CacheStatement", pgx.QueryExecModeCacheStatement},
		{"CacheDescribe", pgx.QueryExecModeCacheDescribe},
		{"DescribeExec", pgx.QueryExecModeDescribeExec},
		{"Exec", pgx.QueryExecModeExec},
	} {
		t.Run(m.name, func(t *testing.T) {
			f, reads := newHoldFixture(t, "hold_pgx_"+strings.ToLower(m.name))
			p := &pgxDriver{f: f, mode: m.mode}
			ctx, cancel := context.WithTimeout(context.Background(), holdDeadline)
			defer cancel()
			c := p.connect(t, ctx, "10")

			b := &pgx.Batch{}
			b.Queue("CREATE TABLE " + f.Table + "_ddl (id bigint)")
			b.Queue("DROP TABLE " + f.Table + "_ddl")
			if err := c.SendBatch(ctx, b).Close(); err != nil {
				t.Fatalf("CREATE and DROP in one batch: %v", err)
			}

			b = &pgx.Batch{}
			b.Queue("CREATE TABLE " + f.Table + "_ddl (id bigint)")
			b.Queue("INSERT INTO "+f.Table+" (id, val) VALUES ($1, $2)", 105, "hold")
			b.Queue("DROP TABLE " + f.Table + "_ddl")
			b.Queue("SET client_encoding = 'UTF8'")
			b.Queue("UPDATE "+f.Table+" SET val = $1, n = n + 1 WHERE id = $2", "hold", 5)
			br := c.SendBatch(ctx, b)
			for i, want := range []int64{0, 1, 0, 0, 1} {
				tag, err := br.Exec()
				if err != nil || tag.RowsAffected() != want {
					t.Fatalf("batch statement %d: %v (%v), want %d rows", i+1, tag, err, want)
				}
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
			f.verifyHold(t, reads)
		})
	}
}

// TestHoldPsycopg3Pipeline runs checkHoldBatch in psycopg 3's pipeline
// mode (see python/psycopg3_compat.py).
func TestHoldPsycopg3Pipeline(t *testing.T) {
	t.Parallel()
	py := python(t, "psycopg", "python3-psycopg")
	f, reads := newHoldFixture(t, "hold_psycopg3")
	f.runOnly(t, []string{checkHoldBatch}, py, "python/psycopg3_compat.py")
	f.verifyHold(t, reads)
}

// TestHoldPgJDBCBatch runs checkHoldBatch as a pgJDBC Statement batch
// (addBatch, executeBatch: every statement pipelined, one Sync; see
// java/PgJDBCCompat.java).
func TestHoldPgJDBCBatch(t *testing.T) {
	t.Parallel()
	hint := installHint + " (apt-get install libpostgresql-jdbc-java default-jdk-headless)"
	javac := requireCommand(t, "javac", hint)
	java := requireCommand(t, "java", hint)
	jar := os.Getenv("COMPAT_PGJDBC_JAR")
	if jar == "" {
		jar = "/usr/share/java/postgresql.jar"
	}
	if _, err := os.Stat(jar); err != nil {
		t.Fatalf("pgJDBC jar: %v: %s", err, hint)
	}
	classes := t.TempDir()
	if out, err := exec.Command(javac, "-cp", jar, "-d", classes, filepath.Join("java", "PgJDBCCompat.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	f, reads := newHoldFixture(t, "hold_pgjdbc")
	f.runOnly(t, []string{checkHoldBatch},
		java, "-cp", strings.Join([]string{classes, jar}, string(os.PathListSeparator)), "PgJDBCCompat")
	f.verifyHold(t, reads)
}
