// Package poll waits in tests for a condition instead of sleeping for a
// guessed time: a test that polls is as fast as the machine and fails
// with a message when the condition never comes.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Eventually checks its condition.
const Interval = 10 * time.Millisecond

// Eventually checks cond every Interval until it is true, and fails the test
// with "what did not happen within ..." if it is still false after within.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, within)
		}
		time.Sleep(Interval)
	}
}
