// Package patroni runs a throwaway Patroni-managed Postgres cluster for
// failover tests: a primary and one streaming standby, each a Patroni node
// (the Debian patroni package, see scripts/install-patroni.sh) on free
// 127.0.0.1 ports with its own temporary directory, coordinated through an
// etcd the caller provides (lease/leasetest.StartEtcd starts one).
//
// Start returns once there is a leader that accepts writes and the standby
// streams from it. Failover (a planned switchover with patronictl) and
// KillLeader (SIGKILL of the leader's Patroni and postmaster, an unplanned
// failover) move the leadership to the other node and return once the
// cluster is whole again. Stop removes everything.
//
// Authentication is trust on loopback: the superuser is "postgres" and
// the standby replicates as "replicator", neither with a password. The
// Postgres server binaries are located with pgserver.FindBinDir. When the
// calling process runs as root, Patroni (and so Postgres) runs as the
// "postgres" OS user, which owns the data directories.
//
// Nothing outlives the test process: each Patroni gets a parent-death
// signal, and a small watchdog process (which Patroni's detached
// postmasters cannot escape) kills whatever still runs from the cluster's
// directory and removes it when Stop is called or the test process dies.
package patroni

import (
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
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/pgfence/pgfence/internal/netfault"
	"github.com/pgfence/pgfence/internal/pgserver"
)

// InstallHint says how to install Patroni.
const InstallHint = "install it with `bash scripts/install-patroni.sh` (Debian package patroni)"

// ErrNotInstalled is wrapped by Start's error when patroni or patronictl
// is missing.
var ErrNotInstalled = errors.New("patroni not installed")

// Patroni's timing (seconds), deliberately small so that an unplanned
// failover takes seconds: the leader key lives ttl seconds unless renewed,
// each node runs its HA loop every loopWait seconds, and DCS and Postgres
// operations are retried for retryTimeout seconds (Patroni wants
// loop_wait + 2*retry_timeout <= ttl).
const (
	ttl          = 10
	loopWait     = 1
	retryTimeout = 4
)

const (
	// defaultTimeout bounds Start, Failover and KillLeader when their
	// context has no deadline.
	defaultTimeout = 3 * time.Minute
	// namespace is the etcd key prefix of every cluster; each cluster's
	// keys live under namespace + scope.
	namespace = "/pgfence-patroni/"
	// replicationUser is the role the standby streams as.
	replicationUser = "replicator"
	nodeCount       = 2
	startAttempts   = 3
)

// clusterSeq numbers the clusters this process starts, for unique scopes.
var clusterSeq atomic.Int64

// Options configures Start. The zero value is fine.
type Options struct {
	// Synchronous turns on Patroni's synchronous_mode and
	// synchronous_mode_strict: the standby is a synchronous standby, a
	// commit on the leader waits until the standby has flushed it, and
	// with the standby down commits wait rather than go ahead alone. Only
	// the synchronous standby can be promoted, so no acknowledged commit
	// is lost in a failover.
	Synchronous bool
	// Settings are extra Postgres parameters (name -> value), set in
	// Patroni's cluster-wide configuration for both nodes. They override
	// the defaults (fsync=off, max_connections=200,
	// wal_retrieve_retry_interval=500ms).
	Settings map[string]string
	// ReplicationLink puts a relay (netfault.Relay) in front of each
	// node's Postgres and gives Patroni its address as the node's
	// connect_address, which the standby streams from: PartitionReplication
	// can then hold the WAL the standby would get.
	ReplicationLink bool
}

// Cluster is a running two-node Patroni cluster.
type Cluster struct {
	// Scope is the Patroni cluster name, unique per Start; the cluster's
	// etcd keys are under Namespace + Scope + "/".
	Scope     string
	Namespace string
	// Dir is the temporary directory holding the nodes' directories;
	// removed by Stop.
	Dir string

	opt        Options
	binDir     string
	patroniBin string
	ctlBin     string
	cred       *syscall.Credential // non-nil when running as root
	nodes      []*Node

	opMu sync.Mutex // serializes Failover, KillLeader and Stop

	mu       sync.Mutex // guards the fields below and Node.proc
	stopped  bool
	watchdog *process
	wdStdin  io.WriteCloser
}

// Node is one Patroni node: a Patroni daemon and the Postgres it manages.
type Node struct {
	Name       string // Patroni member name: "node0", "node1"
	Port       int    // Postgres port on 127.0.0.1
	APIPort    int    // Patroni REST API port on 127.0.0.1
	Dir        string // the node's directory (config, log, data)
	DataDir    string // Postgres data directory (Dir/data)
	ConfigFile string // Patroni config (Dir/patroni.yml), for patronictl -c

	c       *Cluster
	link    *netfault.Relay // with Options.ReplicationLink
	logPath string
	log     *os.File
	proc    *process // the running Patroni, or nil; guarded by c.mu
}

// connectAddr is where the other node reaches n's Postgres: its relay with
// Options.ReplicationLink.
func (n *Node) connectAddr() string {
	if n.link != nil {
		return n.link.Addr()
	}
	return n.Addr()
}

// PartitionReplication holds every byte between the standby and the
// leader (Options.ReplicationLink): WAL the leader writes from now on does
// not reach the standby. KillLeader ends it, dropping what it held, once
// the leader is dead: that WAL is then lost with the leader, as on a
// network partition before a crash.
func (c *Cluster) PartitionReplication() {
	for _, n := range c.nodes {
		if n.link != nil {
			n.link.Partition()
		}
	}
}

// healReplication ends a partition, dropping what it held.
func (c *Cluster) healReplication() {
	for _, n := range c.nodes {
		if n.link != nil {
			n.link.Cut()
			n.link.Heal()
		}
	}
}

// Addr returns the node's Postgres address, "127.0.0.1:port".
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// URL returns a connection URL for database db on this node, as the
// superuser postgres (trust authentication, no TLS).
func (n *Node) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     n.Addr(),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// APIURL returns the base URL of the node's Patroni REST API.
func (n *Node) APIURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.APIPort))
}

func (n *Node) String() string { return n.Name }

// process is one run of a child process.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result, valid once done is closed
}

func startProcess(cmd *exec.Cmd) (*process, error) {
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

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	if p == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
}

// Start starts a two-node Patroni cluster registered in the etcd at
// etcdEndpoints (URLs such as "http://127.0.0.1:2379", or host:port; etcd's
// v3 API is used) and returns once a leader accepts writes and the standby
// streams from it (and, with Options.Synchronous, is its synchronous
// standby). ctx bounds the start-up (3 minutes if it has no deadline); the
// cluster runs until Stop.
func Start(ctx context.Context, etcdEndpoints []string, opt Options) (*Cluster, error) {
	if len(etcdEndpoints) == 0 {
		return nil, errors.New("patroni: no etcd endpoints")
	}
	hosts, protocol, err := etcdHosts(etcdEndpoints)
	if err != nil {
		return nil, err
	}
	patroniBin, err := lookPath("patroni")
	if err != nil {
		return nil, err
	}
	ctlBin, err := lookPath("patronictl")
	if err != nil {
		return nil, err
	}
	binDir, err := pgserver.FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := pgserver.Credential()
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()

	for attempt := 1; ; attempt++ {
		c := &Cluster{
			Namespace:  namespace,
			opt:        opt,
			binDir:     binDir,
			patroniBin: patroniBin,
			ctlBin:     ctlBin,
			cred:       cred,
		}
		err := c.start(ctx, hosts, protocol)
		if err == nil {
			return c, nil
		}
		// A port we picked may have been taken by another process before
		// Patroni or Postgres bound it: try again with fresh ports.
		clash := strings.Contains(c.rawLogs(), "Address already in use")
		err = fmt.Errorf("patroni: starting cluster %s: %w\n%s", c.Scope, err, c.Logs())
		c.Stop()
		if !clash || attempt == startAttempts || ctx.Err() != nil {
			return nil, err
		}
	}
}

// start sets up c's directories and configs and starts its nodes.
func (c *Cluster) start(ctx context.Context, etcdHosts []string, etcdProtocol string) error {
	c.Scope = fmt.Sprintf("pgfence-%d-%d-%s", os.Getpid(), clusterSeq.Add(1), strconv.FormatInt(time.Now().UnixNano()%1e12, 36))
	dir, err := os.MkdirTemp(pgserver.TempBase(c.cred != nil, 50), "pgfence-patroni-")
	if err != nil {
		return err
	}
	c.Dir = dir
	if err := c.chown(dir); err != nil {
		return err
	}
	// The watchdog first, so that it cleans up whatever gets started.
	if err := c.startWatchdog(); err != nil {
		return fmt.Errorf("starting the watchdog: %w", err)
	}

	ports, err := freePorts(2 * nodeCount)
	if err != nil {
		return err
	}
	for i := 0; i < nodeCount; i++ {
		name := "node" + strconv.Itoa(i)
		nd := filepath.Join(dir, name)
		n := &Node{
			Name:       name,
			Port:       ports[2*i],
			APIPort:    ports[2*i+1],
			Dir:        nd,
			DataDir:    filepath.Join(nd, "data"),
			ConfigFile: filepath.Join(nd, "patroni.yml"),
			c:          c,
			logPath:    filepath.Join(nd, "patroni.log"),
		}
		c.nodes = append(c.nodes, n)
		if c.opt.ReplicationLink {
			if n.link, err = netfault.NewRelay(n.Addr()); err != nil {
				return err
			}
		}
		if err := os.Mkdir(nd, 0o700); err != nil {
			return err
		}
		if err := c.chown(nd); err != nil {
			return err
		}
		if n.log, err = os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return err
		}
		cfg, err := yaml.Marshal(c.config(n, etcdHosts, etcdProtocol))
		if err != nil {
			return err
		}
		if err := os.WriteFile(n.ConfigFile, cfg, 0o644); err != nil {
			return err
		}
	}
	for _, n := range c.nodes {
		if err := c.startNode(n); err != nil {
			return err
		}
	}
	_, err = c.waitHealthy(ctx, nil)
	return err
}

// config is node n's Patroni configuration.
func (c *Cluster) config(n *Node, etcdHosts []string, etcdProtocol string) map[string]any {
	params := map[string]any{
		"fsync":           "off",
		"max_connections": "200",
		// A standby whose replication slot does not exist yet (Patroni
		// creates it on the leader's next HA loop) retries after this
		// rather than the default 5 s.
		"wal_retrieve_retry_interval": "500ms",
	}
	for k, v := range c.opt.Settings {
		params[k] = v
	}
	dcs := map[string]any{
		"ttl":                     ttl,
		"loop_wait":               loopWait,
		"retry_timeout":           retryTimeout,
		"maximum_lag_on_failover": 16 << 20,
		"synchronous_mode":        c.opt.Synchronous,
		"synchronous_mode_strict": c.opt.Synchronous,
		"postgresql": map[string]any{
			"use_pg_rewind": true,
			"use_slots":     true,
			"parameters":    params,
		},
	}
	hba := []string{
		"local all all trust",
		"host all all 127.0.0.1/32 trust",
		"host replication all 127.0.0.1/32 trust",
	}
	return map[string]any{
		"scope":     c.Scope,
		"namespace": c.Namespace,
		"name":      n.Name,
		"log":       map[string]any{"level": "INFO"},
		"restapi": map[string]any{
			"listen":          net.JoinHostPort("127.0.0.1", strconv.Itoa(n.APIPort)),
			"connect_address": net.JoinHostPort("127.0.0.1", strconv.Itoa(n.APIPort)),
		},
		"etcd3": map[string]any{
			"hosts":    etcdHosts,
			"protocol": etcdProtocol,
		},
		"bootstrap": map[string]any{
			"dcs": dcs,
			"initdb": []any{
				map[string]any{"encoding": "UTF8"},
				map[string]any{"locale": "C"},
				map[string]any{"auth": "trust"},
				"no-sync",
			},
		},
		"postgresql": map[string]any{
			"listen":          n.Addr(),
			"connect_address": n.connectAddr(),
			"data_dir":        n.DataDir,
			"bin_dir":         c.binDir,
			"pgpass":          filepath.Join(n.Dir, "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]any{"username": "postgres"},
				"replication": map[string]any{"username": replicationUser},
				"rewind":      map[string]any{"username": "postgres"},
			},
			"parameters": map[string]any{
				"unix_socket_directories": n.Dir,
			},
			"pg_hba":     hba,
			"basebackup": []any{map[string]any{"checkpoint": "fast"}},
			// A killed leader that cannot be rewound rejoins by a fresh
			// base backup instead of staying down.
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
		},
		"watchdog": map[string]any{"mode": "off"},
	}
}

// startNode starts n's Patroni. The caller must not hold c.mu.
func (c *Cluster) startNode(n *Node) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("patroni: cluster stopped")
	}
	if n.proc != nil && !n.proc.exited() {
		return nil
	}
	cmd := exec.Command(c.patroniBin, n.ConfigFile)
	cmd.Dir = n.Dir
	cmd.Env = append(cleanEnv(), "HOME="+n.Dir)
	// An *os.File, not a pipe: the postmaster Patroni starts inherits it
	// and outlives Patroni.
	cmd.Stdout, cmd.Stderr = n.log, n.log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A killed test binary takes Patroni with it (its postmaster is
		// detached; the watchdog takes care of that).
		Pdeathsig:  syscall.SIGKILL,
		Setpgid:    true,
		Credential: c.cred,
	}
	fmt.Fprintf(n.log, "=== pgfence: starting %s (REST API :%d, postgres :%d) at %s\n",
		n.Name, n.APIPort, n.Port, time.Now().Format(time.RFC3339Nano))
	p, err := startProcess(cmd)
	if err != nil {
		return fmt.Errorf("patroni: starting %s: %w", n.Name, err)
	}
	n.proc = p
	return nil
}

// Nodes returns the cluster's nodes, node0 and node1.
func (c *Cluster) Nodes() []*Node { return append([]*Node(nil), c.nodes...) }

// other returns the node that is not n.
func (c *Cluster) other(n *Node) *Node {
	for _, m := range c.nodes {
		if m != n {
			return m
		}
	}
	return nil
}

// HostsURL returns a connection URL for database db listing both nodes,
// with target_session_attrs=read-write, so a client connects to whichever
// is the primary.
func (c *Cluster) HostsURL(db string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = n.Addr()
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + url.PathEscape(db) +
		"?sslmode=disable&target_session_attrs=read-write"
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// Leader asks the nodes' Patroni REST APIs (GET /primary) which one holds
// the leader lock and runs as primary. It does not wait: during a failover
// there may be none, which is an error.
func (c *Cluster) Leader(ctx context.Context) (*Node, error) {
	var errs []string
	var found []*Node
	for _, n := range c.nodes {
		st, err := n.apiStatus(ctx, "/primary")
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", n.Name, err))
			continue
		}
		if st.code == http.StatusOK {
			found = append(found, n)
		} else {
			errs = append(errs, fmt.Sprintf("%s: %s %s", n.Name, st.Role, st.State))
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, fmt.Errorf("patroni: no leader (%s)", strings.Join(errs, "; "))
	default:
		return nil, fmt.Errorf("patroni: more than one leader: %v", found)
	}
}

// nodeStatus is the part of Patroni's GET /primary (and /patroni) answer
// we use.
type nodeStatus struct {
	code     int
	State    string `json:"state"` // "running", "starting", ...
	Role     string `json:"role"`  // "master"/"primary", "replica"
	Timeline int    `json:"timeline"`
}

func (n *Node) apiStatus(ctx context.Context, path string) (nodeStatus, error) {
	var st nodeStatus
	req, err := http.NewRequestWithContext(ctx, "GET", n.APIURL()+path, nil)
	if err != nil {
		return st, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	st.code = resp.StatusCode
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("GET %s: status %d, %v", path, resp.StatusCode, err)
	}
	return st, nil
}

// clusterMember is one member in Patroni's GET /cluster answer.
type clusterMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // "leader", "replica", "sync_standby"
	State    string `json:"state"` // "running", "streaming", "stopped", ...
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"`
}

func (n *Node) clusterView(ctx context.Context) ([]clusterMember, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", n.APIURL()+"/cluster", nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Members []clusterMember `json:"members"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
		return nil, fmt.Errorf("GET /cluster: status %d, %v", resp.StatusCode, err)
	}
	return v.Members, nil
}

// waitHealthy waits until the cluster is whole: a leader (want, if not
// nil) that Patroni reports as primary, out of recovery and committing a
// write, with every other node streaming from it (in synchronous mode, as
// the synchronous standby, in Postgres and in Patroni's view). It returns
// the leader.
func (c *Cluster) waitHealthy(ctx context.Context, want *Node) (*Node, error) {
	var last error
	for {
		leader, err := c.checkHealthy(ctx, want)
		if err == nil {
			return leader, nil
		}
		last = err
		for _, n := range c.nodes {
			c.mu.Lock()
			p := n.proc
			c.mu.Unlock()
			if p != nil && p.exited() {
				return nil, fmt.Errorf("patroni on %s exited: %v", n.Name, p.err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster not healthy: %w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) checkHealthy(ctx context.Context, want *Node) (*Node, error) {
	leader, err := c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	if want != nil && leader != want {
		return nil, fmt.Errorf("leader is %s, waiting for %s", leader.Name, want.Name)
	}
	members, err := leader.clusterView(ctx)
	if err != nil {
		return nil, err
	}
	roles := map[string]clusterMember{}
	for _, m := range members {
		roles[m.Name] = m
	}
	for _, n := range c.nodes {
		m, ok := roles[n.Name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%s not in the cluster yet", n.Name)
		case n == leader:
			if m.Role != "leader" || m.State != "running" {
				return nil, fmt.Errorf("leader %s is %s/%s", n.Name, m.Role, m.State)
			}
		case c.opt.Synchronous && m.Role != "sync_standby":
			return nil, fmt.Errorf("%s is %s, not the synchronous standby yet", n.Name, m.Role)
		case m.State != "running" && m.State != "streaming":
			return nil, fmt.Errorf("standby %s is %s", n.Name, m.State)
		}
	}

	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := connect(pctx, leader.URL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var inRecovery bool
	if err := conn.QueryRow(pctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return nil, err
	}
	if inRecovery {
		return nil, fmt.Errorf("leader %s is still in recovery", leader.Name)
	}
	rows, err := conn.Query(pctx, "SELECT application_name, state, sync_state FROM pg_stat_replication")
	if err != nil {
		return nil, err
	}
	repl := map[string][2]string{}
	for rows.Next() {
		var name, state, sync string
		if err := rows.Scan(&name, &state, &sync); err != nil {
			return nil, err
		}
		repl[name] = [2]string{state, sync}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if n == leader {
			continue
		}
		r, ok := repl[n.Name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%s is not replicating from %s", n.Name, leader.Name)
		case r[0] != "streaming":
			return nil, fmt.Errorf("%s is %s, not streaming", n.Name, r[0])
		case c.opt.Synchronous && r[1] != "sync":
			return nil, fmt.Errorf("%s is %s, not sync", n.Name, r[1])
		}
	}
	// A write: txid_current assigns a transaction id, so the commit writes
	// WAL (and, in synchronous mode, waits for the standby).
	if _, err := conn.Exec(pctx, "SELECT txid_current()"); err != nil {
		return nil, fmt.Errorf("write on %s: %w", leader.Name, err)
	}
	return leader, nil
}

func connect(ctx context.Context, connURL string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 2 * time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

// Failover makes the standby the leader with a planned switchover
// (patronictl switchover --force, with the leader's config) and returns
// it once it accepts writes and the old leader streams from it again (in
// synchronous mode, as its synchronous standby). ctx bounds the wait (3
// minutes if it has no deadline).
func (c *Cluster) Failover(ctx context.Context) (newLeader *Node, err error) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := c.checkRunning(); err != nil {
		return nil, err
	}
	// The candidate must be a healthy (synchronous) standby, or Patroni
	// refuses the switchover.
	old, err := c.waitHealthy(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("patroni: before switchover: %w\n%s", err, c.Logs())
	}
	cand := c.other(old)
	out, ctlErr := c.patronictl(ctx, old, "switchover", c.Scope,
		"--leader", old.Name, "--candidate", cand.Name, "--force")
	if ctlErr != nil {
		return nil, fmt.Errorf("patroni: patronictl switchover %s -> %s: %v\n%s\n%s", old.Name, cand.Name, ctlErr, out, c.Logs())
	}
	// patronictl exits 0 even when the switchover failed ("Switchover
	// failed, details: ..."); the REST API may also time out on a
	// switchover that still completes. Either way, the cluster decides.
	if _, err := c.waitHealthy(ctx, cand); err != nil {
		return nil, fmt.Errorf("patroni: switchover %s -> %s: %w\n--- patronictl ---\n%s\n%s", old.Name, cand.Name, err, out, c.Logs())
	}
	return cand, nil
}

// patronictl runs patronictl with node n's config file.
func (c *Cluster) patronictl(ctx context.Context, n *Node, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, c.ctlBin, append([]string{"-c", n.ConfigFile}, args...)...)
	cmd.Dir = n.Dir
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// KillLeader simulates a crash of the leader's machine: it SIGKILLs the
// leader's Patroni and postmaster, waits until Patroni promotes the other
// node (after the leader key expires, ttl = 10 s) and it leaves recovery,
// then starts the killed node's Patroni again, which rewinds it (or, if
// that fails, clones it afresh) and makes it the new leader's standby.
// It returns the new leader once the cluster is whole: the new leader
// commits a write and the old one streams from it. (In synchronous mode
// the new leader cannot commit anything before a standby is back, which
// is why KillLeader waits for the rejoin.) ctx bounds the wait (3 minutes
// if it has no deadline).
func (c *Cluster) KillLeader(ctx context.Context) (newLeader *Node, err error) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := c.checkRunning(); err != nil {
		return nil, err
	}
	old, err := c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	cand := c.other(old)
	pm := old.postmasterPID()
	c.mu.Lock()
	p := old.proc
	old.proc = nil
	c.mu.Unlock()
	p.kill()
	if pm > 0 {
		syscall.Kill(pm, syscall.SIGKILL)
	}
	fmt.Fprintf(old.log, "=== pgfence: killed patroni and postmaster (pid %d) at %s\n", pm, time.Now().Format(time.RFC3339Nano))
	if pm > 0 && !waitGone(ctx, pm) {
		return nil, fmt.Errorf("patroni: postmaster %d of %s survived SIGKILL", pm, old.Name)
	}
	c.healReplication()

	if err := c.waitPromoted(ctx, cand); err != nil {
		return nil, fmt.Errorf("patroni: after killing %s: %s not promoted: %w\n%s", old.Name, cand.Name, err, c.Logs())
	}
	if err := c.startNode(old); err != nil {
		return nil, err
	}
	if _, err := c.waitHealthy(ctx, cand); err != nil {
		return nil, fmt.Errorf("patroni: after killing %s and promoting %s: %w\n%s", old.Name, cand.Name, err, c.Logs())
	}
	return cand, nil
}

// waitPromoted waits until Patroni on n holds the leader lock and n's
// Postgres is out of recovery.
func (c *Cluster) waitPromoted(ctx context.Context, n *Node) error {
	var last error
	for {
		last = func() error {
			st, err := n.apiStatus(ctx, "/primary")
			if err != nil {
				return err
			}
			if st.code != http.StatusOK {
				return fmt.Errorf("%s is %s/%s", n.Name, st.Role, st.State)
			}
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			conn, err := connect(pctx, n.URL("postgres"))
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			var inRecovery bool
			if err := conn.QueryRow(pctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
				return err
			}
			if inRecovery {
				return fmt.Errorf("%s still in recovery", n.Name)
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		c.mu.Lock()
		p := n.proc
		c.mu.Unlock()
		if p != nil && p.exited() {
			return fmt.Errorf("patroni on %s exited: %v", n.Name, p.err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) checkRunning() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("patroni: cluster stopped")
	}
	return nil
}

// Stop kills both nodes (Patroni, then an immediate shutdown of each
// postmaster), waits until nothing of the cluster runs any more and
// removes its directory. It is idempotent and works in any state (after
// KillLeader, or a failed start).
func (c *Cluster) Stop() {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	var procs []*process
	for _, n := range c.nodes {
		procs = append(procs, n.proc)
		n.proc = nil
	}
	wd, wdIn := c.watchdog, c.wdStdin
	c.mu.Unlock()

	for _, p := range procs {
		p.kill()
	}
	// Immediate shutdown of the postmasters: they kill their backends and
	// exit at once.
	var pms []int
	for _, n := range c.nodes {
		if pm := n.postmasterPID(); pm > 0 {
			syscall.Kill(pm, syscall.SIGQUIT)
			pms = append(pms, pm)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, pm := range pms {
		if !waitGone(ctx, pm) {
			syscall.Kill(pm, syscall.SIGKILL)
		}
	}
	// The watchdog kills whatever is left (a pg_basebackup, a backend)
	// and removes the directory.
	if wd != nil {
		wdIn.Close()
		select {
		case <-wd.done:
		case <-time.After(30 * time.Second):
			wd.kill()
		}
	}
	for _, n := range c.nodes {
		if n.log != nil {
			n.log.Close()
		}
		if n.link != nil {
			n.link.Close()
		}
	}
	if c.Dir != "" {
		os.RemoveAll(c.Dir)
	}
}

// watchdogScript runs in a process of its own (not a child of Patroni,
// and in its own process group so that a terminal's ^C does not reach it).
// It waits for EOF on stdin (Stop closes the pipe; the kernel closes it
// when the test process dies), then kills every process whose command
// line names the cluster's directory: Patroni (SIGKILL), postmasters,
// pg_basebackup, pg_rewind, patronictl (SIGQUIT, then SIGKILL), and
// removes the directory. The directory comes in the environment, so the
// watchdog's own command line does not match.
const watchdogScript = `
trap '' INT TERM HUP QUIT PIPE
D=$PGFENCE_PATRONI_DIR
while read -r _; do :; done
pids() {
	printf '%s\n' "$D" | grep -laF -f - /proc/[0-9]*/cmdline 2>/dev/null |
		sed -n 's,^/proc/\([0-9]*\)/cmdline$,\1,p' | grep -vx "$$"
}
for pid in $(pids); do
	if grep -qaF patroni.yml "/proc/$pid/cmdline" 2>/dev/null; then
		kill -s KILL "$pid" 2>/dev/null
	else
		kill -s QUIT "$pid" 2>/dev/null
	fi
done
i=0
while [ -n "$(pids)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
for pid in $(pids); do kill -s KILL "$pid" 2>/dev/null; done
i=0
while [ -n "$(pids)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
case "$D" in
/*/pgfence-patroni-*) rm -rf -- "$D" ;;
esac
`

func (c *Cluster) startWatchdog() error {
	cmd := exec.Command("/bin/sh", "-c", watchdogScript)
	cmd.Env = append(cleanEnv(), "PGFENCE_PATRONI_DIR="+c.Dir)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	p, err := startProcess(cmd)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.watchdog, c.wdStdin = p, in
	c.mu.Unlock()
	return nil
}

// postmasterPID returns the pid in n's postmaster.pid if that process is
// alive and is n's postmaster, else 0.
func (n *Node) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(n.DataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), n.DataDir) {
		return 0
	}
	return pid
}

// alive reports whether pid runs (a zombie does not count).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		switch s[i+2] {
		case 'Z', 'X':
			return false
		}
	}
	return true
}

// waitGone waits until pid no longer runs; false if ctx ends first.
func waitGone(ctx context.Context, pid int) bool {
	for alive(pid) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return true
}

// Logs returns the end of each node's log (Patroni's and Postgres's
// output, without Patroni's once-a-second "no action" lines), for
// failure messages.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "--- %s: Patroni and Postgres log (tail) ---\n", n.Name)
		b.WriteString(logTail(n.logPath, 60))
		b.WriteString("\n")
	}
	return b.String()
}

// rawLogs is all the nodes' logs, unfiltered.
func (c *Cluster) rawLogs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		data, _ := os.ReadFile(n.logPath)
		b.Write(data)
	}
	return b.String()
}

// logTail returns the last max lines of the file at path that are not
// Patroni's routine HA-loop messages.
func logTail(path string, max int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	const window = 256 << 10
	off := fi.Size() - window
	if off < 0 {
		off = 0
	}
	data, _ := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if strings.Contains(l, "INFO: no action. ") || strings.Contains(l, "INFO: Lock owner: ") {
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	return strings.Join(lines, "\n")
}

// withDefaultTimeout gives ctx a deadline of defaultTimeout if it has none.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

// etcdHosts turns endpoint URLs (or host:port) into Patroni's etcd3 hosts
// and protocol.
func etcdHosts(endpoints []string) (hosts []string, protocol string, err error) {
	protocol = "http"
	for i, e := range endpoints {
		p, host := "http", e
		if strings.Contains(e, "://") {
			u, err := url.Parse(e)
			if err != nil {
				return nil, "", fmt.Errorf("patroni: etcd endpoint %q: %w", e, err)
			}
			p, host = u.Scheme, u.Host
		}
		if _, _, err := net.SplitHostPort(host); err != nil {
			return nil, "", fmt.Errorf("patroni: etcd endpoint %q: want host:port or a URL: %v", e, err)
		}
		if i > 0 && p != protocol {
			return nil, "", fmt.Errorf("patroni: etcd endpoints mix %s and %s", protocol, p)
		}
		protocol = p
		hosts = append(hosts, host)
	}
	return hosts, protocol, nil
}

// lookPath finds patroni or patronictl on PATH or in /usr/bin.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := "/usr/bin/" + name
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return p, nil
	}
	return "", fmt.Errorf("patroni: %w: %s not found on PATH or at %s; %s", ErrNotInstalled, name, p, InstallHint)
}

// cleanEnv is our environment without libpq's PG* variables (which would
// steer Patroni's own connections) and Patroni's PATRONI_* overrides.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "PATRONI_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// chown hands path to the postgres user when we run as root.
func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("patroni: handing %s to the postgres user: %w", path, err)
	}
	return nil
}

// freePorts asks the kernel for n distinct free TCP ports on 127.0.0.1.
// Another process may take one before Patroni binds it; Start retries.
func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("patroni: finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	sort.Ints(ports) // any order will do; sorted reads better in logs
	return ports, nil
}
