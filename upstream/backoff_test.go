package upstream

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The waits double from BackoffBase up to the cap of the last failure's
// kind, and a success starts over.
func TestBackoffSchedule(t *testing.T) {
	refused := &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}
	down := errors.New("connection refused")
	b := &Backoff{jitter: func(d time.Duration) time.Duration { return d }}
	for k, tc := range []struct {
		err  error
		want time.Duration
	}{
		{refused, time.Second}, {refused, 2 * time.Second}, {refused, 4 * time.Second}, {refused, 8 * time.Second},
		{refused, 16 * time.Second}, {refused, 32 * time.Second}, {refused, time.Minute}, {refused, time.Minute},
		// Postgres unreachable after as many failures: the lower cap.
		{down, BackoffOtherCap},
		{refused, time.Minute},
	} {
		if got := b.Failed(tc.err); got != tc.want {
			t.Errorf("failure %d (%v): wait %v, want %v", k+1, tc.err, got, tc.want)
		}
	}
	b.Succeeded()
	if got := b.Failed(down); got != BackoffBase {
		t.Errorf("the first failure after a success: wait %v, want %v", got, BackoffBase)
	}
}

// Each wait is a random part of the upper half of its step.
func TestBackoffJitter(t *testing.T) {
	refused := &pgconn.PgError{Code: "28000"}
	seen := map[time.Duration]bool{}
	for range 200 {
		b := &Backoff{}
		b.Failed(refused)
		b.Failed(refused)
		d := b.Failed(refused) // the third step: 4 s
		if d < 2*time.Second || d > 4*time.Second {
			t.Fatalf("wait %v, want within [2s, 4s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("200 waits took %d values: not jittered", len(seen))
	}
}

// While logins are refused they take turns: none during the wait, one
// after it, and none while that one is under way; other failures hold
// nothing back.
func TestBackoffTurns(t *testing.T) {
	now := time.Unix(1000, 0)
	b := &Backoff{now: func() time.Time { return now }, jitter: func(d time.Duration) time.Duration { return d }}
	if err := b.Try(); err != nil {
		t.Fatalf("a first try: %v", err)
	}
	refused := &pgconn.PgError{Code: "28P01"}
	b.Failed(refused)
	var held *HeldError
	if err := b.Try(); !errors.As(err, &held) || held.Left != time.Second || !errors.Is(err, refused) {
		t.Fatalf("a try during the wait: %v, want the refusal with 1s left", err)
	}
	now = now.Add(time.Second)
	if err := b.Try(); err != nil {
		t.Fatalf("a try once the wait is over: %v", err)
	}
	if err := b.Try(); !errors.As(err, &held) || !held.Trying {
		t.Fatalf("a second try while the first is under way: %v, want held", err)
	}
	b.Ended() // unreachable this time: the turn passes on
	if err := b.Try(); err != nil {
		t.Fatalf("a try after one that ended: %v", err)
	}
	now = now.Add(tryLease) // a try that never said how it went
	if err := b.Try(); err != nil {
		t.Fatalf("a try after a lapsed turn: %v", err)
	}
	b.Failed(errors.New("timeout"))
	if err := b.Try(); err != nil {
		t.Fatalf("a try after a failure that is not a refusal: %v", err)
	}
	var nilB *Backoff
	if nilB.Try() != nil || nilB.Failed(refused) != BackoffBase {
		t.Fatal("a nil Backoff paces")
	}
}

func TestRefused(t *testing.T) {
	if Refused(errors.New("dial tcp: connection refused")) {
		t.Fatal("a network failure is a refusal")
	}
	for code, want := range map[string]bool{"28P01": true, "28000": true, "42501": true, "3D000": true, "57P03": false, "53300": false} {
		if got := Refused(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("SQLSTATE %s: refused %v, want %v", code, got, want)
		}
	}
}
