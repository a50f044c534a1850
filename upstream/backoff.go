package upstream

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The schedule of Backoff: the first retry after a failure comes after
// about BackoffBase, each one after that waits twice as long, up to
// BackoffRefusedCap while Postgres refuses pgfence's login and
// BackoffOtherCap otherwise.
const (
	BackoffBase       = time.Second
	BackoffRefusedCap = time.Minute
	BackoffOtherCap   = 5 * time.Second
)

// Backoff paces pgfence's own logins to Postgres while they fail. A
// refused login (a wrong password, a role pg_hba.conf or CONNECT does not
// let in) fails the same way until someone changes something, and each
// try is a FATAL line in Postgres's log, which tools that police failed
// logins (fail2ban, audit alerts) count: it is tried again after about a
// second, then twice as long each time, up to a minute. Other failures
// (Postgres unreachable, starting up, full) mend by themselves, often
// soon: the same schedule, up to 5 s. Each wait is jittered, a random part
// of its upper half, so that the pgfence instances of a fleet that share
// a wrong password do not try in step.
//
// While logins are refused, the logins it paces take turns (see Try): one
// at a time, one per wait, whoever makes it.
//
// Its zero value is ready to use; a nil *Backoff paces nothing.
type Backoff struct {
	mu       sync.Mutex
	failures int       // in a row
	refused  error     // the last failure, while it is a refusal
	until    time.Time // when the wait the last failure set ends
	trying   time.Time // while a try Try let through is under way: when its turn lapses
	// now and jitter are time.Now and a uniformly random duration in
	// [d/2, d], unless a test sets them.
	now    func() time.Time
	jitter func(d time.Duration) time.Duration
}

// Failed records a failed try and returns how long to wait before the next.
func (b *Backoff) Failed(err error) time.Duration {
	if b == nil {
		return BackoffBase
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	limit := BackoffOtherCap
	b.refused = nil
	if Refused(err) {
		limit, b.refused = BackoffRefusedCap, err
	}
	d := BackoffBase
	for i := 1; i < b.failures && d < limit; i++ {
		d *= 2
	}
	d = b.jitterOf(min(d, limit))
	b.until, b.trying = b.clock().Add(d), time.Time{}
	return d
}

// Succeeded records a try that worked: the next failure starts the
// schedule over.
func (b *Backoff) Succeeded() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures, b.refused, b.until, b.trying = 0, nil, time.Time{}, time.Time{}
}

// Ended records a try that was neither refused nor let in (Postgres was
// unreachable, say): the turn passes on, and the schedule stays.
func (b *Backoff) Ended() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.trying = time.Time{}
}

// tryLease bounds a turn Try gives: a try whose Failed or Succeeded never
// comes does not hold the others back for longer.
const tryLease = 30 * time.Second

// Try takes the turn to log in. While Postgres refuses pgfence's logins,
// it is nil once the last refusal's wait is over, and then no other try
// gets a turn until this one's Failed or Succeeded; the refusal, saying
// when the next try comes (a *HeldError), while the wait lasts or another
// try is under way: a login made now would be refused as the last one
// was, so the caller reports that instead. Otherwise it is always nil.
func (b *Backoff) Try() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.held(); err != nil {
		return err
	}
	if b.refused != nil {
		b.trying = b.clock().Add(tryLease)
	}
	return nil
}

// Held is what Try would say, without taking a turn.
func (b *Backoff) Held() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held()
}

func (b *Backoff) held() error {
	if b.refused == nil {
		return nil
	}
	now := b.clock()
	if left := b.until.Sub(now); left > 0 {
		return &HeldError{Err: b.refused, Left: left}
	}
	if b.trying.After(now) {
		return &HeldError{Err: b.refused, Trying: true}
	}
	return nil
}

// HeldError is what a login Backoff holds back reports.
type HeldError struct {
	Err    error         // the last refusal
	Left   time.Duration // until the next try
	Trying bool          // another try is under way
}

func (e *HeldError) Error() string {
	if e.Trying {
		return fmt.Sprintf("%v (pgfence is trying its login again)", e.Err)
	}
	return fmt.Sprintf("%v (pgfence tries its login again in %v)", e.Err, e.Left.Round(100*time.Millisecond))
}

func (e *HeldError) Unwrap() error { return e.Err }

func (b *Backoff) clock() time.Time {
	if b.now != nil {
		return b.now()
	}
	return time.Now()
}

func (b *Backoff) jitterOf(d time.Duration) time.Duration {
	if b.jitter != nil {
		return b.jitter(d)
	}
	return d/2 + rand.N(d/2+1)
}

// Refused reports whether err is Postgres refusing pgfence's login in a
// way that trying again does not mend: an authorization failure (SQLSTATE
// class 28: a wrong password, no pg_hba.conf line), no CONNECT privilege
// (42501), or no such database (3D000).
func Refused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "28") || pe.Code == "42501" || pe.Code == "3D000"
}

// SQLState is the SQLSTATE of the error Postgres sent that err carries,
// "" when Postgres sent none (a network failure, a TLS failure, ...).
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
