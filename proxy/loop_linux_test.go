package proxy_test

import (
	"os"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// On Linux plain-TCP sessions are relayed by the event loop, not by
// goroutines of their own: a session then costs one parked goroutine (the
// one that started it) instead of three. With PGFENCE_TEST_RELAY=goroutines
// (Config.GoroutineRelay) it is three.
func TestEventLoopRelays(t *testing.T) {
	goroutines := os.Getenv("PGFENCE_TEST_RELAY") == "goroutines"
	p := pgtest.StartRelay(t)
	c := p.Connect(t) // starts the loop if no test has yet
	pgtest.Exec(t, c, "SELECT 1")
	base := runtime.NumGoroutine()
	const n = 40
	for range n {
		c, err := pgx.Connect(ctx, p.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		pgtest.Exec(t, c, "SELECT 1")
	}
	// pgx itself runs no goroutine per idle connection.
	per := float64(runtime.NumGoroutine()-base) / n
	if !goroutines && per > 1.5 {
		t.Fatalf("%.1f goroutines per session: sessions are not on the event loop", per)
	}
	if goroutines && per < 2.5 {
		t.Fatalf("%.1f goroutines per session with Config.GoroutineRelay: sessions are on the event loop", per)
	}
}
