package compat

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgbouncer"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

func TestPsycopg2(t *testing.T) {
	t.Parallel()
	py := python(t, "psycopg2", "python3-psycopg2")
	f := newFixture(t, "psycopg2")
	f.runScript(t, allChecks, py, "python/psycopg2_compat.py")
}

func TestPsycopg3(t *testing.T) {
	t.Parallel()
	py := python(t, "psycopg", "python3-psycopg")
	f := newFixture(t, "psycopg3")
	f.runScript(t, append(allChecks, checkPipeline), py, "python/psycopg3_compat.py")
}

func TestAsyncpg(t *testing.T) {
	t.Parallel()
	py := python(t, "asyncpg", "python3-asyncpg")
	f := newFixture(t, "asyncpg")
	f.runScript(t, allChecks, py, "python/asyncpg_compat.py")
}

func TestNodePostgres(t *testing.T) {
	t.Parallel()
	node := nodeModules(t, "pg", "pg-copy-streams")
	f := newFixture(t, "node_pg")
	f.runScript(t, append(allChecks, checkCleanClose), node, "node/pg_compat.js")
}

func TestPostgresJS(t *testing.T) {
	t.Parallel()
	node := nodeModules(t, "postgres")
	f := newFixture(t, "postgresjs")
	f.SetsAnswered, f.LocalSetsAnswered = 1, 1
	checks := append(allChecks, checkPipeline)
	if pgtest.TLS() {
		// Over TLS, postgres.js's query.canceller() never resolves (the
		// query is cancelled), straight to Postgres too, so the script
		// would wait for ever: its cancel check runs on plain sessions only.
		t.Log("postgres.js over TLS: the cancel check is left out (its canceller never resolves over TLS, against Postgres too)")
		checks = slices.DeleteFunc(slices.Clone(checks), func(c string) bool { return c == checkCancel })
	}
	f.runScript(t, checks, node, "node/postgresjs_compat.js")
}

// pgJDBC's own checks beyond the common ones.
const (
	checkServerPrepared = "server_prepared" // past prepareThreshold: server-prepared, and a stale execution writes 0 rows
	checkBatch          = "batch"           // addBatch/executeBatch: [1 1 1], then stale on row 9: [1 0 1]
)

// TestPgJDBC compiles java/PgJDBCCompat.java against Debian's pgJDBC jar
// into a temporary directory and runs it.
func TestPgJDBC(t *testing.T) {
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
	f := newFixture(t, "pgjdbc")
	f.LocalSetsAnswered = 0 // see fixture.LocalSetsAnswered
	f.runScript(t, append(allChecks, checkServerPrepared, checkBatch),
		java, "-cp", strings.Join([]string{classes, jar}, string(os.PathListSeparator)), "PgJDBCCompat")
	f.verifyJDBC(t)
}

// verifyJDBC checks the rows the pgJDBC-only checks wrote.
func (f *fixture) verifyJDBC(t *testing.T) {
	t.Helper()
	type row struct {
		val   string
		n     int
		epoch int64
	}
	want := map[int]row{
		7:  {"B", 10, 43},     // server_prepared: 10 executions at token 10, then B; the stale 11th changed nothing
		8:  {"batch2", 0, 10}, // batch
		9:  {"B", 0, 43},      // batch: the stale second batch left B's row alone
		10: {"batch2", 0, 10}, // batch
	}
	db := pgtest.Direct(t)
	for id, w := range want {
		var got row
		err := db.QueryRow(t.Context(), "SELECT val, n, fence_epoch FROM "+f.Table+" WHERE id = $1", id).Scan(&got.val, &got.n, &got.epoch)
		if err != nil || got != w {
			t.Errorf("row %d of %s: %+v (%v), want %+v", id, f.Table, got, err, w)
		}
	}
}

// psql's checks; it has no bound parameters before psql 16 (\bind).
var psqlChecks = []string{
	checkTxCommit, checkTxRollback, checkPrepared, checkError,
	checkCopyIn, checkCopyOut, checkListenNotify, checkCancel, checkFenced, checkTokenSet, checkTokenLocal,
}

func TestPsql(t *testing.T) {
	t.Parallel()
	requireCommand(t, "psql", installHint+" (apt-get install postgresql-client)")
	bash := requireCommand(t, "bash", "apt-get install bash")
	f := newFixture(t, "psql")
	f.runScript(t, psqlChecks, bash, "psql/psql_compat.sh")
}

// psycopg 3 through pgfence behind a transaction-pooling PgBouncer with
// one server connection (see python/psycopg3_pooled.py).
func TestPsycopg3TransactionPooling(t *testing.T) {
	t.Parallel()
	pgtest.Need(t) // the PgBouncer needs the package's Postgres before the fixture does
	py := python(t, "psycopg", "python3-psycopg")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: pgtest.Server().Addr(), PoolMode: "transaction", PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	f := newFixture(t, "psycopg3_pooled", func(pc *proxy.Config, fc *fence.Config) {
		pc.Upstream, pc.UpstreamTLS = b.Addr(), nil
		pc.GoroutineRelay = false // transaction pooling needs the event loop
		pc.TransactionPooling, pc.TokenSetting = true, "fence.token"
		fc.TransactionPooling = true
	})
	f.runOnly(t, []string{"pooled_interleaved", "pooled_set_local", "pooled_no_token"}, py, "python/psycopg3_pooled.py")
	db := pgtest.Direct(t)
	for _, want := range []struct {
		id    int
		val   string
		epoch int64
	}{{1, "a4", 30}, {2, "b4", 25}, {3, "local", 40}, {4, "init", 0}} {
		var val string
		var epoch int64
		if err := db.QueryRow(context.Background(), "SELECT val, fence_epoch FROM "+f.Table+" WHERE id = $1", want.id).Scan(&val, &epoch); err != nil {
			t.Fatal(err)
		}
		if val != want.val || epoch != want.epoch {
			t.Errorf("row %d is (%q, %d), want (%q, %d)", want.id, val, epoch, want.val, want.epoch)
		}
	}
}
