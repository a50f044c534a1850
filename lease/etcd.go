package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Etcd is a lock on an etcd key prefix, taken with etcd's lease and
// concurrency API (concurrency.Session and concurrency.Mutex).
//
// The fencing token is the create revision of the holder's lock key. etcd's
// revision is one 64-bit counter for the whole cluster, raised by every
// write and never reused (it survives restarts, leader changes and
// compaction). The mutex grants the lock to the key with the lowest create
// revision under the prefix, and a later contender's key is created later,
// so each grant's token is larger than every earlier grant's.
//
// Each Acquire grants a new etcd lease, which the session keeps alive. The
// Lease also renews it itself (KeepAliveOnce), noting when each renewal was
// sent: etcd counts the TTL from when it processed the renewal, which is
// after the send, so send + TTL - SafetyMargin is a deadline the server
// cannot beat. A renewal that finds the lease or the lock key gone ends the
// Lease at once; the session's keep-alive stopping ends it too.
//
// Works with etcd 3.4 and 3.5 servers (client v3.5).
type Etcd struct {
	// Client is the etcd client; the caller owns it.
	Client *clientv3.Client
	// Prefix is the lock's key prefix, e.g. "/locks/orders"; contenders'
	// keys are created under Prefix + "/".
	Prefix string
	// TTL is the lease's time to live, in whole seconds (rounded up);
	// 0 means 10 s. etcd raises it to its own minimum if it is lower.
	TTL time.Duration
	// SafetyMargin is subtracted from the TTL since the last renewal was
	// sent: the Lease counts as lost that much before etcd would expire
	// it. 0 means a fifth of the TTL. It must be below the TTL.
	SafetyMargin time.Duration
}

var _ Lock = (*Etcd)(nil)

// Acquire grants an etcd lease, waits for the lock under Prefix, and
// returns the Lease with the lock key's create revision as its token.
func (e *Etcd) Acquire(ctx context.Context) (*Lease, error) {
	if e.Client == nil || e.Prefix == "" {
		return nil, errors.New("lease: Etcd needs a Client and a Prefix")
	}
	ttl := e.TTL
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	ttlSec := int64(math.Ceil(ttl.Seconds()))
	if ttlSec < 1 {
		ttlSec = 1
	}
	cli := e.Client

	g, err := cli.Grant(ctx, ttlSec)
	if err != nil {
		return nil, fmt.Errorf("lease: etcd grant: %w", err)
	}
	id := g.ID
	granted := time.Duration(g.TTL) * time.Second
	margin, err := checkMargin(e.SafetyMargin, granted)
	if err != nil {
		revoke(cli, id)
		return nil, err
	}

	// The session's context is ours, not the caller's: the keep-alive must
	// outlive Acquire.
	sctx, scancel := context.WithCancel(context.Background())
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(id), concurrency.WithTTL(int(g.TTL)), concurrency.WithContext(sctx))
	if err != nil {
		scancel()
		revoke(cli, id)
		return nil, fmt.Errorf("lease: etcd session: %w", err)
	}
	abandon := func() {
		sess.Orphan()
		scancel()
		revoke(cli, id)
	}

	mu := concurrency.NewMutex(sess, e.Prefix)
	if err := mu.Lock(ctx); err != nil {
		abandon()
		if errors.Is(err, concurrency.ErrSessionExpired) {
			err = fmt.Errorf("%w: etcd lease expired while waiting for the lock", ErrLost)
		}
		return nil, fmt.Errorf("lease: etcd lock %s: %w", e.Prefix, err)
	}
	key := mu.Key()

	// Waiting for the lock may have taken long; renew now so the deadline
	// starts from a renewal we timed ourselves.
	sent := time.Now()
	ka, err := cli.KeepAliveOnce(ctx, id)
	if err != nil {
		abandon()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			err = fmt.Errorf("%w: etcd lease expired while waiting for the lock", ErrLost)
		}
		return nil, fmt.Errorf("lease: etcd keep-alive: %w", err)
	}
	resp, err := cli.Get(ctx, key)
	if err != nil {
		abandon()
		return nil, fmt.Errorf("lease: etcd get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].Lease != int64(id) {
		abandon()
		return nil, fmt.Errorf("lease: etcd lock key %s is gone: %w", key, ErrLost)
	}
	token := resp.Kvs[0].CreateRevision

	l := newLease(token, time.Duration(ka.TTL)*time.Second, margin, sent)
	l.onLost = func() {
		// Stop the keep-alive so etcd expires the lease even if the
		// holder never calls Release.
		sess.Orphan()
		scancel()
		if !errors.Is(l.Err(), ErrReleased) {
			revoke(cli, id) // and free the lock now if etcd can be reached
		}
	}
	l.release = func(ctx context.Context) error {
		if cli.Ctx().Err() != nil {
			return errors.New("lease: etcd client closed; etcd deletes the lock key when the lease's TTL runs out")
		}
		// The key goes with the lease; revoking deletes both at once.
		_, err := cli.Revoke(ctx, id)
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("lease: etcd revoke: %w", err)
		}
		return nil
	}
	renew := func(ctx context.Context) (time.Duration, error) {
		ka, err := cli.KeepAliveOnce(ctx, id)
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return 0, fatal{errors.New("etcd lease not found (expired or revoked)")}
			}
			return 0, err
		}
		r, err := cli.Get(ctx, key)
		if err != nil {
			return 0, err
		}
		if len(r.Kvs) == 0 || r.Kvs[0].CreateRevision != token {
			return 0, fatal{fmt.Errorf("etcd lock key %s was deleted", key)}
		}
		return time.Duration(ka.TTL) * time.Second, nil
	}
	l.watch(renewInterval(l.TTL, margin), renew, sess.Done(), fmt.Errorf("%w: etcd keep-alive stopped", ErrLost))
	return l, nil
}

// revoke revokes a lease, best effort, in the background.
func revoke(cli *clientv3.Client, id clientv3.LeaseID) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cli.Revoke(ctx, id)
	}()
}
