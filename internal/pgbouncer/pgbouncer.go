// Package pgbouncer runs a throwaway PgBouncer in front of a Postgres, for
// tests and benchmarks: on a free port, with trust authentication, as the
// postgres OS user when run as root (PgBouncer refuses to run as root).
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/pgserver"
)

// Options says how to run PgBouncer.
type Options struct {
	// Upstream is Postgres's host:port.
	Upstream string
	// PoolMode is session, transaction or statement.
	PoolMode string
	// PoolSize is the server connections per database and user (default 2).
	PoolSize int
	// Extra lines for the [pgbouncer] section.
	Extra []string
	// Users are the roles besides postgres that clients may log in as.
	Users []string
}

// PgBouncer is a running PgBouncer.
type PgBouncer struct {
	Port int
	dir  string
	cmd  *exec.Cmd
	done chan error
}

// PID is PgBouncer's process.
func (b *PgBouncer) PID() int { return b.cmd.Process.Pid }

// Addr is where clients connect.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

// Binary returns the pgbouncer program, or an error saying how to install
// it (the Debian package pgbouncer).
func Binary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("pgbouncer is not installed: apt-get install -y pgbouncer")
}

// Start runs PgBouncer with opt until Stop, serving every database of the
// upstream under its own name.
func Start(ctx context.Context, opt Options) (*PgBouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	cred, err := pgserver.Credential()
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(opt.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream %q: %w", opt.Upstream, err)
	}
	if opt.PoolSize == 0 {
		opt.PoolSize = 2
	}
	dir, err := os.MkdirTemp("", "pgfence-pgbouncer-")
	if err != nil {
		return nil, err
	}
	own := func(p string) {
		if cred != nil {
			os.Chown(p, int(cred.Uid), int(cred.Gid))
		}
	}
	own(dir)
	listen, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %[4]s/userlist.txt
pool_mode = %s
default_pool_size = %d
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options
admin_users = postgres
pidfile = %[4]s/pgbouncer.pid
logfile = %[4]s/pgbouncer.log
%[7]s
`, host, port, listen, dir, opt.PoolMode, opt.PoolSize, strings.Join(opt.Extra, "\n"))
	for name, text := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": userList(opt.Users)} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		own(p)
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &PgBouncer{Port: listen, dir: dir, cmd: cmd, done: make(chan error, 1)}
	go func() { b.done <- cmd.Wait() }()
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			return b, nil
		}
		select {
		case err := <-b.done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer exited (%v): %s", err, log)
		case <-ctx.Done():
			b.Stop()
			return nil, fmt.Errorf("pgbouncer did not listen: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Log is PgBouncer's log so far.
func (b *PgBouncer) Log() string {
	log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(log)
}

// Stop ends PgBouncer and removes its files.
func (b *PgBouncer) Stop() {
	b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
	}
	os.RemoveAll(b.dir)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// userList is the auth file listing postgres and users, with no password
// (trust authentication).
func userList(users []string) string {
	var b strings.Builder
	for _, u := range append([]string{"postgres"}, users...) {
		fmt.Fprintf(&b, "%q \"\"\n", u)
	}
	return b.String()
}
