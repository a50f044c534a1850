package leasetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ZooKeeperOptions configures StartZooKeeper. The zero value is fine.
type ZooKeeperOptions struct {
	// Java is the java binary; "" means java on PATH, else /usr/bin/java.
	Java string
	// Jar is ZooKeeper's jar; "" means /usr/share/java/zookeeper.jar
	// (Debian's package; its manifest's Class-Path names the other jars).
	Jar string
	// TickTime is ZooKeeper's time unit; 0 means 100 ms.
	TickTime time.Duration
	// MinSessionTimeout and MaxSessionTimeout bound the session timeouts
	// the server grants; 0 means ZooKeeper's defaults (2 and 20 ticks).
	MinSessionTimeout, MaxSessionTimeout time.Duration
	// StartTimeout bounds the start; 0 means 60 s.
	StartTimeout time.Duration
}

// ZooKeeper is a running standalone ZooKeeper server.
type ZooKeeper struct {
	daemon
	Addr string // 127.0.0.1:port
}

// StartZooKeeper starts a standalone ZooKeeper (QuorumPeerMain with a
// config that names no peers) and returns once it answers "ruok".
func StartZooKeeper(ctx context.Context, opt ZooKeeperOptions) (_ *ZooKeeper, err error) {
	java := opt.Java
	if java == "" {
		java = "java"
	}
	if java, err = lookPath(java, "/usr/bin/java"); err != nil {
		return nil, err
	}
	jar := opt.Jar
	if jar == "" {
		jar = "/usr/share/java/zookeeper.jar"
	}
	if _, err := os.Stat(jar); err != nil {
		return nil, fmt.Errorf("%w: ZooKeeper jar %s: %v; %s", ErrNotInstalled, jar, err, InstallHint)
	}
	tick := opt.TickTime
	if tick == 0 {
		tick = 100 * time.Millisecond
	}
	timeout := opt.StartTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	dir, err := os.MkdirTemp("", "pgfence-zk-")
	if err != nil {
		return nil, fmt.Errorf("leasetest: %w", err)
	}
	z := &ZooKeeper{daemon: daemon{Dir: dir}}
	defer func() {
		if err != nil {
			z.Stop()
		}
	}()
	if z.log, err = openLog(filepath.Join(dir, "zookeeper.log")); err != nil {
		return nil, fmt.Errorf("leasetest: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("leasetest: %w", err)
	}

	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		z.Addr = "127.0.0.1:" + strconv.Itoa(ports[0])
		cfg := []string{
			"tickTime=" + strconv.FormatInt(tick.Milliseconds(), 10),
			"dataDir=" + filepath.Join(dir, "data"),
			"clientPort=" + strconv.Itoa(ports[0]),
			"clientPortAddress=127.0.0.1",
			"admin.enableServer=false",
			"4lw.commands.whitelist=ruok,srvr",
			"maxClientCnxns=0",
		}
		if opt.MinSessionTimeout > 0 {
			cfg = append(cfg, "minSessionTimeout="+strconv.FormatInt(opt.MinSessionTimeout.Milliseconds(), 10))
		}
		if opt.MaxSessionTimeout > 0 {
			cfg = append(cfg, "maxSessionTimeout="+strconv.FormatInt(opt.MaxSessionTimeout.Milliseconds(), 10))
		}
		cfgPath := filepath.Join(dir, "zoo.cfg")
		if err := os.WriteFile(cfgPath, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("leasetest: %w", err)
		}
		cmd := exec.Command(java,
			"-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-Dzookeeper.jmx.log4j.disable=true",
			"-cp", jar,
			"org.apache.zookeeper.server.quorum.QuorumPeerMain", cfgPath)
		cmd.Dir = dir
		p, err := startProcess(cmd, z.log)
		if err != nil {
			return nil, fmt.Errorf("leasetest: starting ZooKeeper: %w", err)
		}
		z.mu.Lock()
		z.proc = p
		z.mu.Unlock()
		err = waitRuok(ctx, z.Addr, p, timeout)
		if err == nil {
			return z, nil
		}
		p.stop(5 * time.Second)
		if attempt == 3 || !strings.Contains(z.log.Tail(), "Address already in use") {
			return nil, fmt.Errorf("leasetest: ZooKeeper on %s did not start: %w\n--- ZooKeeper output (tail) ---\n%s", z.Addr, err, z.log.Tail())
		}
	}
}

func waitRuok(ctx context.Context, addr string, p *process, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		last = ruok(addr)
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("java exited: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("no answer to ruok after %v (last: %v)", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ruok(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ruok")); err != nil {
		return err
	}
	b, err := io.ReadAll(c)
	if string(b) == "imok" {
		return nil
	}
	return fmt.Errorf("ruok: %q %v", b, err)
}

// StartZooKeeperT starts ZooKeeper for a test, stopped when the test ends.
// A missing ZooKeeper fails the test, naming the install script.
func StartZooKeeperT(t testing.TB, opt ZooKeeperOptions) *ZooKeeper {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	z, err := StartZooKeeper(ctx, opt)
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	t.Cleanup(z.Stop)
	return z
}
