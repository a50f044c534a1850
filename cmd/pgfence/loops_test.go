package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/cores"
	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/poll"
)

// serveInstance runs 'pgfence serve' with args and /metrics on a port of
// its own, and returns its instance once it listens.
func serveInstance(t *testing.T, args ...string) (*instance, chan error) {
	t.Helper()
	inst, done := startServe(t, append([]string{"--metrics-listen", "127.0.0.1:0"}, args...)...)
	if inst == nil {
		t.Fatalf("serve: %v", <-done)
	}
	return inst, done
}

// metricsText is what /metrics says now.
func metricsText(t *testing.T, inst *instance) string {
	t.Helper()
	resp, err := http.Get("http://" + inst.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// loopSessions reads pgfence_event_loops and pgfence_loop_sessions from
// /metrics, as "loops: n0 n1 ...".
func loopSessions(t *testing.T, inst *instance) string {
	t.Helper()
	text := metricsText(t, inst)
	loops, per := "", map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "pgfence_event_loops "); ok {
			loops = v
		}
		if rest, ok := strings.CutPrefix(line, `pgfence_loop_sessions{loop="`); ok {
			l, v, _ := strings.Cut(rest, `"} `)
			per[l] = v
		}
	}
	out := loops + ":"
	for i := range len(per) {
		out += " " + per[fmt.Sprint(i)]
	}
	return out
}

// --event-loops 2: sessions are spread over both loops (as /metrics
// shows), a SIGHUP reload reaches the sessions of both, and SIGTERM
// drains both.
func TestServeEventLoops(t *testing.T) {
	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	bg := context.Background()
	admin, err := pgx.Connect(bg, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "CREATE TABLE loops_t (id int PRIMARY KEY, v text, fence_epoch bigint NOT NULL DEFAULT 100); INSERT INTO loops_t VALUES (1, 'a')"); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "pgfence.yaml")
	os.WriteFile(cfgPath, []byte("discover: false\n"), 0o600)

	if _, err := start(serveOptions{upstream: pg.URL("postgres"), eventLoops: -1}, nil); err == nil || !strings.Contains(err.Error(), "--event-loops -1") {
		t.Fatalf("--event-loops -1: %v", err)
	}

	inst, done := serveInstance(t, "--upstream", pg.URL("postgres"), "--config", cfgPath, "--discover-interval", "0",
		"--backstop", "off", "--event-loops", "2", "--drain-timeout", "20s")
	if got := loopSessions(t, inst); got != "2: 0 0" {
		t.Fatalf("/metrics before any session: %q, want 2 loops holding none", got)
	}
	var cs []*pgx.Conn
	for range 4 {
		cs = append(cs, connect(t, inst.Addr()))
	}
	if got := loopSessions(t, inst); got != "2: 2 2" {
		t.Fatalf("/metrics with four sessions: %q, want two on each loop", got)
	}
	// cs[0] and cs[2] are on one loop, cs[1] and cs[3] on the other: the
	// loops take sessions in turn when they hold as many.
	for _, c := range cs[:2] {
		if _, err := c.Exec(bg, "SET fence.token = '1'"); err != nil {
			t.Fatal(err)
		}
		if tag, err := c.Exec(bg, "UPDATE loops_t SET v = 'unguarded' WHERE id = 1"); err != nil || tag.String() != "UPDATE 1" {
			t.Fatalf("before the reload (not guarded): %v %v", tag, err)
		}
	}
	os.WriteFile(cfgPath, []byte("discover: true\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	for i, c := range cs[:2] {
		poll.Eventually(t, 10*time.Second, fmt.Sprintf("the reload on SIGHUP in session %d", i), func() bool {
			tag, err := c.Exec(bg, "UPDATE loops_t SET v = 'unguarded' WHERE id = 1")
			if err != nil {
				t.Fatalf("session %d broke across the reload: %v", i, err)
			}
			return tag.String() == "UPDATE 0" // discovered and fenced: token 1 < epoch 100
		})
	}

	// A drain: cs[0] and cs[1] busy, one on each loop, the others idle.
	for _, c := range cs[:2] {
		if _, err := c.Exec(bg, "BEGIN"); err != nil {
			t.Fatal(err)
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	poll.Eventually(t, 10*time.Second, "the idle sessions to end", func() bool { return inst.proxy.Sessions() == 2 })
	if got := fmt.Sprint(inst.proxy.LoopSessions()); got != "[1 1]" {
		t.Fatalf("during the drain the loops hold %s, want one busy session each", got)
	}
	for i, c := range cs[2:] {
		if _, err := c.Exec(bg, "SELECT 1"); err == nil {
			t.Fatalf("idle session %d survived SIGTERM", i)
		}
	}
	for i, c := range cs[:2] {
		if _, err := c.Exec(bg, "SELECT 1"); err != nil {
			t.Fatalf("busy session %d was cut during the drain: %v", i, err)
		}
		if _, err := c.Exec(bg, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after the last transaction ended")
	}
}

// With two loops, when pgfence follows the primary to another host it
// ends the sessions of both loops on the old one, and new sessions on
// both go to the new one (see TestServeFollowsPrimary).
func TestServeFollowsPrimaryOnEveryLoop(t *testing.T) {
	bg := context.Background()
	a, b := twoServers(t)
	readOnly(t, a, true)
	s := &serveTest{t: t, pg: a}
	up := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write", a.Addr(), b.Addr())
	inst := s.serve(serveOptions{upstream: up, backstop: "off", eventLoops: 2})
	old := []*pgx.Conn{s.client(inst, ""), s.client(inst, "")}
	if got := fmt.Sprint(inst.proxy.LoopSessions()); got != "[1 1]" {
		t.Fatalf("two sessions on the loops: %s, want one each", got)
	}
	readOnly(t, b, true)
	readOnly(t, a, false)
	poll.Eventually(t, 10*time.Second, "pgfence to follow the primary to "+a.Addr(), func() bool { return inst.proxy.Upstream().Addr == a.Addr() })
	for i, c := range old {
		if _, err := c.Exec(bg, "SELECT 1"); err == nil {
			t.Fatalf("session %d on the old primary goes on after pgfence moved to the new one", i)
		}
	}
	poll.Eventually(t, 10*time.Second, "the old sessions to leave their loops", func() bool { return fmt.Sprint(inst.proxy.LoopSessions()) == "[0 0]" })
	for i := range 2 {
		if got := tag(t, s.client(inst, ""), fmt.Sprintf("CREATE TABLE follow_%d (id int)", i)); got != "CREATE TABLE" {
			t.Fatalf("new session %d after the move: %s", i, got)
		}
	}
	if got := fmt.Sprint(inst.proxy.LoopSessions()); got != "[1 1]" {
		t.Fatalf("new sessions on the loops: %s, want one each", got)
	}
}

// The core governor (on by default) brings an idle pgfence down to one P,
// its loops go on relaying on it, a second instance still gets a loop per
// usable core, and closing the first gives the runtime its cores back.
func TestServeCoreGovernor(t *testing.T) {
	if cores.Usable() < 2 {
		t.Skipf("GOMAXPROCS is %d at start: one core leaves the governor nothing to size", cores.Usable())
	}
	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	bg := context.Background()
	args := []string{"--upstream", pg.URL("postgres"), "--discover=false", "--backstop", "off"}
	inst, _ := serveInstance(t, args...)
	want := fmt.Sprintf("%d:", cores.Usable())
	if got := loopSessions(t, inst); !strings.HasPrefix(got, want) {
		t.Fatalf("/metrics: %q, want a loop per usable core (%d)", got, cores.Usable())
	}
	gauge := func(inst *instance, name string) string {
		for _, line := range strings.Split(metricsText(t, inst), "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				return v
			}
		}
		return ""
	}
	poll.Eventually(t, time.Minute, "an idle pgfence down to one P", func() bool { return gauge(inst, "pgfence_cores") == "1" })

	var cs []*pgx.Conn
	for range 2 * cores.Usable() {
		cs = append(cs, connect(t, inst.Addr()))
	}
	errs := make(chan error, len(cs))
	for i, c := range cs {
		go func() {
			var n int
			for range 100 {
				if err := c.QueryRow(bg, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
					errs <- fmt.Errorf("session %d: %d, %v", i, n, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range cs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(inst.proxy.LoopSessions()); strings.Contains(got, " 0") || strings.Contains(got, "[0") {
		t.Fatalf("a loop holds no session: %s", got)
	}

	second, _ := serveInstance(t, args...)
	if got := loopSessions(t, second); !strings.HasPrefix(got, want) {
		t.Fatalf("a second instance while the first runs on %s P: %q, want a loop per usable core (%d)", gauge(inst, "pgfence_cores"), got, cores.Usable())
	}
	second.Close()
	inst.Close()
	poll.Eventually(t, time.Minute, "the cores given back", func() bool { return runtime.GOMAXPROCS(0) == cores.Usable() })
}
