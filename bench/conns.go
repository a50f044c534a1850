package main

// Holding many idle client connections open through a proxy and measuring
// its resident memory.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

type memResult struct {
	before, with float64 // VmRSS, KiB
	open         int
	gauge        float64 // pgfence_client_connections while they were open (pgfence only)
}

// holdConns opens n sessions through t (each waits for ReadyForQuery, so
// its upstream session exists too), reads t's VmRSS with them open, calls
// during (if not nil), and closes them.
func holdConns(t target, n int, during func() error) (memResult, error) {
	var res memResult
	var err error
	if res.before, err = rssKiB(t.pid); err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sslmode := "disable"
	if t.tls {
		sslmode = "require"
	}
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=%s&connect_timeout=60", t.port, sslmode)
	conns := make([]*pgconn.PgConn, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32) // Postgres forks a backend per session: don't stampede
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			conns[i], errs[i] = pgconn.Connect(ctx, url)
		}()
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i, e := range errs {
		if e != nil {
			return res, fmt.Errorf("connection %d of %d through %s: %w", i+1, n, t.name, e)
		}
		res.open++
	}
	// Every session has done one round trip, then idles: what a pool of
	// idle application connections looks like.
	for _, c := range conns {
		if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			return res, err
		}
	}
	time.Sleep(2 * time.Second)
	if res.with, err = rssKiB(t.pid); err != nil {
		return res, err
	}
	if t.metrics != "" {
		res.gauge, _ = counterSum(t.metrics, "pgfence_client_connections")
	}
	if during != nil {
		return res, during()
	}
	return res, nil
}
