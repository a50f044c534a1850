// Package lease holds a distributed lock from a lock service (etcd,
// ZooKeeper) as a Lease: a fencing token that grows with every grant, and a
// context that ends when the holder must stop acting on the lock.
//
// A lock service can only promise that its lease expires; it cannot stop a
// holder that was paused (a GC pause, a frozen VM, a slow network) from
// waking up after a newer holder took over and writing anyway. The fencing
// token closes that gap when the resource checks it: write through pgfence
// with WithToken or WithLease and a stale holder's statement changes none of
// the rows a newer holder has written (the client sees UPDATE 0).
//
// A Lease is also conservative on its own: it counts as lost a safety margin
// before the lock service would expire it, measured from when the last
// successful renewal was sent, and as soon as a renewal reports it gone.
// That keeps a healthy but slow holder from acting late; it cannot help a
// holder that is paused between checking Valid and writing, which is what
// the token is for.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lock is a distributed lock that grants Leases.
type Lock interface {
	// Acquire blocks until the lock is held (or ctx ends) and returns the
	// lease. The caller must Release it, also after it is lost.
	Acquire(ctx context.Context) (*Lease, error)
}

var (
	// ErrLost is wrapped by every error that says a lease ended without
	// Release: not renewed in time, revoked, its session expired, its lock
	// entry gone.
	ErrLost = errors.New("lease lost")
	// ErrExpired: no renewal succeeded in time; the lease's safety deadline
	// (last renewal + TTL - margin) passed. Wraps ErrLost.
	ErrExpired = fmt.Errorf("%w: not renewed before its safety deadline", ErrLost)
	// ErrReleased: Release was called.
	ErrReleased = errors.New("lease released")
)

// Lease is one grant of a Lock.
//
// Token is the fencing token: every later grant of the same lock has a
// larger one. Put it in the fence.token setting of the transaction that
// writes (WithToken, WithLease).
type Lease struct {
	// Token is the fencing token of this grant.
	Token int64
	// TTL is the lease's time to live as the lock service granted it (etcd
	// may raise a requested TTL to its minimum; ZooKeeper negotiates the
	// session timeout).
	TTL time.Duration
	// Margin is the safety margin: the lease counts as lost TTL - Margin
	// after the last successful renewal was sent.
	Margin time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time

	onLost      func() // stop renewing (so the service can expire it); may be nil
	lostOnce    sync.Once
	release     func(ctx context.Context) error
	releaseOnce sync.Once
	releaseErr  error
}

// Context returns a context that is done when the lease is lost or
// released; context.Cause tells why (ErrExpired, ErrReleased, ...). Use it
// (or a context derived from it) for work that must stop with the lease.
func (l *Lease) Context() context.Context { return l.ctx }

// Valid reports whether the holder may still act on the lease: it has not
// been lost or released and its safety deadline has not passed. It reads
// the clock itself, so it is false the moment the deadline passes, even
// before Context is done.
func (l *Lease) Valid() bool {
	if l.ctx.Err() != nil {
		return false
	}
	return time.Now().Before(l.Deadline())
}

// Deadline is the time until which the holder may act, unless a renewal
// moves it: the last successful renewal's send time + TTL - Margin.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Err is nil while the lease is valid; otherwise why it is not (wrapping
// ErrLost, or ErrReleased).
func (l *Lease) Err() error {
	if err := context.Cause(l.ctx); err != nil {
		return err
	}
	if !l.Valid() {
		return ErrExpired
	}
	return nil
}

// Release ends the lease: it stops counting as valid at once, then the lock
// entry is removed so the next holder may go on without waiting for the
// TTL. Call it also after the lease was lost, to free what is left of it.
// It is idempotent.
func (l *Lease) Release(ctx context.Context) error {
	l.releaseOnce.Do(func() {
		// Stop acting first, then let others in.
		l.cancel(ErrReleased)
		l.stopRenewing()
		if l.release != nil {
			l.releaseErr = l.release(ctx)
		}
	})
	return l.releaseErr
}

// newLease returns a valid lease whose safety deadline is sent + ttl -
// margin, where sent is when the request that granted or last renewed it
// was sent.
func newLease(token int64, ttl, margin time.Duration, sent time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{
		Token:    token,
		TTL:      ttl,
		Margin:   margin,
		ctx:      ctx,
		cancel:   cancel,
		deadline: sent.Add(ttl - margin),
	}
}

// lose ends the lease with cause err (wrapping ErrLost), unless it already
// ended.
func (l *Lease) lose(err error) {
	if l.ctx.Err() != nil {
		return
	}
	l.cancel(err)
	l.stopRenewing()
}

func (l *Lease) stopRenewing() {
	l.lostOnce.Do(func() {
		if l.onLost != nil {
			l.onLost()
		}
	})
}

// extend moves the deadline to sent + ttl - margin after a renewal sent at
// sent succeeded. A lease whose deadline has already passed is not revived:
// the holder may already have been told it is lost.
func (l *Lease) extend(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	now := time.Now()
	expired := !now.Before(l.deadline)
	if !expired {
		if d := sent.Add(ttl - l.Margin); d.After(l.deadline) {
			l.deadline = d
		}
	}
	l.mu.Unlock()
	if expired {
		l.lose(ErrExpired)
	}
}

// fatal marks a renewal error that means the lease is gone (as opposed to a
// renewal that merely failed this time, such as a timeout).
type fatal struct{ err error }

func (f fatal) Error() string { return f.err.Error() }
func (f fatal) Unwrap() error { return f.err }

// renewFunc renews the lease once and returns its TTL as granted by that
// renewal. A fatal error ends the lease; any other error just means this
// renewal did not count.
type renewFunc func(ctx context.Context) (time.Duration, error)

// watch keeps the lease: it renews every interval, moving the deadline on
// success and ending the lease on a fatal error, and ends the lease when
// the deadline passes or gone is closed (gone may be nil).
func (l *Lease) watch(interval time.Duration, renew renewFunc, gone <-chan struct{}, goneErr error) {
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-l.ctx.Done():
				return
			case <-t.C:
			}
			sent := time.Now()
			// A renewal that lands after the deadline is of no use.
			rctx, cancel := context.WithDeadline(l.ctx, l.Deadline())
			ttl, err := renew(rctx)
			cancel()
			var f fatal
			switch {
			case err == nil:
				l.extend(sent, ttl)
			case errors.As(err, &f):
				l.lose(fmt.Errorf("%w: %v", ErrLost, f.err))
				return
			}
		}
	}()
	go func() {
		for {
			d := time.Until(l.Deadline())
			if d <= 0 {
				l.lose(ErrExpired)
				return
			}
			timer := time.NewTimer(d)
			select {
			case <-l.ctx.Done():
				timer.Stop()
				return
			case <-gone:
				timer.Stop()
				l.lose(goneErr)
				return
			case <-timer.C:
			}
		}
	}()
}

// renewInterval renews three times per usable lifetime of the lease, so two
// renewals in a row may fail before it counts as lost.
func renewInterval(ttl, margin time.Duration) time.Duration {
	iv := (ttl - margin) / 3
	if iv < 10*time.Millisecond {
		iv = 10 * time.Millisecond
	}
	return iv
}

// checkMargin validates a safety margin against a TTL, defaulting it to a
// fifth of the TTL.
func checkMargin(margin, ttl time.Duration) (time.Duration, error) {
	if margin == 0 {
		return ttl / 5, nil
	}
	if margin < 0 || margin >= ttl {
		return 0, fmt.Errorf("lease: safety margin %v must be at least 0 and below the TTL %v", margin, ttl)
	}
	return margin, nil
}
