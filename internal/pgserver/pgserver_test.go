package pgserver_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgserver"
)

func start(t *testing.T, opt pgserver.Options) *pgserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	s, err := pgserver.Start(ctx, opt)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("server on %s started in %v (bin dir %s)", s.Addr(), time.Since(t0).Round(time.Millisecond), s.BinDir)
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
}

func connect(t *testing.T, connURL string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatalf("connect %s: %v", connURL, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryString(t *testing.T, conn *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestStartStop(t *testing.T) {
	s := start(t, pgserver.Options{Settings: map[string]string{"work_mem": "7MB"}})

	if s.Host != "127.0.0.1" || s.User != "postgres" || s.Port == 0 {
		t.Fatalf("unexpected server fields: %+v", s)
	}
	conn := connect(t, s.URL("postgres"))
	var one int
	if err := conn.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	for setting, want := range map[string]string{
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"max_connections":    "200",
		"listen_addresses":   "127.0.0.1",
		"work_mem":           "7MB",
		"server_encoding":    "UTF8",
	} {
		if got := queryString(t, conn, "SHOW "+setting); got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
	if u := queryString(t, conn, "SELECT current_user"); u != "postgres" {
		t.Errorf("current_user = %q", u)
	}
	conn.Close(context.Background())

	if _, err := os.Stat(s.DataDir); err != nil {
		t.Fatalf("data dir: %v", err)
	}
	if tail := s.LogTail(); !strings.Contains(tail, "ready to accept connections") {
		t.Errorf("log tail lacks the ready message:\n%s", tail)
	}

	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s still there after Stop (stat err %v)", s.Dir, err)
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("port %d still accepting connections after Stop", s.Port)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestPassword(t *testing.T) {
	const pw = "s3cret p@ss/word"
	s := start(t, pgserver.Options{Password: pw})

	if !strings.Contains(s.URL("postgres"), url.UserPassword("postgres", pw).String()) {
		t.Errorf("URL %q lacks the escaped password", s.URL("postgres"))
	}
	conn := connect(t, s.URL("postgres"))
	if got := queryString(t, conn, "SELECT 'ok'"); got != "ok" {
		t.Errorf("got %q", got)
	}

	for _, bad := range []string{"wrong", ""} {
		u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", bad), Host: s.Addr(), Path: "/postgres", RawQuery: "sslmode=disable"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := pgx.Connect(ctx, u.String())
		cancel()
		if err == nil {
			c.Close(context.Background())
			t.Fatalf("password %q accepted", bad)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("password %q: want SQLSTATE 28P01 (invalid_password), got %v", bad, err)
		}
	}
}

// syncBuffer is a goroutine-safe bytes.Buffer.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRestartKeepsDataAndPort(t *testing.T) {
	var log syncBuffer
	s := start(t, pgserver.Options{Log: &log})
	ctx := context.Background()

	conn := connect(t, s.URL("postgres"))
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	port := s.Port

	// Halt disconnects clients with admin_shutdown.
	if err := s.Halt(); err != nil {
		t.Fatalf("Halt: %v", err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("query on a halted server succeeded")
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Error("halted server still accepts TCP connections")
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}

	// Crash + Resume runs crash recovery; the committed row survives
	// (synchronous_commit=off may lose the last few hundred ms of commits
	// on a crash, but Halt above already checkpointed it).
	if err := s.Crash(); err != nil {
		t.Fatalf("Crash: %v", err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Port != port {
		t.Errorf("port changed from %d to %d", port, s.Port)
	}
	conn2 := connect(t, s.URL("postgres"))
	if got := queryString(t, conn2, "SELECT x::text FROM t"); got != "42" {
		t.Errorf("after restart: x = %q", got)
	}
	if n := strings.Count(log.String(), "ready to accept connections"); n != 3 {
		t.Errorf("log shows %d starts, want 3:\n%s", n, log.String())
	}
}

func TestParallelServers(t *testing.T) {
	var wg sync.WaitGroup
	servers := make([]*pgserver.Server, 3)
	errs := make([]error, 3)
	for i := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i], errs[i] = pgserver.Start(context.Background(), pgserver.Options{})
		}()
	}
	wg.Wait()
	ports := map[int]bool{}
	for i, s := range servers {
		if errs[i] != nil {
			t.Errorf("server %d: %v", i, errs[i])
			continue
		}
		defer s.Stop()
		if ports[s.Port] {
			t.Errorf("port %d used twice", s.Port)
		}
		ports[s.Port] = true
		c := connect(t, s.URL("postgres"))
		c.Close(context.Background())
	}
}

func TestFindBinDirEnv(t *testing.T) {
	t.Setenv(pgserver.EnvBinDir, t.TempDir())
	_, err := pgserver.FindBinDir()
	if err == nil {
		t.Fatal("FindBinDir accepted an empty directory")
	}
	for _, want := range []string{"apt-get install postgresql", pgserver.EnvBinDir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestParentDeathStopsServer checks that Pdeathsig takes the postmaster
// down when the process that started it is killed: a test helper process
// starts a server, reports its postmaster's pid, and is SIGKILLed.
func TestParentDeathStopsServer(t *testing.T) {
	if os.Getenv("PGSERVER_HELPER") == "1" {
		s, err := pgserver.Start(context.Background(), pgserver.Options{})
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(1)
		}
		fmt.Printf("STARTED %s\n", s.Dir)
		time.Sleep(time.Minute)
		os.Exit(0)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestParentDeathStopsServer$")
	cmd.Env = append(os.Environ(), "PGSERVER_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	var dir string
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "STARTED "); ok {
			dir = d
			break
		}
		t.Log("helper:", sc.Text())
	}
	if dir == "" {
		t.Fatal("helper did not start a server")
	}
	defer os.RemoveAll(dir)
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("postmaster %d not running: %v", pid, err)
	}

	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("postmaster %d still running 15s after its parent was killed", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestStartFailureShowsLog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{"no_such_setting": "1"}})
	if err == nil {
		s.Stop()
		t.Fatal("Start succeeded with a bogus setting")
	}
	t.Log(err)
	if !strings.Contains(err.Error(), `unrecognized configuration parameter "no_such_setting"`) {
		t.Errorf("error lacks the server log:\n%v", err)
	}
}
