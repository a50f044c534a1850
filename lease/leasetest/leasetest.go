// Package leasetest runs throwaway lock servers for tests and for the
// torture check: etcd and ZooKeeper from their Debian packages, each on
// free 127.0.0.1 ports with a temporary data directory that Stop removes,
// and Relay, a TCP hop that can delay or cut off a link.
//
// The servers come from scripts/install-lease-deps.sh (Debian packages
// etcd-server and zookeeper). When one is missing, Start fails with an
// error naming that script: tests must fail, not skip, without them.
package leasetest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// InstallHint says how to install the lock servers.
const InstallHint = "install them with `bash scripts/install-lease-deps.sh` (Debian packages etcd-server and zookeeper)"

// ErrNotInstalled is wrapped by Start errors when a server's binary or jar
// is missing.
var ErrNotInstalled = errors.New("lock server not installed")

// freePorts asks the kernel for n distinct free TCP ports on 127.0.0.1.
// Another process may take one before the server binds it; callers retry.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("leasetest: finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// process is one run of a server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProcess(cmd *exec.Cmd, log io.Writer) (*process, error) {
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A killed test binary takes its servers with it.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true,
	}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the exit.
func (p *process) stop(grace time.Duration) {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.cmd.Process.Kill()
	<-p.done
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// daemon is what the servers here have in common: a process, its output
// and a temporary directory.
type daemon struct {
	Dir     string // temporary directory, removed by Stop
	log     *logFile
	mu      sync.Mutex
	proc    *process
	removed bool
}

// Stop stops the server and removes its directory. Idempotent.
func (d *daemon) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.removed {
		return
	}
	d.removed = true
	d.proc.stop(10 * time.Second)
	d.proc = nil
	if d.log != nil {
		d.log.Close()
	}
	os.RemoveAll(d.Dir)
}

// LogTail is the end of the server's output, for diagnostics.
func (d *daemon) LogTail() string { return d.log.Tail() }

// logFile is a server's log, kept in its directory; Tail reads its end
// for error messages.
type logFile struct {
	mu sync.Mutex
	f  *os.File
}

func openLog(path string) (*logFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &logFile{f: f}, nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

func (l *logFile) Tail() string {
	b, err := os.ReadFile(l.f.Name())
	if err != nil {
		return ""
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimSpace(string(b))
}

func (l *logFile) Close() { l.f.Close() }

// lookPath finds a program: name itself if it is a path, else on PATH or
// at one of the fallback paths.
func lookPath(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: %s is not an executable file; %s", ErrNotInstalled, name, InstallHint)
	}
	for _, p := range fallbacks {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s not found on PATH or at %s; %s", ErrNotInstalled, name, strings.Join(fallbacks, ", "), InstallHint)
}
