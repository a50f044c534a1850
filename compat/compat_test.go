// Package compat checks that real Postgres client drivers work through
// pgfence: each test creates its own tables straight on Postgres, starts a
// proxy guarding one of them, and runs a driver's checks through the proxy.
//
// The drivers other than pgx run as scripts (python/, node/, java/, psql/,
// pgbench/) that print one "ok CHECK" line per check that passed and
// "FAIL CHECK: why" for one that did not, and exit non-zero if any failed.
// scripts/install-compat-deps.sh installs them; a driver that is missing
// fails its test with the install step to run.
package compat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// installHint is the step that installs every driver of the suite.
const installHint = "run scripts/install-compat-deps.sh (or `make compat`)"

// The checks every driver runs where it can, in the words of the scripts.
const (
	checkTxCommit     = "tx_commit"       // INSERT in a committed transaction: row 100 stays, stamped with token 10
	checkTxRollback   = "tx_rollback"     // INSERT (101) and UPDATE (3) rolled back: nothing stays
	checkParams       = "params"          // bound parameters in a SELECT and in a guarded UPDATE of row 4
	checkPrepared     = "prepared_reuse"  // one UPDATE of row 2 (n = n + 1) prepared once, executed 20 times
	checkError        = "error_recovery"  // SELECT 1/0 fails with 22012, the connection still works
	checkCopyIn       = "copy_in"         // COPY FROM STDIN of 3 rows into the unguarded table
	checkCopyOut      = "copy_out"        // COPY of the guarded table TO STDOUT
	checkListenNotify = "listen_notify"   // a NOTIFY from another connection arrives through the proxy
	checkCancel       = "cancel"          // the driver's cancel API stops SELECT pg_sleep(30): 57014, < 10 s
	checkFenced       = "fenced_write"    // B (token 43) updates row 1: 1 row; then A (token 42): 0 rows
	checkPipeline     = "pipeline"        // pipelined: UPDATE row 6 (1 row), stale UPDATE row 7 (0), INSERT 102
	checkCleanClose   = "clean_close"     // closing every connection (Terminate) raises no error in the driver
	checkTokenSet     = "token_set"       // plain SETs of the token (pgfence answers them): INSERT 103 with 11, stale UPDATE with 9: 0 rows, then 11 again
	checkTokenLocal   = "token_set_local" // the same with SET LOCAL in three transactions: INSERT 104 with 12, stale UPDATE with 9, then 12 again
)

// allChecks is the list for a driver that supports every common check.
var allChecks = []string{
	checkTxCommit, checkTxRollback, checkParams, checkPrepared, checkError,
	checkCopyIn, checkCopyOut, checkListenNotify, checkCancel, checkFenced,
	checkTokenSet, checkTokenLocal,
}

// fixture is one driver's tables and the proxy in front of them.
type fixture struct {
	Name    string // driver name, part of every object name
	Table   string // guarded: id int PK, val text, n int, fence_epoch bigint
	Plain   string // unguarded: id int, val text (COPY FROM target)
	Channel string // LISTEN/NOTIFY channel
	Proxy   *pgtest.Proxy
	// SetsAnswered is how many of token_set's three SETs the driver sends
	// in a form pgfence answers itself (all but postgres.js, which
	// prepares a text on first use), and LocalSetsAnswered the same of
	// token_set_local's three SET LOCALs (pgJDBC sends none so: it sends
	// a transaction's BEGIN in one batch with its first statement).
	SetsAnswered, LocalSetsAnswered int
	// answeredBase is pgfence_token_sets_answered_total before the check
	// being verified ran (see answeredChecks).
	answeredBase float64
}

// answeredChecks are the checks that count the SETs pgfence answers: each
// runs alone (see runScript), so that the count is its own.
var answeredChecks = []string{checkTokenSet, checkTokenLocal}

// newFixture creates compat_NAME (guarded, rows 1..10 with val 'init' at
// epoch 0) and compat_NAME_plain straight on Postgres, and starts a proxy
// guarding compat_NAME.
func newFixture(t *testing.T, name string, edit ...func(*proxy.Config, *fence.Config)) *fixture {
	t.Helper()
	f := &fixture{
		Name:              name,
		Table:             "compat_" + name,
		Plain:             "compat_" + name + "_plain",
		Channel:           "compat_" + name + "_events",
		SetsAnswered:      3,
		LocalSetsAnswered: 3,
	}
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s`, f.Table, f.Plain))
	pgtest.Exec(t, db, fmt.Sprintf(`CREATE TABLE %s (
		id int PRIMARY KEY,
		val text NOT NULL,
		n int NOT NULL DEFAULT 0,
		fence_epoch bigint NOT NULL DEFAULT 0)`, f.Table))
	pgtest.Exec(t, db, fmt.Sprintf(`INSERT INTO %s (id, val) SELECT i, 'init' FROM generate_series(1, 10) i`, f.Table))
	pgtest.Exec(t, db, fmt.Sprintf(`CREATE TABLE %s (id int, val text)`, f.Plain))
	f.Proxy = pgtest.StartProxy(t, []string{f.Table}, edit...)
	return f
}

// Env is what a driver script is told: where the proxy and Postgres are
// and which objects are its own.
func (f *fixture) Env() []string {
	direct := pgtest.Server()
	host, port, _ := net.SplitHostPort(f.Proxy.Addr)
	proxyURL := f.Proxy.URL()
	// The URL's TLS parameters alone, for drivers given host and port.
	ssl := url.Values{"sslmode": {"disable"}}
	if u, err := url.Parse(proxyURL); err == nil && u.Query().Get("sslmode") != "" {
		ssl = url.Values{}
		for _, k := range []string{"sslmode", "sslrootcert"} {
			if v := u.Query().Get(k); v != "" {
				ssl.Set(k, v)
			}
		}
	}
	return append(os.Environ(),
		"COMPAT_PROXY_URL="+proxyURL,
		"COMPAT_PROXY_SSL="+ssl.Encode(),
		"COMPAT_PROXY_HOST="+host,
		"COMPAT_PROXY_PORT="+port,
		"COMPAT_DIRECT_URL="+pgtest.DirectURL(),
		"COMPAT_DIRECT_HOST="+direct.Host,
		fmt.Sprintf("COMPAT_DIRECT_PORT=%d", direct.Port),
		"COMPAT_USER="+direct.User,
		"COMPAT_DB=postgres",
		"COMPAT_TABLE="+f.Table,
		"COMPAT_PLAIN_TABLE="+f.Plain,
		"COMPAT_CHANNEL="+f.Channel,
		"PGCONNECT_TIMEOUT=10",
	)
}

var okLine = regexp.MustCompile(`(?m)^ok (\S+)\s*$`)

// runScript runs a driver script (argv, in the compat directory) against
// f, logs its output, and reports the checks that printed "ok". Every name
// in want must be among them and the script must exit 0; each check that
// passed is then verified straight on Postgres.
//
// The checks in answeredChecks run after the others, each in a run of the
// script of its own (COMPAT_ONLY).
func (f *fixture) runScript(t *testing.T, want []string, argv ...string) {
	t.Helper()
	var rest, alone []string
	for _, c := range want {
		if slices.Contains(answeredChecks, c) {
			alone = append(alone, c)
		} else {
			rest = append(rest, c)
		}
	}
	f.runOnly(t, rest, argv...)
	for _, c := range alone {
		f.answeredBase = f.answered(t)
		f.runOnly(t, []string{c}, argv...)
	}
}

// runOnly is runScript for the checks want only.
func (f *fixture) runOnly(t *testing.T, want []string, argv ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(f.Env(), "COMPAT_ONLY="+strings.Join(want, ","))
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s (%.1fs)\n--- stdout\n%s--- stderr\n%s", strings.Join(argv, " "), time.Since(start).Seconds(), stdout.String(), stderr.String())
	if ctx.Err() != nil {
		t.Errorf("%s did not finish within 3 minutes", argv[0])
	} else if err != nil {
		t.Errorf("%s: %v", strings.Join(argv, " "), err)
	}
	passed := map[string]bool{}
	for _, m := range okLine.FindAllStringSubmatch(stdout.String(), -1) {
		passed[m[1]] = true
	}
	for _, name := range want {
		if !passed[name] {
			t.Errorf("check %s did not print ok", name)
			continue
		}
		f.verify(t, name)
	}
}

// verify checks, straight on Postgres, the data a passed check left behind.
func (f *fixture) verify(t *testing.T, check string) {
	t.Helper()
	db := pgtest.Direct(t)
	ctx := context.Background()
	row := func(id int) (val string, n int, epoch int64, found bool) {
		err := db.QueryRow(ctx, fmt.Sprintf(`SELECT val, n, fence_epoch FROM %s WHERE id = $1`, f.Table), id).Scan(&val, &n, &epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", 0, 0, false
		}
		if err != nil {
			t.Fatalf("reading row %d of %s: %v", id, f.Table, err)
		}
		return val, n, epoch, true
	}
	expectRow := func(id int, wantVal string, wantEpoch int64) {
		t.Helper()
		val, _, epoch, found := row(id)
		if !found || val != wantVal || epoch != wantEpoch {
			t.Errorf("%s: row %d of %s is (%q, epoch %d, found %v), want (%q, epoch %d)", check, id, f.Table, val, epoch, found, wantVal, wantEpoch)
		}
	}
	switch check {
	case checkTxCommit:
		expectRow(100, "committed", 10)
	case checkTxRollback:
		if _, _, _, found := row(101); found {
			t.Errorf("%s: row 101 of %s exists after ROLLBACK", check, f.Table)
		}
		expectRow(3, "init", 0)
	case checkParams:
		expectRow(4, "param", 10)
	case checkPrepared:
		if _, n, epoch, _ := row(2); n != 20 || epoch != 10 {
			t.Errorf("%s: row 2 of %s has n=%d fence_epoch=%d, want n=20 fence_epoch=10 (epoch 0: the UPDATE reached Postgres unfenced)", check, f.Table, n, epoch)
		}
	case checkCopyIn:
		var count int
		if err := db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s`, f.Plain)).Scan(&count); err != nil || count != 3 {
			t.Errorf("%s: %s has %d rows (%v), want 3", check, f.Plain, count, err)
		}
	case checkFenced:
		expectRow(1, "B", 43)
	case checkTokenSet:
		if _, n, epoch, _ := row(103); n != 1 || epoch != 11 {
			t.Errorf("%s: row 103 of %s has n=%d fence_epoch=%d, want n=1 fence_epoch=11", check, f.Table, n, epoch)
		}
		expectRow(103, "tokenset", 11)
		f.expectAnswered(t, check, f.SetsAnswered)
	case checkTokenLocal:
		if _, n, _, _ := row(104); n != 1 {
			t.Errorf("%s: row 104 of %s has n=%d, want 1", check, f.Table, n)
		}
		expectRow(104, "tokenlocal", 12)
		f.expectAnswered(t, check, f.LocalSetsAnswered)
	case checkPipeline:
		expectRow(6, "pipeline", 10)
		expectRow(7, "B", 43)
		expectRow(102, "pipeline", 10)
	}
}

// tokenSetStep is one statement of token_set: what a driver sends and the
// rows it must report.
type tokenSetStep struct {
	sql  string
	rows int64
}

// tokenSetSteps are token_set's statements on f's table, sent without
// arguments; a driver then updates row 103 with token 11 again, bound.
func (f *fixture) tokenSetSteps() []tokenSetStep {
	return []tokenSetStep{
		{"SET fence.token = '11'", 0},
		{fmt.Sprintf("INSERT INTO %s (id, val) VALUES (103, 'tokenset')", f.Table), 1},
		{"SET fence.token = '9'", 0},
		{fmt.Sprintf("UPDATE %s SET val = 'stale' WHERE id = 103", f.Table), 0},
		{"SET fence.token = '11'", 0},
	}
}

// tokenLocalStep is one transaction of token_set_local: the token its
// SET LOCAL sets, the statement after it and its values, and the rows it
// must report.
type tokenLocalStep struct {
	token, sql string
	args       []any
	rows       int64
}

// tokenLocalSteps are token_set_local's transactions on f's table.
func (f *fixture) tokenLocalSteps() []tokenLocalStep {
	return []tokenLocalStep{
		{"12", fmt.Sprintf("INSERT INTO %s (id, val) VALUES (104, 'tokenlocal')", f.Table), nil, 1},
		{"9", fmt.Sprintf("UPDATE %s SET val = 'stale' WHERE id = 104", f.Table), nil, 0},
		{"12", fmt.Sprintf("UPDATE %s SET n = n + 1 WHERE id = $1", f.Table), []any{104}, 1},
	}
}

func (f *fixture) answered(t *testing.T) float64 {
	return f.Proxy.Counter(t, "pgfence_token_sets_answered_total")
}

// expectAnswered checks that pgfence answered want of the check's SETs of
// the token itself through the event loop, and none through the goroutine
// relay, which forwards every one.
func (f *fixture) expectAnswered(t *testing.T, check string, want int) {
	t.Helper()
	if os.Getenv("PGFENCE_TEST_RELAY") == "goroutines" {
		want = 0
	}
	answered := f.answered(t) - f.answeredBase
	t.Logf("%s: pgfence answered %v of %s's SETs of the token", f.Name, answered, check)
	if answered != float64(want) {
		t.Errorf("%s: pgfence answered %v SETs of the token, want %d: the driver's SET reached Postgres, or one the check did not send was counted", check, answered, want)
	}
}

// requireCommand fails the test unless name is an executable on PATH (or a
// path to one), and returns its path.
func requireCommand(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (%v): %s", name, err, hint)
	}
	return p
}

// python is Debian's interpreter, which the python3-* driver packages are
// installed for (a python3 from pyenv first on PATH would not see them);
// COMPAT_PYTHON overrides it.
func python(t *testing.T, module, pkg string) string {
	t.Helper()
	py := os.Getenv("COMPAT_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	requireCommand(t, py, installHint+" (apt-get install python3)")
	if out, err := exec.Command(py, "-c", "import "+module).CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import %s: %v\n%s\n%s (apt-get install %s)", py, module, err, out, installHint, pkg)
	}
	return py
}

// nodeModules fails the test unless compat/node's packages are installed.
func nodeModules(t *testing.T, pkgs ...string) string {
	t.Helper()
	node := requireCommand(t, "node", installHint+" (apt-get install nodejs npm)")
	for _, pkg := range pkgs {
		if _, err := os.Stat(filepath.Join("node", "node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("node package %s is not installed in compat/node/node_modules: %s (npm ci in compat/node)", pkg, installHint)
		}
	}
	return node
}
