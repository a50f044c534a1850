package pgtest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Notices collects the notices a connection receives.
type Notices struct {
	mu  sync.Mutex
	got []*pgconn.Notice
}

// All returns the notices received so far.
func (n *Notices) All() []*pgconn.Notice {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*pgconn.Notice(nil), n.got...)
}

// Codes counts the notices received so far with SQLSTATE code.
func (n *Notices) Codes(code string) int {
	c := 0
	for _, x := range n.All() {
		if x.Code == code {
			c++
		}
	}
	return c
}

// ConnectNoticed connects to url (Postgres, or a proxy), collecting the
// notices the connection receives; closed when the test ends.
func ConnectNoticed(t testing.TB, url string) (*pgx.Conn, *Notices) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	ns := &Notices{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		ns.mu.Lock()
		ns.got = append(ns.got, n)
		ns.mu.Unlock()
	}
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c, ns
}
