package leasetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EtcdOptions configures StartEtcd. The zero value is fine.
type EtcdOptions struct {
	// Bin is the etcd binary; "" means etcd on PATH, else /usr/bin/etcd.
	Bin string
	// HeartbeatInterval and ElectionTimeout are etcd's raft timings; 0
	// means 50 ms and 500 ms, which make a single member elect itself
	// quickly and let etcd grant leases as short as 1 s (its minimum TTL
	// is 1.5 election timeouts, rounded up to whole seconds).
	HeartbeatInterval, ElectionTimeout time.Duration
	// StartTimeout bounds each start; 0 means 30 s.
	StartTimeout time.Duration
}

// Etcd is a running single-member etcd.
type Etcd struct {
	daemon
	DataDir    string
	ClientAddr string // 127.0.0.1:port

	bin     string
	args    []string
	timeout time.Duration
}

// StartEtcd starts etcd and returns once it reports healthy.
func StartEtcd(ctx context.Context, opt EtcdOptions) (_ *Etcd, err error) {
	bin := opt.Bin
	if bin == "" {
		bin = "etcd"
	}
	if bin, err = lookPath(bin, "/usr/bin/etcd"); err != nil {
		return nil, err
	}
	hb, el := opt.HeartbeatInterval, opt.ElectionTimeout
	if hb == 0 {
		hb = 50 * time.Millisecond
	}
	if el == 0 {
		el = 500 * time.Millisecond
	}
	timeout := opt.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	dir, err := os.MkdirTemp("", "pgfence-etcd-")
	if err != nil {
		return nil, fmt.Errorf("leasetest: %w", err)
	}
	e := &Etcd{daemon: daemon{Dir: dir}, DataDir: filepath.Join(dir, "data"), bin: bin, timeout: timeout}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if e.log, err = openLog(filepath.Join(dir, "etcd.log")); err != nil {
		return nil, fmt.Errorf("leasetest: %w", err)
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		e.ClientAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
		e.args = []string{
			"--name", "leasetest",
			"--data-dir", e.DataDir,
			"--listen-client-urls", client,
			"--advertise-client-urls", client,
			"--listen-peer-urls", peer,
			"--initial-advertise-peer-urls", peer,
			"--initial-cluster", "leasetest=" + peer,
			"--initial-cluster-state", "new",
			"--heartbeat-interval", strconv.FormatInt(hb.Milliseconds(), 10),
			"--election-timeout", strconv.FormatInt(el.Milliseconds(), 10),
			"--logger", "zap",
			"--log-outputs", "stderr",
		}
		err = e.Resume(ctx)
		if err == nil {
			return e, nil
		}
		if attempt == 3 || !strings.Contains(e.log.Tail(), "address already in use") {
			return nil, err
		}
		os.RemoveAll(e.DataDir)
	}
}

// Endpoints are the client URLs, for clientv3.Config.
func (e *Etcd) Endpoints() []string { return []string{"http://" + e.ClientAddr} }

// Halt stops etcd (SIGTERM), keeping its data and ports for Resume.
func (e *Etcd) Halt() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.proc.stop(10 * time.Second)
	e.proc = nil
}

// Resume starts a halted etcd again on the same ports and data and waits
// until it is healthy. A no-op if it is running.
func (e *Etcd) Resume(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.removed {
		return errors.New("leasetest: etcd Resume after Stop")
	}
	if e.proc != nil && !e.proc.exited() {
		return nil
	}
	cmd := exec.Command(e.bin, e.args...)
	cmd.Dir = e.Dir
	p, err := startProcess(cmd, e.log)
	if err != nil {
		return fmt.Errorf("leasetest: starting etcd: %w", err)
	}
	e.proc = p
	if err := e.waitHealthy(ctx, p); err != nil {
		p.stop(5 * time.Second)
		e.proc = nil
		return fmt.Errorf("leasetest: etcd on %s did not start: %w\n--- etcd log (tail) ---\n%s", e.ClientAddr, err, e.log.Tail())
	}
	return nil
}

// Restart is Halt then Resume.
func (e *Etcd) Restart(ctx context.Context) error {
	e.Halt()
	return e.Resume(ctx)
}

func (e *Etcd) waitHealthy(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e.ClientAddr+"/health", nil)
		resp, err := hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"health":"true"`) {
				return nil
			}
			err = fmt.Errorf("health: %s", strings.TrimSpace(string(b)))
		}
		last = err
		select {
		case <-p.done:
			return fmt.Errorf("etcd exited: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("not healthy after %v (last: %v)", e.timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StartEtcdT starts etcd for a test, stopped when the test ends. A missing
// etcd fails the test, naming the install script.
func StartEtcdT(t testing.TB) *Etcd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := StartEtcd(ctx, EtcdOptions{})
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Cleanup(e.Stop)
	return e
}
