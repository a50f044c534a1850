// Package pgserver runs a throwaway Postgres server for the demo and for
// tests: a fresh cluster in a temporary directory, listening on a free
// 127.0.0.1 port, tuned for speed over durability (fsync=off), and removed
// again by Stop.
//
// The server binaries are located with FindBinDir. When the calling process
// runs as root (common in CI containers), initdb and postgres run as the
// "postgres" OS user, since Postgres refuses to run as root.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgversion"
)

// Options configures Start. The zero value is fine.
type Options struct {
	// BinDir is the directory holding initdb and postgres. "" means
	// FindBinDir.
	BinDir string
	// Log receives the server's log output (stdout and stderr). nil means
	// a file, server.log, in the server's temporary directory; it is kept
	// out of the caller's stdout and is removed by Stop.
	Log io.Writer
	// Settings are extra server settings, passed as -c name=value. They
	// override the defaults Start uses (fsync=off, max_connections=200 ...).
	Settings map[string]string
	// Password, if set, becomes the password of the superuser "postgres",
	// and TCP connections must authenticate with scram-sha-256. Otherwise
	// every connection is trusted.
	Password string
	// HostAuth is the pg_hba method for TCP connections when Password is
	// set: "scram-sha-256" (the default) or "md5" (which still uses SCRAM
	// for roles whose password is stored as SCRAM).
	HostAuth string
	// TLSCert and TLSKey (PEM), if set, turn ssl on with that certificate.
	TLSCert, TLSKey []byte
	// StartTimeout bounds how long Start (and Resume) wait for the server
	// to accept connections. 0 means 30 seconds.
	StartTimeout time.Duration
	// OwnSession starts the postmaster in a session of its own (setsid),
	// as a server started by pg_ctl or a service manager runs: where
	// autogroup scheduling is on, that gives it a scheduling group of its
	// own rather than its starter's.
	OwnSession bool
}

// Server is a running throwaway Postgres server.
type Server struct {
	Host     string // always "127.0.0.1"
	Port     int
	User     string // always "postgres" (superuser)
	Password string // Options.Password

	Dir       string // the temporary directory; removed by Stop
	DataDir   string // the cluster's data directory (Dir/data)
	SocketDir string // Unix socket directory (Dir/sock)
	BinDir    string // where initdb and postgres were found

	opt     Options
	cred    *syscall.Credential // non-nil when running as root
	logFile *os.File            // when opt.Log == nil

	mu       sync.Mutex
	proc     *process      // the running postmaster, or nil
	lastTail func() string // log tail of the most recent run
	removed  bool
}

// process is one run of the postmaster.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result, valid after done is closed
	tail func() string // recent log output of this run
}

const (
	defaultStartTimeout = 30 * time.Second
	fastStopTimeout     = 10 * time.Second
	portAttempts        = 5
)

// errPortInUse marks a start that failed because another process grabbed
// the port between our probing it and the postmaster binding it.
var errPortInUse = errors.New("port already in use")

// Start creates a fresh cluster in a new temporary directory and starts a
// postmaster on a free 127.0.0.1 port, returning once it accepts
// connections. ctx bounds the start-up only; the server runs until Stop.
func Start(ctx context.Context, opt Options) (_ *Server, err error) {
	binDir := opt.BinDir
	if binDir == "" {
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if err := checkBinDir(binDir); err != nil {
		return nil, fmt.Errorf("pgserver: Options.BinDir %q is not usable: %v; %s", binDir, err, installHint)
	}

	cred, err := Credential()
	if err != nil {
		return nil, err
	}

	root, err := os.MkdirTemp(TempBase(cred != nil, 60), "pgfence-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	s := &Server{
		Host:      "127.0.0.1",
		User:      "postgres",
		Password:  opt.Password,
		Dir:       root,
		DataDir:   filepath.Join(root, "data"),
		SocketDir: filepath.Join(root, "sock"),
		BinDir:    binDir,
		opt:       opt,
		cred:      cred,
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()

	if err := os.Mkdir(s.SocketDir, 0o700); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	if opt.Log == nil {
		s.logFile, err = os.OpenFile(filepath.Join(root, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	}
	if cred != nil {
		for _, p := range []string{root, s.SocketDir} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("pgserver: handing %s to the postgres user: %w", p, err)
			}
		}
	}

	if err := s.initdb(ctx); err != nil {
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		if s.Port, err = freePort(); err != nil {
			return nil, err
		}
		err = s.launch(ctx)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return nil, err
		}
	}
}

// URL returns a connection URL for database db (e.g. "postgres").
func (s *Server) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		Host:     s.Addr(),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	if s.Password != "" {
		u.User = url.UserPassword(s.User, s.Password)
	} else {
		u.User = url.User(s.User)
	}
	return u.String()
}

// Version reads the running server's version (server_version_num).
func (s *Server) Version(ctx context.Context) (pgversion.Version, error) {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return 0, fmt.Errorf("pgserver: %w", err)
	}
	defer c.Close(context.Background())
	return pgversion.Read(ctx, c)
}

// Addr returns the server's TCP address, "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
}

// Stop shuts the server down (fast shutdown: SIGINT; after 10 s SIGQUIT,
// then SIGKILL), waits for it to exit and removes its temporary directory.
// It is idempotent and safe to call on a halted server.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return nil
	}
	s.removed = true
	err := s.halt(syscall.SIGINT)
	if s.logFile != nil {
		s.logFile.Close()
	}
	if rmErr := os.RemoveAll(s.Dir); rmErr != nil && err == nil {
		err = fmt.Errorf("pgserver: removing %s: %w", s.Dir, rmErr)
	}
	return err
}

// Halt stops the postmaster (fast shutdown) but keeps the data directory
// and the port reservation, so Resume can start it again. Clients are
// disconnected with SQLSTATE 57P01 (admin_shutdown). A no-op if the server
// is not running.
func (s *Server) Halt() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.halt(syscall.SIGINT)
}

// Crash stops the postmaster with an immediate shutdown (SIGQUIT): backends
// are killed without a checkpoint, and the next Resume runs crash recovery.
// Use it to simulate the database going away abruptly.
func (s *Server) Crash() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.halt(syscall.SIGQUIT)
}

// Resume starts a halted (or crashed) server again on the same port and
// data directory, returning once it accepts connections. A no-op if the
// server is running.
func (s *Server) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return errors.New("pgserver: Resume after Stop")
	}
	if s.proc != nil {
		select {
		case <-s.proc.done:
			s.proc = nil // it died on its own; start it again
		default:
			return nil
		}
	}
	// The port was just released by our own postmaster, so a bind failure
	// is most likely transient (a dying backend still holding shared
	// memory, say): retry briefly.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = s.launch(ctx); err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

// Restart is Halt followed by Resume: same port, same data.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Halt(); err != nil {
		return err
	}
	return s.Resume(ctx)
}

// LogTail returns the most recent server log output (up to a few KiB) of
// the current or last run, for diagnostics.
func (s *Server) LogTail() string {
	s.mu.Lock()
	tail := s.lastTail
	s.mu.Unlock()
	if tail == nil {
		return ""
	}
	return tail()
}

// halt stops the running postmaster, if any, by sending sig, escalating to
// SIGQUIT and SIGKILL if it does not exit in time. s.mu must be held.
func (s *Server) halt(sig syscall.Signal) error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	select {
	case <-p.done:
		return nil // already gone (crashed or killed by someone else)
	default:
	}
	steps := []struct {
		sig     os.Signal
		timeout time.Duration
	}{
		{sig, fastStopTimeout},
		{syscall.SIGQUIT, 5 * time.Second},
		{os.Kill, 5 * time.Second},
	}
	for _, st := range steps {
		if err := p.cmd.Process.Signal(st.sig); err != nil {
			// Most likely the process has just exited.
			if errors.Is(err, os.ErrProcessDone) {
				<-p.done
				return nil
			}
		}
		select {
		case <-p.done:
			return nil
		case <-time.After(st.timeout):
		}
	}
	return fmt.Errorf("pgserver: postmaster (pid %d) did not exit after SIGKILL", p.cmd.Process.Pid)
}

// initdb creates the cluster in s.DataDir.
func (s *Server) initdb(ctx context.Context) error {
	args := []string{
		"-D", s.DataDir,
		"-U", s.User,
		"--no-sync",
		"-E", "UTF8",
		"--locale=C",
	}
	if s.Password != "" {
		pwfile := filepath.Join(s.Dir, "pwfile")
		if err := os.WriteFile(pwfile, []byte(s.Password+"\n"), 0o600); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		defer os.Remove(pwfile)
		if s.cred != nil {
			if err := os.Chown(pwfile, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgserver: %w", err)
			}
		}
		auth := s.opt.HostAuth
		if auth == "" {
			auth = "scram-sha-256"
		}
		args = append(args, "--pwfile="+pwfile, "--auth-local=trust", "--auth-host="+auth)
	} else {
		args = append(args, "--auth=trust")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(s.BinDir, "initdb"), args...)
	s.prepare(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgserver: initdb failed: %v\n%s", err, lastBytes(out, 4096))
	}
	return s.writeTLS()
}

// writeTLS puts the server's certificate and key in the data directory,
// owned by the server's user, and turns ssl on.
func (s *Server) writeTLS() error {
	if s.opt.TLSCert == nil {
		return nil
	}
	for name, data := range map[string][]byte{"server.crt": s.opt.TLSCert, "server.key": s.opt.TLSKey} {
		path := filepath.Join(s.DataDir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if s.cred != nil {
			if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgserver: %w", err)
			}
		}
	}
	if s.opt.Settings == nil {
		s.opt.Settings = map[string]string{}
	}
	s.opt.Settings["ssl"] = "on"
	return nil
}

// prepare sets what initdb and postgres have in common: working
// directory, environment, credentials and parent-death signal.
func (s *Server) prepare(cmd *exec.Cmd) {
	cmd.Dir = s.Dir
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		// Keep the caller's libpq environment (PGDATA, PGPORT, ...) from
		// leaking into the server.
		if strings.HasPrefix(kv, "PG") {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// If the process that started the server dies (a killed test
		// binary), take the server down with it (immediate shutdown).
		Pdeathsig:  syscall.SIGQUIT,
		Credential: s.cred,
		Setsid:     s.opt.OwnSession,
	}
}

// launch starts the postmaster on s.Port and waits until it accepts
// connections. s.mu must be held (or s not yet shared).
func (s *Server) launch(ctx context.Context) error {
	settings := map[string]string{
		"listen_addresses":   s.Host,
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"max_connections":    "200",
	}
	for k, v := range s.opt.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", s.DataDir, "-p", strconv.Itoa(s.Port), "-k", s.SocketDir}
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}

	cmd := exec.Command(filepath.Join(s.BinDir, "postgres"), args...)
	s.prepare(cmd)
	p := &process{cmd: cmd, done: make(chan struct{})}
	if s.logFile != nil {
		off, _ := s.logFile.Seek(0, io.SeekEnd)
		cmd.Stdout, cmd.Stderr = s.logFile, s.logFile
		name := s.logFile.Name()
		p.tail = func() string { return fileTail(name, off) }
	} else {
		tb := &tailBuffer{max: 8192}
		w := &lockedWriter{w: io.MultiWriter(s.opt.Log, tb)}
		cmd.Stdout, cmd.Stderr = w, w
		// Backends inherit the pipe; don't let Wait hang on a straggler.
		cmd.WaitDelay = 5 * time.Second
		p.tail = tb.String
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: starting postgres: %w", err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	s.lastTail = p.tail

	if err := s.waitReady(ctx, p); err != nil {
		s.halt(syscall.SIGQUIT)
		tail := p.tail()
		if strings.Contains(tail, "Address already in use") || strings.Contains(tail, "could not bind") {
			err = fmt.Errorf("%w: %v", errPortInUse, err)
		}
		return fmt.Errorf("pgserver: postgres on port %d did not start: %w\n--- server log (tail) ---\n%s", s.Port, err, tail)
	}
	return nil
}

// waitReady polls the server with pgx.Connect until it accepts a
// connection, the postmaster exits, or the start timeout expires.
func (s *Server) waitReady(ctx context.Context, p *process) error {
	timeout := s.opt.StartTimeout
	if timeout <= 0 {
		timeout = defaultStartTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("postmaster exited: %v", p.err)
		default:
		}
		cfg, err := pgx.ParseConfig(s.URL("postgres"))
		if err != nil {
			return err
		}
		cfg.ConnectTimeout = 2 * time.Second
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		lastErr = err
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code != "57P03" { // 57P03: cannot_connect_now (starting up)
			// The server is up but rejects us: waiting will not help.
			return err
		}
		select {
		case <-p.done:
			return fmt.Errorf("postmaster exited: %v", p.err)
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("not accepting connections after %v (last error: %v)", timeout, lastErr)
			}
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Credential returns the credential to run Postgres (or PgBouncer, or
// Patroni, which refuse root too) with: nil when not root, else the
// "postgres" OS user.
func Credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root, which Postgres refuses, and there is no OS user \"postgres\" to run it as (%v); "+
			"create one (`useradd --system --user-group --home-dir /var/lib/postgresql postgres`; `apt-get install postgresql` does this) or run as a non-root user", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: user postgres has non-numeric uid %q", u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: user postgres has non-numeric gid %q", u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// TempBase picks the parent for a temporary directory: os.TempDir(),
// unless its path is longer than maxLen (so that the Unix socket paths
// under it would exceed the kernel's ~107-byte limit), or (when it is
// handed to the postgres user) some ancestor is not searchable by others;
// then /tmp.
func TempBase(otherUser bool, maxLen int) string {
	base := os.TempDir()
	if len(base) > maxLen {
		return "/tmp"
	}
	if otherUser {
		abs, err := filepath.Abs(base)
		if err != nil {
			return "/tmp"
		}
		for p := abs; ; p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil || fi.Mode().Perm()&0o001 == 0 {
				return "/tmp"
			}
			if p == filepath.Dir(p) {
				break
			}
		}
	}
	return base
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another
// process may take it before the postmaster binds it; Start retries.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// fileTail returns up to 4 KiB of the end of file name, starting no
// earlier than offset off.
func fileTail(name string, off int64) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if start := fi.Size() - 4096; start > off {
		off = start
	}
	if off > fi.Size() {
		off = 0
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	return string(b)
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// lockedWriter serializes writes (exec uses one goroutine per distinct
// writer; the lock keeps the caller's writer safe regardless).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
