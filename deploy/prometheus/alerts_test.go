// Package prometheus_test checks pgfence's Prometheus alert rules
// (pgfence-alerts.yml): promtool's unit tests (pgfence-alerts_test.yml), and
// a real Prometheus that scrapes a real pgfence and an application holding
// leases, while stale writes, a token-less write, a lost lease, a disabled
// backstop and a stopped Postgres happen, and sees the alerts fire.
//
// Prometheus and promtool come from Debian's prometheus package (bash
// scripts/install-prometheus.sh); etcd from scripts/install-lease-deps.sh;
// Postgres as for every other test. A missing one fails the tests.
package prometheus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/pgfence/pgfence/internal/netfault"
	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/lease"
	"github.com/pgfence/pgfence/lease/leasetest"
)

const (
	rulesFile = "pgfence-alerts.yml"
	testsFile = "pgfence-alerts_test.yml"
	// testFor replaces every non-zero for: of the rules in the end-to-end
	// test, so that pending and firing both show within seconds.
	testFor = "3s"
)

const installHint = "install Prometheus with `bash scripts/install-prometheus.sh` (Debian package prometheus, which has prometheus and promtool)"

// tool finds a Prometheus binary, failing the test (not skipping it) when
// it is missing.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: %s", name, installHint)
	}
	return p
}

// The rules are valid, and pass their unit tests.
func TestPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", testsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestAlertsEndToEnd runs Postgres, pgfence (the binary, as `pgfence
// serve`), etcd, an application that holds leases of a lock with the lease
// package's metrics, and Prometheus scraping pgfence and the application
// every second with the rules loaded (evaluated every second, every
// non-zero for: shortened to testFor; expressions, labels and annotations
// as shipped). Then:
//
//   - holder A takes the lease, writes, and is cut off from etcd: its lease
//     expires (PgfenceLeaseLost, for: 0);
//   - holder B takes the lease and writes; A, a zombie, writes 12 times
//     with its old token: each changes 0 rows (PgfenceRejectsRising,
//     pending, then firing);
//   - a write without a token is refused (PgfenceWriteWithoutToken, for: 0);
//   - the backstop's trigger is disabled (PgfenceBackstopMissing, under
//     --backstop verify);
//   - Postgres stops (PgfenceUpstreamDown, PgfenceDiscoveryFailing).
//
// Before all that, with everything healthy, no alert is pending or firing.
func TestAlertsEndToEnd(t *testing.T) {
	begin := time.Now()
	promBin := tool(t, "prometheus")
	dir := t.TempDir()

	// The slow starts, at once: building pgfence, Postgres, etcd. The build
	// is quick from a warm build cache (go test ./... has usually compiled
	// the packages already); from a cold one it compiles libpg_query's C,
	// which takes minutes on a small machine.
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancelBuild()
	startCtx, cancelStart := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelStart()
	var (
		wg         sync.WaitGroup
		buildErr   error
		pg         *pgserver.Server
		pgStartErr error
		etcd       *leasetest.Etcd
		etcdErr    error
	)
	pgfenceBin := filepath.Join(dir, "pgfence")
	wg.Add(3)
	go func() {
		defer wg.Done()
		out, err := exec.CommandContext(buildCtx, goTool(), "build", "-o", pgfenceBin, "github.com/pgfence/pgfence/cmd/pgfence").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/pgfence: %v\n%s", err, out)
		}
	}()
	go func() {
		defer wg.Done()
		pg, pgStartErr = pgserver.Start(startCtx, pgserver.Options{})
	}()
	go func() {
		defer wg.Done()
		etcd, etcdErr = leasetest.StartEtcd(startCtx, leasetest.EtcdOptions{})
	}()
	wg.Wait()
	if pg != nil {
		t.Cleanup(func() { pg.Stop() })
	}
	if etcd != nil {
		t.Cleanup(etcd.Stop)
	}
	if err := errors.Join(buildErr, pgStartErr, etcdErr); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: pgfence built, Postgres and etcd up", since(begin))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A guarded table, with the backstop installed by `pgfence init`, and
	// pgfence serve only verifying it (so that a disabled trigger stays
	// disabled and is reported).
	direct, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, direct, `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (1, 100)`)
	if out, err := exec.CommandContext(ctx, pgfenceBin, "init", "--upstream", pg.URL("postgres")).CombinedOutput(); err != nil {
		t.Fatalf("pgfence init: %v\n%s", err, out)
	}
	pf := startPgfence(t, pgfenceBin, "serve", "--upstream", pg.URL("postgres"),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--discover-interval", "1s", "--backstop", "verify", "--init-domains=false", "--log-format", "json")

	// The application: its lease metrics on /metrics.
	reg := prometheus.NewRegistry()
	leaseMetrics := lease.NewMetrics(reg)
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	appSrv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go appSrv.Serve(appLn)
	t.Cleanup(func() { appSrv.Close() })
	relay, err := netfault.NewRelay(etcd.ClientAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	const ttl, margin = 2 * time.Second, 600 * time.Millisecond
	lockA := leaseMetrics.Instrument("billing", &lease.Etcd{Client: etcdClient(t, "http://"+relay.Addr()), Prefix: "/locks/billing", TTL: ttl, SafetyMargin: margin})
	lockB := leaseMetrics.Instrument("billing", &lease.Etcd{Client: etcdClient(t, etcd.Endpoints()...), Prefix: "/locks/billing", TTL: ttl, SafetyMargin: margin})

	prom := startPrometheus(t, promBin, dir, pf.metrics, appLn.Addr().String())
	t.Logf("%v: pgfence at %s (metrics %s), application metrics at %s, Prometheus at %s",
		since(begin), pf.listen, pf.metrics, appLn.Addr(), prom.base)

	// Healthy: both targets scraped, pgfence_upstream_up 1, and, over a few
	// evaluations, no alert pending or firing.
	prom.waitQuery(t, `count(up == 1) == 2`, 20*time.Second)
	prom.waitQuery(t, `pgfence_upstream_up == 1 and on (job, instance) pgfence_discovery_ok{database="postgres"} == 1 and on (job, instance) pgfence_backstop_ok{database="postgres"} == 1`, 20*time.Second)
	prom.waitQuery(t, `pgfence_lease_lost_total{lock="billing"} == 0`, 20*time.Second)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if as := prom.alerts(t); len(as) > 0 {
			t.Fatalf("alerts while everything is healthy: %v", as)
		}
	}
	t.Logf("%v: healthy, no alert", since(begin))
	watch := prom.watchAlerts(t)

	// A takes the lease and writes, then is cut off from etcd.
	connA, connB := pf.connect(t), pf.connect(t)
	a, err := lockA.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := update(t, ctx, connA, a.Token, func(ctx context.Context, tx pgx.Tx) (pgconn.CommandTag, error) {
		return tx.Exec(ctx, "UPDATE accounts SET balance = balance - 1 WHERE id = 1")
	}, a); n != 1 {
		t.Fatalf("A's write with a valid lease changed %d rows", n)
	}
	relay.Partition()
	select {
	case <-a.Context().Done():
	case <-time.After(3 * ttl):
		t.Fatal("A's lease did not end after it was cut off from etcd")
	}
	if !errors.Is(a.Err(), lease.ErrExpired) {
		t.Fatalf("A's lease ended with %v, want ErrExpired", a.Err())
	}
	leaseLost := time.Now()
	t.Logf("%v: A's lease (token %d) expired", since(begin), a.Token)

	// B takes it once etcd expires A's lease, and writes.
	b, err := lockB.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background())
	relay.Heal()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	a.Release(rctx)
	rcancel()
	if n := update(t, ctx, connB, b.Token, func(ctx context.Context, tx pgx.Tx) (pgconn.CommandTag, error) {
		return tx.Exec(ctx, "UPDATE accounts SET balance = balance - 1 WHERE id = 1")
	}, b); n != 1 {
		t.Fatalf("B's write changed %d rows", n)
	}

	// A, a zombie, writes on with its old token: fenced, 12 times.
	for k := 0; k < 12; k++ {
		if n := update(t, ctx, connA, a.Token, func(ctx context.Context, tx pgx.Tx) (pgconn.CommandTag, error) {
			return tx.Exec(ctx, "UPDATE accounts SET balance = 0 WHERE id = 1")
		}, nil); n != 0 {
			t.Fatalf("stale write %d (token %d after %d) changed %d rows", k, a.Token, b.Token, n)
		}
	}
	stale := time.Now()
	// And once without a token: refused.
	_, err = connA.Exec(ctx, "UPDATE accounts SET balance = 0 WHERE id = 1")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Fatalf("write without a token: %v, want SQLSTATE 55000", err)
	}
	noToken := time.Now()
	var balance, epoch int64
	if err := direct.QueryRow(ctx, "SELECT balance, fence_epoch FROM accounts WHERE id = 1").Scan(&balance, &epoch); err != nil {
		t.Fatal(err)
	}
	if balance != 98 || epoch != b.Token {
		t.Fatalf("row after the writes: balance %d epoch %d, want 98 and B's token %d", balance, epoch, b.Token)
	}
	// The backstop's trigger disabled behind pgfence's back.
	mustExec(t, direct, `ALTER TABLE accounts DISABLE TRIGGER "~pgfence_backstop"`)
	backstopOff := time.Now()
	t.Logf("%v: B (token %d) wrote; 12 stale writes fenced; a write without a token refused; backstop disabled", since(begin), b.Token)

	watch.waitFiring(t, 20*time.Second, map[string]time.Time{
		"PgfenceLeaseLost":         leaseLost,
		"PgfenceRejectsRising":     stale,
		"PgfenceWriteWithoutToken": noToken,
		"PgfenceBackstopMissing":   backstopOff,
	})

	// Postgres goes away.
	connA.Close(ctx)
	connB.Close(ctx)
	direct.Close(ctx)
	pg.Stop()
	pgDown := time.Now()
	t.Logf("%v: Postgres stopped", since(begin))
	watch.waitFiring(t, 20*time.Second, map[string]time.Time{
		"PgfenceUpstreamDown":     pgDown,
		"PgfenceDiscoveryFailing": pgDown,
	})

	// Labels and annotations as Prometheus rendered them.
	got := map[string]alert{}
	for _, al := range prom.alerts(t) {
		got[al.Labels["alertname"]] = al
	}
	checks := []struct {
		name    string
		labels  map[string]string
		summary string
	}{
		{"PgfenceWriteWithoutToken", map[string]string{"severity": "critical", "job": "pgfence", "database": "postgres", "mode": "enforce", "action": "refused"},
			" in database postgres (refused) in 10 min"},
		{"PgfenceRejectsRising", map[string]string{"severity": "warning", "job": "pgfence", "database": "postgres", "mode": "enforce"}, " in database postgres are rising"},
		{"PgfenceLeaseLost", map[string]string{"severity": "warning", "job": "billing-worker", "lock": "billing", "reason": "expired"},
			"1 lease(s) of lock billing lost while held (expired) in 10 min"},
		{"PgfenceBackstopMissing", map[string]string{"severity": "warning", "job": "pgfence", "database": "postgres", "table": "public.accounts"},
			"Database backstop not in place on public.accounts in database postgres"},
		{"PgfenceUpstreamDown", map[string]string{"severity": "critical", "job": "pgfence"}, "its Postgres is unreachable or not a writable primary"},
		{"PgfenceDiscoveryFailing", map[string]string{"severity": "warning", "job": "pgfence", "database": "postgres"}, "cannot read the catalog of database postgres"},
	}
	for _, c := range checks {
		al, ok := got[c.name]
		if !ok {
			t.Errorf("%s: not among the alerts", c.name)
			continue
		}
		for k, v := range c.labels {
			if al.Labels[k] != v {
				t.Errorf("%s: label %s=%q, want %q (labels %v)", c.name, k, al.Labels[k], v, al.Labels)
			}
		}
		if !strings.Contains(al.Annotations["summary"], c.summary) || al.Annotations["description"] == "" {
			t.Errorf("%s: annotations %v, want a summary with %q and a description", c.name, al.Annotations, c.summary)
		}
	}
	checkDashboard(t, prom)
	t.Logf("%v: done", since(begin))
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

// goTool is the go command that runs this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go" // not on PATH: exec says so
}

func mustExec(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// update runs write in a transaction with token (lease.WithLease when l is
// set, lease.WithToken otherwise) and returns the rows it changed.
func update(t *testing.T, ctx context.Context, c *pgx.Conn, token int64, write func(context.Context, pgx.Tx) (pgconn.CommandTag, error), l *lease.Lease) int64 {
	t.Helper()
	var n int64
	fn := func(ctx context.Context, tx pgx.Tx) error {
		tag, err := write(ctx, tx)
		n = tag.RowsAffected()
		return err
	}
	var err error
	if l != nil {
		err = lease.WithLease(ctx, c, l, fn)
	} else {
		err = lease.WithToken(ctx, c, token, fn)
	}
	if err != nil {
		t.Fatalf("write with token %d: %v", token, err)
	}
	return n
}

func etcdClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// process is a server the test started; stop ends it (SIGTERM, then
// SIGKILL) and waits for it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *pgtest.LogBuffer
}

func startProcess(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{cmd: cmd, done: make(chan struct{}), log: &pgtest.LogBuffer{}}
	if cmd.Stdout == nil {
		cmd.Stdout = p.log
	}
	if cmd.Stderr == nil {
		cmd.Stderr = p.log
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	return p
}

func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pgfence is a running `pgfence serve`.
type pgfence struct {
	*process
	listen, metrics string
}

// startPgfence runs pgfence with args (JSON logs, listening on port 0)
// and reads where it listens from its "pgfence serving" line.
func startPgfence(t *testing.T, bin string, args ...string) *pgfence {
	t.Helper()
	pr, pw := io.Pipe()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = pw
	p := startProcess(t, cmd)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgfence's log:\n%s", p.log)
		}
	})
	go func() { <-p.done; pw.Close() }()
	serving := make(chan *pgfence, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.log.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Listen, Metrics string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "pgfence serving" {
				serving <- &pgfence{process: p, listen: line.Listen, metrics: line.Metrics}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case pf := <-serving:
		return pf
	case <-p.done:
		t.Fatalf("pgfence %s exited:\n%s", strings.Join(args, " "), p.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("pgfence did not say it serves within 30 s:\n%s", p.log)
	}
	return nil
}

func (pf *pgfence) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), "postgres://postgres@"+pf.listen+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// promServer is a running Prometheus.
type promServer struct {
	*process
	base string // http://127.0.0.1:port
}

// forRe finds the for: durations of the rules file.
var forRe = regexp.MustCompile(`(?m)^(\s+for:\s*)(\S+)\s*$`)

// startPrometheus runs Prometheus on a free port with a data directory in
// dir, scraping pgfence (job pgfence) and the application (job
// billing-worker) every second, with the rules (every non-zero for: set
// to testFor) evaluated every second.
func startPrometheus(t *testing.T, bin, dir, pgfenceAddr, appAddr string) *promServer {
	t.Helper()
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	fors := 0
	rules = forRe.ReplaceAllFunc(rules, func(m []byte) []byte {
		sub := forRe.FindSubmatch(m)
		if d := string(sub[2]); d == "0" || d == "0s" || d == "0m" {
			return m
		}
		fors++
		return append(append([]byte{}, sub[1]...), testFor...)
	})
	if fors == 0 {
		t.Fatalf("no for: durations found in %s to shorten", rulesFile)
	}
	rulesPath := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rulesPath, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: pgfence
    static_configs:
      - targets: [%q]
  - job_name: billing-worker
    static_configs:
      - targets: [%q]
`, rulesPath, pgfenceAddr, appAddr)
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		p := startProcess(t, exec.Command(bin,
			"--config.file="+configPath,
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data%d", attempt)),
			"--web.listen-address="+addr,
			"--log.level=info"))
		s := &promServer{process: p, base: "http://" + addr}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("Prometheus's log:\n%s", p.log)
			}
		})
		deadline := time.Now().Add(30 * time.Second)
		for !p.exited() && time.Now().Before(deadline) {
			if resp, err := http.Get(s.base + "/-/ready"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return s
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.stop()
		if attempt < 3 && strings.Contains(p.log.String(), "address already in use") {
			continue
		}
		t.Fatalf("Prometheus did not get ready:\n%s", p.log)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get fetches an API path and decodes its data into v.
func (s *promServer) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get(s.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string
		Error  string
		Data   json.RawMessage
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
}

// waitQuery waits until the PromQL query returns something.
func (s *promServer) waitQuery(t *testing.T, query string, within time.Duration) {
	t.Helper()
	for end := time.Now().Add(within); ; time.Sleep(200 * time.Millisecond) {
		var data struct{ Result []json.RawMessage }
		s.get(t, "/api/v1/query?query="+url.QueryEscape(query), &data)
		if len(data.Result) > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("Prometheus: %s returned nothing for %v", query, within)
		}
	}
}

type alert struct {
	Labels      map[string]string
	Annotations map[string]string
	State       string
}

func (a alert) String() string {
	var ls []string
	for k, v := range a.Labels {
		ls = append(ls, k+"="+v)
	}
	sort.Strings(ls)
	return a.State + "{" + strings.Join(ls, ",") + "}"
}

// alerts are the alerts pending or firing now.
func (s *promServer) alerts(t *testing.T) []alert {
	t.Helper()
	var data struct{ Alerts []alert }
	s.get(t, "/api/v1/alerts", &data)
	return data.Alerts
}

// alertWatch polls the alerts, noting when each alert name was first seen
// pending and firing.
type alertWatch struct {
	s       *promServer
	mu      sync.Mutex
	pending map[string]time.Time
	firing  map[string]time.Time
	err     error
}

func (s *promServer) watchAlerts(t *testing.T) *alertWatch {
	w := &alertWatch{s: s, pending: map[string]time.Time{}, firing: map[string]time.Time{}}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			w.poll()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *alertWatch) poll() {
	resp, err := http.Get(w.s.base + "/api/v1/alerts")
	var r struct{ Data struct{ Alerts []alert } }
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.err = err
		return
	}
	for _, a := range r.Data.Alerts {
		name := a.Labels["alertname"]
		seen := w.pending
		if a.State == "firing" {
			seen = w.firing
		}
		if _, ok := seen[name]; !ok {
			seen[name] = now
		}
	}
}

// waitFiring waits until every alert named in since fires, and checks that
// the ones with a for: were pending first; since is when the cause of each
// happened.
func (w *alertWatch) waitFiring(t *testing.T, within time.Duration, since map[string]time.Time) {
	t.Helper()
	rules := ruleFors(t)
	end := time.Now().Add(within)
	for {
		w.mu.Lock()
		var missing []string
		for name := range since {
			if _, ok := w.firing[name]; !ok {
				missing = append(missing, name)
			}
		}
		pending, firing, err := copyTimes(w.pending), copyTimes(w.firing), w.err
		w.mu.Unlock()
		if len(missing) == 0 {
			for name, cause := range since {
				p, wasPending := pending[name]
				switch {
				case rules[name] && !wasPending:
					t.Errorf("%s fired without being pending first (it has a for:)", name)
				case rules[name]:
					t.Logf("%s: pending %v and firing %v after its cause", name, p.Sub(cause).Round(100*time.Millisecond), firing[name].Sub(cause).Round(100*time.Millisecond))
				default:
					t.Logf("%s (for: 0): firing %v after its cause", name, firing[name].Sub(cause).Round(100*time.Millisecond))
				}
			}
			return
		}
		if time.Now().After(end) {
			sort.Strings(missing)
			t.Fatalf("not firing after %v: %s (last poll error: %v); alerts now: %v", within, strings.Join(missing, ", "), err, w.s.alerts(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func copyTimes(m map[string]time.Time) map[string]time.Time {
	c := make(map[string]time.Time, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// ruleFors says, for each alert of the rules file, whether it has a
// non-zero for:.
func ruleFors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	name := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(line, "- alert: "); ok {
			name = strings.TrimSpace(n)
		} else if d, ok := strings.CutPrefix(line, "for: "); ok && name != "" {
			d = strings.TrimSpace(d)
			out[name] = d != "0" && d != "0s" && d != "0m"
		}
	}
	return out
}
