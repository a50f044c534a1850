// Package container_test checks pgfence's container image (the Dockerfile,
// built by `make image` as localhost/pgfence:latest) and docker-compose.yml,
// with podman, for real:
//
//   - TestImage: the image runs `pgfence version`, as a non-root user.
//   - TestPod: a pod with localhost/postgres:15 and pgfence, which reaches
//     Postgres over the pod's localhost (password from the environment, and
//     required there: initdb --auth-host=scram-sha-256); from this host with
//     psql through pgfence's published port, a write with token 5 goes
//     through and a stale one with token 3 changes nothing; Postgres itself
//     shows the first write, and pgfence's published metrics count the
//     fenced one.
//   - TestCompose: the same check on docker-compose.yml as written, run by
//     podman-compose with local images and free ports, then `down`.
//   - TestComposeStop: `podman stop` of the pgfence that docker-compose.yml
//     made, while two transactions are open through it: one commits during
//     the drain, the other outlasts it and is rolled back, and pgfence exits
//     by itself (0), before podman's stop timeout would kill it.
//
// PGFENCE_IMAGE names the pgfence image to test (default
// localhost/pgfence:latest, what `make image` builds).
//
// Podman, podman-compose and the base images come from
// scripts/install-podman.sh and scripts/build-base-images.sh; `make test`
// runs both and `make image` before the tests. Without podman the tests
// fail, unless PGFENCE_TEST_CONTAINERS=0 says to skip them (for `go test
// ./...` on a development machine without podman). Each run uses names of
// its own and removes what it made.
package container_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/pgfence/pgfence/internal/pgserver"
)

// pgfenceImage is the image under test: PGFENCE_IMAGE, as for
// docker-compose.yml, else what `make image` tags latest.
var pgfenceImage = cmp.Or(os.Getenv("PGFENCE_IMAGE"), "localhost/pgfence:latest")

const (
	// imageMetricsPort is where the image's pgfence serves /metrics,
	// /healthz and /readyz (PGFENCE_METRICS_LISTEN).
	imageMetricsPort = 16432
	postgresImage    = "localhost/postgres:15"
	// The init script docker-compose.yml gives Postgres: table accounts
	// with a fence_epoch column, rows 1 and 2.
	initSQL = "testdata/compose-init.sql"

	installHint = "install podman and podman-compose with `bash scripts/install-podman.sh` " +
		"(or set PGFENCE_TEST_CONTAINERS=0 to skip the container tests)"
)

// podman finds podman, failing the test (not skipping it) when it is
// missing, unless PGFENCE_TEST_CONTAINERS=0.
func podman(t *testing.T) string {
	t.Helper()
	if os.Getenv("PGFENCE_TEST_CONTAINERS") == "0" {
		t.Skip("PGFENCE_TEST_CONTAINERS=0: skipping the container tests")
	}
	p, err := exec.LookPath("podman")
	if err != nil {
		t.Fatalf("podman not found on PATH: %s", installHint)
	}
	return p
}

// requireImage fails the test if the image is not in podman's storage.
func requireImage(t *testing.T, podmanPath, image, how string) {
	t.Helper()
	if err := exec.Command(podmanPath, "image", "exists", image).Run(); err != nil {
		t.Fatalf("image %s not found (podman image exists: %v): %s", image, err, how)
	}
}

func requireImages(t *testing.T, podmanPath string) {
	t.Helper()
	requireImage(t, podmanPath, pgfenceImage, "build it with `make image` (make test does)")
	requireImage(t, podmanPath, postgresImage, "make it with `bash scripts/build-base-images.sh` (make image does)")
}

// repoRoot is the checkout's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "docker-compose.yml")); err != nil {
		t.Fatalf("no docker-compose.yml at the checkout's top (%s): %v", root, err)
	}
	return root
}

// psqlPath finds the psql client: on PATH, else beside the Postgres server
// binaries (internal/pgserver's search, PGFENCE_PG_BINDIR first).
func psqlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	if dir, err := pgserver.FindBinDir(); err == nil {
		if p := filepath.Join(dir, "psql"); fileExists(p) {
			return p
		}
	}
	t.Fatal("psql not found on PATH or beside the Postgres server binaries: bash scripts/ensure-postgres.sh installs it")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// uniqueName is a name no other run uses: prefix, pid, random suffix.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s-%d-%s", prefix, os.Getpid(), hex.EncodeToString(b))
}

// password is a fresh random password; it goes to podman and psql only
// through their environment.
func password(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// freePorts returns n TCP ports free on 127.0.0.1 right now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// runner runs commands with a deadline, in a directory, with extra
// environment variables (never passwords in argv).
type runner struct {
	t   *testing.T
	dir string
	env []string
}

func (r runner) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), r.env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// output runs the command and returns its combined output, or an error
// that includes it.
func (r runner) output(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := r.cmd(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// must runs the command and fails the test if it fails.
func (r runner) must(timeout time.Duration, name string, args ...string) string {
	r.t.Helper()
	out, err := r.output(timeout, name, args...)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// logs prints the containers' logs into the test's log, for a failure.
func logs(t *testing.T, podmanPath string, containers ...string) {
	t.Helper()
	for _, c := range containers {
		out, _ := exec.Command(podmanPath, "logs", "--tail", "40", c).CombinedOutput()
		t.Logf("podman logs --tail 40 %s:\n%s", c, out)
	}
}

// waitReady waits for pgfence's /readyz on the metrics port to say 200.
func waitReady(t *testing.T, metricsPort int, timeout time.Duration, onFail func()) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", metricsPort)
	client := &http.Client{Timeout: 3 * time.Second}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("GET %s: 200 %s", url, strings.TrimSpace(string(body)))
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	onFail()
	t.Fatalf("pgfence's %s did not say 200 within %v; last: %s", url, timeout, last)
}

// staleWriteCheck writes through pgfence on 127.0.0.1:port as two lease
// holders, token 5 then the stale token 3, with psql from this host.
func staleWriteCheck(t *testing.T, r runner, port int) {
	t.Helper()
	psql := psqlPath(t)
	conn := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=10", port)
	write := func(token string, balance int) string {
		out := r.must(time.Minute, psql, "-X", "-v", "ON_ERROR_STOP=1", conn,
			"-c", fmt.Sprintf("SET fence.token = '%s'", token),
			"-c", fmt.Sprintf("UPDATE accounts SET balance = %d WHERE id = 1", balance))
		return strings.TrimSpace(out)
	}
	if got := write("5", 1); got != "SET\nUPDATE 1" {
		t.Fatalf("token 5 through pgfence: psql said %q, want SET and UPDATE 1", got)
	}
	if got := write("3", 2); got != "SET\nUPDATE 0" {
		t.Fatalf("stale token 3 through pgfence: psql said %q, want SET and UPDATE 0 (the stale write fenced)", got)
	}
}

// checkRow reads row 1 of accounts straight from Postgres in its container
// (psql over its Unix socket): the first write stands.
func checkRow(t *testing.T, r runner, podmanPath, container string) {
	t.Helper()
	out := r.must(time.Minute, podmanPath, "exec", container,
		"psql", "-X", "-At", "-U", "postgres", "-d", "postgres",
		"-c", "SELECT balance, fence_epoch FROM accounts WHERE id = 1")
	if got := strings.TrimSpace(out); got != "1|5" {
		t.Fatalf("row 1 in Postgres: balance|fence_epoch = %q, want 1|5 (token 5's write stands, token 3's fenced)", got)
	}
}

var rejectLine = regexp.MustCompile(`^fencing_reject_total\{([^}]*)\} (\S+)$`)
var tableLabel = regexp.MustCompile(`(?:^|,)table="([^"]*)"`)

// checkRejects reads pgfence's /metrics on this host's metricsPort: one
// stale write fenced on table accounts. The label is the schema-qualified
// name once the catalog is read (public.accounts), the name as guarded
// before; both count.
func checkRejects(t *testing.T, metricsPort int) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	var total float64
	var series []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		m := rejectLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tbl := tableLabel.FindStringSubmatch(m[1])
		if tbl == nil || (tbl[1] != "accounts" && tbl[1] != "public.accounts") {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, sc.Text(), err)
		}
		total += v
		series = append(series, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if total != 1 {
		t.Fatalf("fencing_reject_total for table accounts: %v, want 1; series:\n%s", total, strings.Join(series, "\n"))
	}
	t.Logf("pgfence's metrics on the published port:\n%s", strings.Join(series, "\n"))
}

// TestImage: the image runs, says its version, and is not root.
func TestImage(t *testing.T) {
	t.Parallel()
	pm := podman(t)
	requireImage(t, pm, pgfenceImage, "build it with `make image` (make test does)")
	r := runner{t: t}
	out := r.must(time.Minute, pm, "run", "--rm", pgfenceImage, "version")
	if !strings.HasPrefix(out, "pgfence ") {
		t.Fatalf("podman run %s version: %q", pgfenceImage, out)
	}
	t.Logf("%s: %s", pgfenceImage, strings.TrimSpace(out))
	user := strings.TrimSpace(r.must(time.Minute, pm, "image", "inspect", "--format", "{{.Config.User}}", pgfenceImage))
	if user == "" || user == "0" || user == "root" || strings.HasPrefix(user, "0:") || strings.HasPrefix(user, "root:") {
		t.Fatalf("%s runs as user %q, want a non-root user", pgfenceImage, user)
	}

	// OCI labels of its own: the version and commit it runs, its source
	// and license; none of the base image's stands for it.
	var labels map[string]string
	if err := json.Unmarshal([]byte(r.must(time.Minute, pm, "image", "inspect", "--format", "{{json .Labels}}", pgfenceImage)), &labels); err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out) // pgfence VERSION commit COMMIT GOVERSION
	if len(f) < 4 || f[2] != "commit" {
		t.Fatalf("pgfence version: %q", out)
	}
	for key, want := range map[string]string{
		"org.opencontainers.image.title":    "pgfence",
		"org.opencontainers.image.version":  f[1],
		"org.opencontainers.image.revision": f[3],
		"org.opencontainers.image.source":   "https://github.com/pgfence/pgfence",
		"org.opencontainers.image.licenses": "Apache-2.0",
	} {
		if labels[key] != want {
			t.Errorf("%s: label %s = %q, want %q", pgfenceImage, key, labels[key], want)
		}
	}
	if d := labels["org.opencontainers.image.description"]; !strings.Contains(d, "fencing") {
		t.Errorf("%s: label org.opencontainers.image.description = %q, not pgfence's own", pgfenceImage, d)
	}
}

// TestPod: Postgres and pgfence in one pod; the stale write is fenced.
func TestPod(t *testing.T) {
	t.Parallel()
	pm := podman(t)
	requireImages(t, pm)
	root := repoRoot(t)
	pw := password(t)
	r := runner{t: t, dir: root, env: []string{"POSTGRES_PASSWORD=" + pw, "PGPASSWORD=" + pw}}

	pod := uniqueName("pgfence-test-pod")
	ports := freePorts(t, 2)
	port, metricsPort := ports[0], ports[1]
	r.must(time.Minute, pm, "pod", "create", "--name", pod,
		"-p", fmt.Sprintf("127.0.0.1:%d:6432", port),
		"-p", fmt.Sprintf("127.0.0.1:%d:%d", metricsPort, imageMetricsPort))
	t.Cleanup(func() {
		if out, err := exec.Command(pm, "pod", "rm", "-f", "-t", "2", pod).CombinedOutput(); err != nil {
			t.Errorf("podman pod rm -f %s: %v\n%s", pod, err, out)
		}
	})

	pgName, pgfName := pod+"-postgres", pod+"-pgfence"
	// The password reaches the containers by name only (-e NAME takes the
	// value from podman's environment). Connections over the pod's
	// localhost need it too: --auth-host=scram-sha-256.
	r.must(2*time.Minute, pm, "run", "-d", "--pod", pod, "--name", pgName,
		"-e", "POSTGRES_PASSWORD",
		"-e", "POSTGRES_INITDB_ARGS=--auth-host=scram-sha-256",
		"--mount", "type=tmpfs,destination=/var/lib/postgresql/data",
		"-v", filepath.Join(root, initSQL)+":/docker-entrypoint-initdb.d/init.sql:ro",
		postgresImage)
	r.must(2*time.Minute, pm, "run", "-d", "--pod", pod, "--name", pgfName,
		"-e", "PGFENCE_UPSTREAM=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"-e", "PGFENCE_GUARD=accounts",
		"-e", "PGPASSWORD",
		pgfenceImage)

	waitReady(t, metricsPort, 90*time.Second, func() { logs(t, pm, pgName, pgfName) })
	staleWriteCheck(t, r, port)
	checkRow(t, r, pm, pgName)
	checkRejects(t, metricsPort)

	// Neither password is on a command line: not pgfence's, not podman's
	// record of how the containers were made.
	for _, c := range []string{pgName, pgfName} {
		out := r.must(time.Minute, pm, "inspect", "--format", "{{.Config.Cmd}} {{.Config.Entrypoint}} {{.Args}}", c)
		if strings.Contains(out, pw) {
			t.Errorf("the password is on %s's command line: %s", c, out)
		}
	}
}

// composeRun is docker-compose.yml as written, brought up by podman-compose
// under a project name of its own, with local images and free ports; what
// is left of it is removed when the test ends.
type composeRun struct {
	t                 *testing.T
	r                 runner
	pm, compose, root string
	project, pw       string
	port, metricsPort int
	pgName, pgfName   string
}

// upCompose runs `podman-compose up -d` and waits for pgfence's /readyz.
func upCompose(t *testing.T) *composeRun {
	t.Helper()
	pm := podman(t)
	compose, err := exec.LookPath("podman-compose")
	if err != nil {
		t.Fatalf("podman-compose not found on PATH: %s", installHint)
	}
	requireImages(t, pm)
	c := &composeRun{t: t, pm: pm, compose: compose, root: repoRoot(t), pw: password(t)}
	ports := freePorts(t, 2)
	c.port, c.metricsPort = ports[0], ports[1]
	// Project names: lower case letters, digits, - and _.
	c.project = strings.ReplaceAll(uniqueName("pgfencetest"), "-", "_")
	c.r = runner{t: t, dir: c.root, env: []string{
		"POSTGRES_PASSWORD=" + c.pw,
		"PGPASSWORD=" + c.pw,
		"POSTGRES_IMAGE=" + postgresImage,
		"PGFENCE_IMAGE=" + pgfenceImage,
		// Only used if the image had to be built (it does not: it exists).
		"BUILD_IMAGE=localhost/golang:1.26-bookworm",
		"RUNTIME_IMAGE=localhost/debian:bookworm-slim",
		"BUILDAH_ISOLATION=chroot",
		"PGFENCE_PORT=" + strconv.Itoa(c.port),
		"PGFENCE_METRICS_PORT=" + strconv.Itoa(c.metricsPort),
	}}
	t.Cleanup(func() {
		// After a failure, or a down that did not finish: remove what is
		// left of the project, and its network (podman-compose 1.0.3's down
		// leaves it).
		if out, err := exec.Command(pm, "ps", "-a", "-q", "--filter", "label=io.podman.compose.project="+c.project).Output(); err == nil && len(strings.TrimSpace(string(out))) > 0 {
			if _, err := c.down(); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if out, err := exec.Command(pm, "volume", "ls", "-q", "--filter", "label=io.podman.compose.project="+c.project).Output(); err == nil {
			for _, v := range strings.Fields(string(out)) {
				exec.Command(pm, "volume", "rm", "-f", v).Run()
			}
		}
		net := c.project + "_default"
		if exec.Command(pm, "network", "exists", net).Run() == nil {
			if out, err := exec.Command(pm, "network", "rm", "-f", net).CombinedOutput(); err != nil {
				t.Errorf("cleanup: podman network rm %s: %v\n%s", net, err, out)
			}
		}
	})

	out, err := c.r.output(3*time.Minute, compose, c.args("up", "-d")...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, c.pw) {
		t.Errorf("podman-compose up printed the password (it must pass it by name only):\n%s", out)
	}
	c.pgName, c.pgfName = c.project+"_postgres_1", c.project+"_pgfence_1"
	for _, name := range []string{c.pgName, c.pgfName} {
		if exec.Command(pm, "container", "exists", name).Run() != nil {
			t.Fatalf("podman-compose up made no container %s:\n%s", name, out)
		}
	}
	waitReady(t, c.metricsPort, 90*time.Second, func() { logs(t, pm, c.pgName, c.pgfName) })
	return c
}

func (c *composeRun) args(args ...string) []string {
	return append([]string{"-p", c.project, "-f", filepath.Join(c.root, "docker-compose.yml")}, args...)
}

func (c *composeRun) down() (string, error) {
	return c.r.output(2*time.Minute, c.compose, c.args("down", "-v", "-t", "2")...)
}

// TestCompose: docker-compose.yml as written, with podman-compose.
func TestCompose(t *testing.T) {
	t.Parallel()
	c := upCompose(t)
	staleWriteCheck(t, c.r, c.port)
	checkRow(t, c.r, c.pm, c.pgName)
	checkRejects(t, c.metricsPort)

	if out, err := c.down(); err != nil {
		t.Fatalf("podman-compose down: %v", err)
	} else if ids, _ := exec.Command(c.pm, "ps", "-a", "-q", "--filter", "label=io.podman.compose.project="+c.project).Output(); len(strings.TrimSpace(string(ids))) > 0 {
		t.Fatalf("containers left after podman-compose down: %s\n%s", ids, out)
	}
}

// closeTime is what pgfence may take to exit after its drain: its log
// lines written out (2 s at most), its HTTP server stopped (1 s), and a
// margin; deploy/kubernetes checks terminationGracePeriodSeconds with the
// same.
const closeTime = 5 * time.Second

// TestComposeStop: `podman stop` (podman's own stop timeout, as
// podman-compose 1.0.3 leaves it) of the pgfence docker-compose.yml made,
// while two transactions are open through it. pgfence drains: the one that
// commits during the drain commits; the one that outlasts --drain-timeout
// has its session closed and is rolled back; and pgfence exits by itself,
// with status 0 and its last log lines, before the stop timeout would
// kill it. The compose file's stop_grace_period (docker compose's stop
// timeout) and podman's agree with the drain.
func TestComposeStop(t *testing.T) {
	t.Parallel()
	c := upCompose(t)

	drain := c.drainTimeout()
	grace := c.stopGracePeriod()
	stopTimeout := c.inspect("{{.Config.StopTimeout}}")
	podmanGrace, err := time.ParseDuration(stopTimeout + "s")
	if err != nil {
		t.Fatalf("podman inspect %s: StopTimeout %q: %v", c.pgfName, stopTimeout, err)
	}
	for what, d := range map[string]time.Duration{"docker-compose.yml's stop_grace_period": grace, "podman's stop timeout for the container": podmanGrace} {
		if d < drain+closeTime {
			t.Errorf("%s is %v, shorter than pgfence's --drain-timeout %v plus %v to close: a stop kills pgfence while it drains", what, d, drain, closeTime)
		}
	}

	bg := context.Background()
	connect := func() *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=10", c.port))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Password = c.pw
		conn, err := pgx.ConnectConfig(bg, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	open := func(conn *pgx.Conn, id, balance int) pgx.Tx {
		t.Helper()
		tx, err := conn.Begin(bg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(bg, "SET LOCAL fence.token = '7'"); err != nil {
			t.Fatal(err)
		}
		if tag, err := tx.Exec(bg, "UPDATE accounts SET balance = $1 WHERE id = $2", balance, id); err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("UPDATE accounts row %d: %v %v", id, tag, err)
		}
		return tx
	}
	finishing, outlasting := connect(), connect()
	commits := open(finishing, 1, 111)
	outlasts := open(outlasting, 2, 222)

	stop := exec.Command(c.pm, "stop", c.pgfName)
	stopped := make(chan error, 1)
	begun := time.Now()
	if err := stop.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { stopped <- stop.Wait() }()
	c.waitLog("SIGTERM: draining", 30*time.Second)
	if err := commits.Commit(bg); err != nil {
		t.Fatalf("a transaction that commits while pgfence drains: %v", err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("podman stop %s: %v", c.pgfName, err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("podman stop %s did not return", c.pgfName)
	}
	took := time.Since(begun)
	if code := c.inspect("{{.State.ExitCode}}"); code != "0" {
		logs(t, c.pm, c.pgfName)
		t.Fatalf("pgfence's exit status after podman stop (%v): %s, want 0: killed before its drain (%v) was over", took, code, drain)
	}
	out := c.r.must(time.Minute, c.pm, "logs", c.pgfName)
	for _, want := range []string{"drain timeout reached; remaining sessions were closed", "drained; bye"} {
		if !strings.Contains(out, want) {
			t.Errorf("pgfence's log after podman stop lacks %q:\n%s", want, out)
		}
	}
	if _, err := outlasts.Exec(bg, "SELECT 1"); err == nil {
		t.Error("a transaction open past the drain goes on after pgfence stopped")
	}
	rows := strings.TrimSpace(c.r.must(time.Minute, c.pm, "exec", c.pgName,
		"psql", "-X", "-At", "-U", "postgres", "-d", "postgres", "-c", "SELECT id, balance FROM accounts ORDER BY id"))
	if rows != "1|111\n2|50" {
		t.Fatalf("accounts after podman stop: %q, want 1|111 (committed during the drain) and 2|50 (rolled back)", rows)
	}
	t.Logf("podman stop took %v with --drain-timeout %v", took.Round(100*time.Millisecond), drain)
}

// inspect is a field of pgfence's container, as podman inspect formats it.
func (c *composeRun) inspect(format string) string {
	return strings.TrimSpace(c.r.must(time.Minute, c.pm, "inspect", "--format", format, c.pgfName))
}

// waitLog waits for pgfence's log to have want.
func (c *composeRun) waitLog(want string, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, _ := exec.Command(c.pm, "logs", c.pgfName).CombinedOutput()
		if strings.Contains(string(out), want) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("pgfence's log did not say %q within %v:\n%s", want, within, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// drainTimeout is pgfence's --drain-timeout in the compose file: its
// PGFENCE_DRAIN_TIMEOUT, else the image's default (from serve --help).
func (c *composeRun) drainTimeout() time.Duration {
	c.t.Helper()
	if v := c.service().Environment["PGFENCE_DRAIN_TIMEOUT"]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			c.t.Fatalf("docker-compose.yml: PGFENCE_DRAIN_TIMEOUT %q: %v", v, err)
		}
		return d
	}
	help := c.r.must(time.Minute, c.pm, "run", "--rm", pgfenceImage, "serve", "--help")
	m := regexp.MustCompile(`--drain-timeout duration .*\(default (\S+)\)`).FindStringSubmatch(help)
	if m == nil {
		c.t.Fatalf("pgfence serve --help of %s names no default --drain-timeout:\n%s", pgfenceImage, help)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}

// stopGracePeriod is pgfence's stop_grace_period in the compose file
// (docker compose's default, 10s, when it has none).
func (c *composeRun) stopGracePeriod() time.Duration {
	c.t.Helper()
	v := c.service().StopGracePeriod
	if v == "" {
		return 10 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		c.t.Fatalf("docker-compose.yml: stop_grace_period %q: %v", v, err)
	}
	return d
}

// composeService is what these tests read of a compose service.
type composeService struct {
	Environment     map[string]string `yaml:"environment"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
}

// service is docker-compose.yml's pgfence service.
func (c *composeRun) service() composeService {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.root, "docker-compose.yml"))
	if err != nil {
		c.t.Fatal(err)
	}
	var f struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		c.t.Fatalf("docker-compose.yml: %v", err)
	}
	s, ok := f.Services["pgfence"]
	if !ok {
		c.t.Fatal("docker-compose.yml has no service pgfence")
	}
	return s
}
