package lease

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeper is a lock taken with ZooKeeper's lock recipe: each contender
// creates an ephemeral sequential znode under Path, the lowest sequence
// number holds the lock, and every other contender watches the znode just
// before its own.
//
// The fencing token is the lock znode's creation zxid (Stat.Czxid), NOT its
// sequence suffix. A zxid is the ensemble-wide 64-bit transaction id
// (leader epoch in the high 32 bits, a counter in the low 32): every write
// gets a larger one than all writes before it, across leader elections and
// restarts, so a later holder's znode always has a larger czxid. The
// sequence suffix is only a per-parent counter: a signed 32-bit number
// that wraps to negative after 2^31 creations under the parent, starts over
// at 0 if the parent is deleted and re-created (a cleanup job, a
// container node), and means nothing across lock paths. Any of those would
// hand a newer holder a smaller token than an older one, and pgfence would
// then fence the newer holder and let the zombie write. (The recipe still
// orders contenders by sequence, as ZooKeeper documents it; only the token
// must not come from it.)
//
// Each Acquire opens its own ZooKeeper session, and the lease is that
// session: if it expires, ZooKeeper deletes the ephemeral znode and the
// next contender takes the lock. The client pings to keep the session
// alive; the Lease also checks its znode every third of the session
// timeout, noting when each check was sent (ZooKeeper extends a session
// from when it receives a request, which is after the send), and counts as
// lost SafetyMargin before send + session timeout, when the session
// expires, or when its znode is gone.
type ZooKeeper struct {
	// Servers are host:port addresses of the ensemble.
	Servers []string
	// Path is the lock's znode, e.g. "/locks/orders"; it and its parents
	// are created (persistent) if missing.
	Path string
	// SessionTimeout is the requested session timeout; 0 means 10 s. The
	// server may change it (to within its min/maxSessionTimeout); the
	// Lease uses the negotiated value (Lease.TTL).
	SessionTimeout time.Duration
	// SafetyMargin is subtracted from the session timeout since the last
	// successful check was sent. 0 means a fifth of the negotiated timeout.
	SafetyMargin time.Duration
	// ACL for the znodes; nil means zk.WorldACL(zk.PermAll).
	ACL []zk.ACL
	// Logger receives the ZooKeeper client's log lines; nil discards them.
	Logger zk.Logger
}

var _ Lock = (*ZooKeeper)(nil)

const zkLockPrefix = "lock-"

// Acquire opens a session, creates the lock znode, waits until it is the
// lowest, and returns the Lease with the znode's czxid as its token.
func (z *ZooKeeper) Acquire(ctx context.Context) (_ *Lease, err error) {
	if len(z.Servers) == 0 || z.Path == "" || !strings.HasPrefix(z.Path, "/") || z.Path != path.Clean(z.Path) {
		return nil, errors.New("lease: ZooKeeper needs Servers and an absolute, clean Path")
	}
	timeout := z.SessionTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	acl := z.ACL
	if acl == nil {
		acl = zk.WorldACL(zk.PermAll)
	}

	w := &zkWatcher{user: z.Logger, authed: make(chan struct{}), expired: make(chan struct{})}
	conn, _, err := zk.Connect(z.Servers, timeout, zk.WithLogger(w), zk.WithEventCallback(w.event))
	if err != nil {
		return nil, fmt.Errorf("lease: zookeeper connect: %w", err)
	}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()

	// The negotiated timeout is only told in the client's log line
	// "authenticated: id=..., timeout=..." (go-zookeeper has no getter); it
	// is logged right after the session is established.
	select {
	case <-w.authed:
	case <-ctx.Done():
		return nil, fmt.Errorf("lease: zookeeper session: %w", ctx.Err())
	}
	negotiated := w.timeout()
	margin, err := checkMargin(z.SafetyMargin, negotiated)
	if err != nil {
		return nil, err
	}

	if err := zkEnsurePath(ctx, conn, z.Path, acl); err != nil {
		return nil, err
	}
	var node string
	if err := zkCall(ctx, func() (err error) {
		node, err = conn.CreateProtectedEphemeralSequential(z.Path+"/"+zkLockPrefix, nil, acl)
		return err
	}); err != nil {
		return nil, fmt.Errorf("lease: zookeeper create lock node under %s: %w", z.Path, err)
	}
	defer func() {
		if err != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			zkCall(dctx, func() error { return conn.Delete(node, -1) })
			cancel()
		}
	}()
	me := path.Base(node)

	for {
		var children []string
		if err := zkCall(ctx, func() (err error) {
			children, _, err = conn.Children(z.Path)
			return err
		}); err != nil {
			return nil, fmt.Errorf("lease: zookeeper children of %s: %w", z.Path, err)
		}
		sortBySequence(children)
		idx := -1
		for j, c := range children {
			if c == me {
				idx = j
				break
			}
		}
		if idx < 0 {
			return nil, fmt.Errorf("lease: zookeeper lock node %s disappeared while waiting: %w", node, ErrLost)
		}
		if idx == 0 {
			break
		}
		var exists bool
		var ch <-chan zk.Event
		if err := zkCall(ctx, func() (err error) {
			exists, _, ch, err = conn.ExistsW(z.Path + "/" + children[idx-1])
			return err
		}); err != nil {
			return nil, fmt.Errorf("lease: zookeeper watch: %w", err)
		}
		if !exists {
			continue
		}
		select {
		case <-ch:
		case <-w.expired:
			return nil, fmt.Errorf("lease: zookeeper session expired while waiting for the lock: %w", ErrLost)
		case <-ctx.Done():
			return nil, fmt.Errorf("lease: zookeeper lock %s: %w", z.Path, ctx.Err())
		}
	}

	sent := time.Now()
	var stat *zk.Stat
	var exists bool
	if err := zkCall(ctx, func() (err error) {
		exists, stat, err = conn.Exists(node)
		return err
	}); err != nil {
		return nil, fmt.Errorf("lease: zookeeper stat %s: %w", node, err)
	}
	if !exists {
		return nil, fmt.Errorf("lease: zookeeper lock node %s is gone: %w", node, ErrLost)
	}
	token := stat.Czxid

	l := newLease(token, negotiated, margin, sent)
	l.onLost = func() {
		if errors.Is(l.Err(), ErrReleased) {
			return // Release deletes the znode and closes the session
		}
		// Lost: close the session, so that ZooKeeper deletes the znode now
		// (if it can still be reached) rather than when the session times
		// out, and the next contender goes on. Close waits up to a second
		// for the server's answer; don't hold the caller up.
		go conn.Close()
	}
	l.release = func(ctx context.Context) error {
		var err error
		if errors.Is(l.Err(), ErrReleased) { // else lost: the session is being closed already
			err = zkCall(ctx, func() error { return conn.Delete(node, -1) })
			switch {
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired),
				errors.Is(err, zk.ErrClosing), errors.Is(err, zk.ErrConnectionClosed):
				err = nil // gone, or goes with the session below
			}
		}
		// Closing the session deletes the ephemeral node anyway.
		conn.Close()
		if err != nil {
			return fmt.Errorf("lease: zookeeper delete %s: %w", node, err)
		}
		return nil
	}
	renew := func(ctx context.Context) (time.Duration, error) {
		var exists bool
		var st *zk.Stat
		err := zkCall(ctx, func() (err error) {
			exists, st, err = conn.Exists(node)
			return err
		})
		switch {
		case errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrClosing):
			return 0, fatal{fmt.Errorf("zookeeper session ended: %v", err)}
		case err != nil:
			return 0, err
		case !exists || st.Czxid != token:
			return 0, fatal{fmt.Errorf("zookeeper lock node %s is gone", node)}
		}
		return negotiated, nil
	}
	l.watch(renewInterval(negotiated, margin), renew, w.expired, fmt.Errorf("%w: zookeeper session expired", ErrLost))
	return l, nil
}

// zkWatcher learns the negotiated session timeout from the client's log
// and notices session expiry.
type zkWatcher struct {
	user zk.Logger

	mu         sync.Mutex
	timeoutMs  int64
	authed     chan struct{}
	authedOnce sync.Once
	expired    chan struct{}
	expOnce    sync.Once
}

func (w *zkWatcher) Printf(format string, args ...any) {
	if strings.HasPrefix(format, "authenticated: id=%d, timeout=%d") && len(args) >= 2 {
		if ms, err := strconv.ParseInt(fmt.Sprint(args[1]), 10, 64); err == nil {
			w.mu.Lock()
			w.timeoutMs = ms
			w.mu.Unlock()
			w.authedOnce.Do(func() { close(w.authed) })
		}
	}
	if w.user != nil {
		w.user.Printf(format, args...)
	}
}

func (w *zkWatcher) timeout() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Duration(w.timeoutMs) * time.Millisecond
}

func (w *zkWatcher) event(ev zk.Event) {
	if ev.Type == zk.EventSession && ev.State == zk.StateExpired {
		w.expOnce.Do(func() { close(w.expired) })
	}
}

// zkCall runs a ZooKeeper request (which takes no context) and returns
// early with ctx's error if ctx ends first; the request itself goes on
// until the client answers or drops it.
func zkCall(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// zkEnsurePath creates p and its parents as persistent znodes if missing.
func zkEnsurePath(ctx context.Context, conn *zk.Conn, p string, acl []zk.ACL) error {
	cur := ""
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		cur += "/" + part
		err := zkCall(ctx, func() error {
			_, err := conn.Create(cur, nil, 0, acl)
			return err
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("lease: zookeeper create %s: %w", cur, err)
		}
	}
	return nil
}

// sortBySequence orders lock znodes by their sequence suffix (the recipe's
// order), names without one last.
func sortBySequence(children []string) {
	seq := func(name string) int64 {
		i := strings.LastIndex(name, zkLockPrefix)
		if i < 0 {
			return 1 << 62
		}
		n, err := strconv.ParseInt(name[i+len(zkLockPrefix):], 10, 64)
		if err != nil {
			return 1 << 62
		}
		return n
	}
	sort.SliceStable(children, func(a, b int) bool { return seq(children[a]) < seq(children[b]) })
}
