package main

// The processes a bench run starts (Postgres, PgBouncer, pgfence), on free
// loopback ports, and how they are stopped again.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgbouncer"
	"github.com/pgfence/pgfence/internal/pgserver"
)

// target is something pgbench connects to.
type target struct {
	name    string
	port    int
	pid     int    // the proxy's process, 0 for Postgres itself
	metrics string // pgfence's /metrics URL, "" otherwise
	clients int    // pgbench -c in interleave; 0 means the runner's default
	// fresh, if set, runs before and after each pgbench run so that it
	// starts on new Postgres backends and ends them, as runs through
	// pgfence and straight to Postgres do (see closeServers).
	fresh func() error
	env   []string // added to pgbench's environment
	tls   bool     // clients connect with sslmode=require
	// pids are more processes of the proxy (a PgBouncer fleet), whose
	// CPU is counted with pid's.
	pids []int
	// sampleLoops has each run read pgfence_loop_sessions halfway.
	sampleLoops bool
}

// cpuSeconds is the CPU time of the target's processes so far.
func (t target) cpuSeconds() (float64, error) {
	sum := 0.0
	for _, pid := range append([]int{t.pid}, t.pids...) {
		s, err := cpuSeconds(pid)
		if err != nil {
			return 0, err
		}
		sum += s
	}
	return sum, nil
}

// overTLS is t with pgbench's connections on TLS (sslmode=require, so a
// proxy that refused TLS would fail the run).
func overTLS(t target) target {
	t.name += ", TLS"
	t.env = append(t.env, "PGSSLMODE=require")
	t.tls = true
	return t
}

// service is a long-running child process.
type service struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// stop ends the process with SIGTERM (SIGKILL after 10 s) and waits.
func (s *service) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// startService starts cmd with its output in logPath; it dies with us.
func (r *runner) startService(name string, cmd *exec.Cmd, logPath string, cred *syscall.Credential) (*service, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	if cred != nil {
		os.Chown(logPath, int(cred.Uid), int(cred.Gid))
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred, Setsid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	s := &service{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(s.done) }()
	r.onCleanup(s.stop)
	return s, nil
}

// waitPort waits until addr accepts TCP connections or s exits.
func waitPort(s *service, addr, logPath string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s exited at start:\n%s", s.name, tail(logPath))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s does not listen on %s after 30 s:\n%s", s.name, addr, tail(logPath))
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// postgresCred is the postgres OS user, which PgBouncer runs as when we are
// root (it refuses to run as root, like Postgres).
func postgresCred() (*syscall.Credential, error) { return pgserver.Credential() }

// startPostgres starts a throwaway cluster sized for 1000+ connections.
func (r *runner) startPostgres() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{
		"max_connections": "1100",
		"shared_buffers":  "256MB",
		"max_wal_size":    "4GB", // no forced checkpoints mid-run
	}, OwnSession: true})
	if err != nil {
		return err
	}
	r.onCleanup(func() { pg.Stop() })
	r.pg = pg
	r.direct = target{name: "direct", port: pg.Port}
	return nil
}

// ensurePgBouncer returns the pgbouncer binary, installing the Debian
// package when it is missing and we are root.
func ensurePgBouncer() (string, error) {
	if p, err := pgbouncer.Binary(); err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("pgbouncer is not installed: apt-get install -y pgbouncer")
	}
	logf("installing pgbouncer (apt-get install -y pgbouncer)")
	cmd := exec.Command("apt-get", "install", "-y", "pgbouncer")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get install -y pgbouncer: %v\n%s", err, out)
	}
	return pgbouncer.Binary()
}

// startPgBouncer runs PgBouncer in session mode in front of Postgres, with
// trust auth, pools big enough for the 1000-connection test.
func (r *runner) startPgBouncer() error {
	bin, err := ensurePgBouncer()
	if err != nil {
		return err
	}
	cred, err := postgresCred()
	if err != nil {
		return err
	}
	dir := filepath.Join(r.tmp, "pgbouncer")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	tls := fmt.Sprintf("unix_socket_dir =\nclient_tls_sslmode = allow\nclient_tls_cert_file = %s\nclient_tls_key_file = %s\n", r.tlsCert, r.tlsKey)
	if err := r.writePgBouncerConfig(dir, port, cred, tls); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	s, err := r.startService("pgbouncer", exec.Command(bin, filepath.Join(dir, "pgbouncer.ini")), logPath, cred)
	if err != nil {
		return err
	}
	if err := waitPort(s, fmt.Sprintf("127.0.0.1:%d", port), logPath); err != nil {
		return err
	}
	r.pgbouncer = target{name: "PgBouncer", port: port, pid: s.cmd.Process.Pid,
		fresh: func() error { return closeServers(port) }}
	r.pgbouncerSvc = s
	return nil
}

// closeServers has the PgBouncer on port close its idle server connections
// and waits until they are gone.
//
// In session mode PgBouncer keeps a server connection when its client
// leaves, so every run through it after the first would start on backends
// warmed by earlier runs, while pgbench through pgfence or straight to
// Postgres gets new ones. A new backend takes a page fault for each page of
// shared buffers it first touches (about 0.45 faults per select-only
// transaction in a 3 s run, counted by hand, against 0.05 on a warm one),
// which is Postgres CPU, and so throughput, that has nothing to do with the
// proxy.
func closeServers(port int) error {
	return closeServersAt(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pgbouncer?sslmode=disable", port))
}

// closeServersAt is closeServers for the admin console at url.
func closeServersAt(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("PgBouncer admin console: %w", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "RECONNECT").ReadAll(); err != nil {
		return fmt.Errorf("PgBouncer RECONNECT: %w", err)
	}
	for {
		res, err := c.Exec(ctx, "SHOW SERVERS").ReadAll()
		if err != nil {
			return fmt.Errorf("PgBouncer SHOW SERVERS: %w", err)
		}
		if len(res) == 0 || len(res[0].Rows) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("PgBouncer still has %d server connections 30 s after RECONNECT", len(res[0].Rows))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startPgfence runs `pgfence serve` (or the profiling build) with extra
// flags, and waits for its proxy port and /healthz.
func (r *runner) startPgfence(name, bin string, extra ...string) (target, *service, error) {
	return r.startPgfenceEnv(name, bin, nil, extra...)
}

// startPgfenceEnv is startPgfence with env added to pgfence's environment.
func (r *runner) startPgfenceEnv(name, bin string, env []string, extra ...string) (target, *service, error) {
	port, err := freePort()
	if err != nil {
		return target{}, nil, err
	}
	mport, err := freePort()
	if err != nil {
		return target{}, nil, err
	}
	args := append([]string{"serve",
		"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--upstream", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", r.pg.Port),
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", mport),
		"--discover=false",
		"--max-client-conns", "1200",
	}, extra...)
	if !r.profBuild {
		// The catalog is read once, at start: pgfence keeps lock-domain
		// membership in the database (pgfence.domain_members) and every
		// instance applies it at each read, so with the default (every
		// minute) the row-only pgfence of the lock-domain section and the
		// storm would turn into a domain pgfence a minute after the domain
		// one recorded pgbench_accounts. (The profiling build has no such
		// flag, and never reads the catalog again.)
		args = append(args, "--discover-interval", "0")
	}
	logPath := filepath.Join(r.tmp, strings.NewReplacer(" ", "-", ",", "", "=", "-").Replace(name)+".log")
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	s, err := r.startService(name, cmd, logPath, nil)
	if err != nil {
		return target{}, nil, err
	}
	if err := waitPort(s, fmt.Sprintf("127.0.0.1:%d", port), logPath); err != nil {
		return target{}, nil, err
	}
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	if _, err := httpGet(strings.TrimSuffix(metrics, "/metrics") + "/healthz"); err != nil {
		return target{}, nil, fmt.Errorf("%s /healthz: %w", name, err)
	}
	return target{name: name, port: port, pid: s.cmd.Process.Pid, metrics: metrics}, s, nil
}

func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	var lastErr error
	for i := 0; i < 50; i++ {
		resp, err := c.Get(url)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == 200 {
				return string(b), nil
			}
			lastErr = fmt.Errorf("status %d, %v", resp.StatusCode, err)
		} else {
			lastErr = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "", lastErr
}

// counterSum adds up every series of a counter in /metrics text.
func counterSum(metricsURL, name string) (float64, error) {
	text, err := httpGet(metricsURL)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum, nil
}

// cpuSeconds is a process's CPU time so far, user and system, all threads.
// It sums each thread's exact on-CPU time from /proc/PID/task/*/schedstat
// (nanoseconds) rather than utime+stime, which the kernel samples at each
// tick: at 100 Hz a 3-second run counts a proxy's CPU to about 1 %, but the
// sampling adds run-to-run spread of a few percent, as large as the
// differences being measured. A thread that has exited is not counted;
// neither proxy ends threads while serving. Without schedstat (a kernel
// built without CONFIG_SCHED_INFO) it falls back to utime+stime.
func cpuSeconds(pid int) (float64, error) {
	if ns, err := schedstatNanos(pid); err == nil {
		return ns / 1e9, nil
	}
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return (utime + stime) / clockTicks, nil
}

// schedstatNanos is the sum of the on-CPU nanoseconds (the first field of
// schedstat) of a process's live threads.
func schedstatNanos(pid int) (float64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			return 0, err
		}
		first, _, _ := strings.Cut(string(b), " ")
		ns, err := strconv.ParseFloat(first, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/task/%s/schedstat: %q", pid, t.Name(), b)
		}
		sum += ns
	}
	return sum, nil
}

// postgresCPUSeconds is the CPU time of the whole Postgres server so far:
// the postmaster, its live children (backends, background processes), and
// the children it has already reaped (cutime+cstime). A backend that exits
// between the two reads can be missed or counted twice; runs leave 200 ms
// for backends to exit before reading, so this is rare and small.
func (r *runner) postgresCPUSeconds() (float64, error) {
	b, err := os.ReadFile(filepath.Join(r.pg.DataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %q", line)
	}
	var total float64
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(pid)
		if err != nil || (pid != pm && f[1] != strconv.Itoa(pm)) {
			continue
		}
		n := 2 // utime, stime
		if pid == pm {
			n = 4 // and cutime, cstime
		}
		for _, v := range f[11 : 11+n] {
			x, _ := strconv.ParseFloat(v, 64)
			total += x
		}
	}
	return total / clockTicks, nil
}

// statFields are the fields of /proc/PID/stat after the command name:
// [0] is state (field 3), [1] ppid, [11] utime (field 14), [12] stime,
// [13] cutime, [14] cstime.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return f, nil
}

// rssKiB is a process's resident set (VmRSS) in KiB.
func rssKiB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			return strconv.ParseFloat(f[0], 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// writeCert writes a self-signed P-256 certificate for 127.0.0.1 and its
// key into dir/tls, readable by PgBouncer (the postgres OS user when run
// as root), and returns their paths.
func writeCert(dir string) (certPath, keyPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "pgfence-bench"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	tdir := filepath.Join(dir, "tls")
	if err := os.Mkdir(tdir, 0o755); err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(tdir, "cert.pem"), filepath.Join(tdir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", err
	}
	cred, err := postgresCred()
	if err != nil {
		return "", "", err
	}
	if cred != nil {
		os.Chown(keyPath, int(cred.Uid), int(cred.Gid))
	}
	return certPath, keyPath, nil
}

// writePgBouncerConfig writes, in dir, the configuration of a PgBouncer
// in session mode on 127.0.0.1:port in front of the benchmark's Postgres,
// with extra lines of its own, and its user list, owned by cred's user
// (PgBouncer refuses to run as root).
func (r *runner) writePgBouncerConfig(dir string, port int, cred *syscall.Credential, extra string) error {
	ini := fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
auth_type = trust
auth_file = %[3]s/userlist.txt
pool_mode = session
max_client_conn = 1200
default_pool_size = 1050
max_db_connections = 0
ignore_startup_parameters = extra_float_digits
admin_users = postgres
log_connections = 0
log_disconnections = 0
pidfile = %[3]s/pgbouncer.pid
`, r.pg.Port, port, dir) + extra
	for name, text := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	if cred != nil {
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			os.Chown(p, int(cred.Uid), int(cred.Gid))
		}
	}
	return nil
}
