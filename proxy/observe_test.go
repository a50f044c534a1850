package proxy

import (
	"context"
	"net"
	"testing"
	"time"
)

// dialFailure names why connecting failed, from a real dial.
func TestDialFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var d net.Dialer
	_, err = d.DialContext(context.Background(), "tcp", addr)
	if got := dialFailure(err).cause; got != UpstreamRefused {
		t.Errorf("closed port: %s (%v), want refused", got, err)
	}
	_, err = d.DialContext(context.Background(), "unix", t.TempDir()+"/.s.PGSQL.5432")
	if got := dialFailure(err).cause; got != UpstreamRefused {
		t.Errorf("missing socket: %s (%v), want refused", got, err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err = d.DialContext(ctx, "tcp", "127.0.0.1:1")
	if got := dialFailure(err).cause; got != UpstreamTimeout {
		t.Errorf("expired deadline: %s (%v), want timeout", got, err)
	}
	for code, want := range map[string]UpstreamFailure{"28P01": UpstreamAuth, "28000": UpstreamAuth, "53300": UpstreamRejected, "3D000": UpstreamRejected} {
		if got := startupFailure(code); got != want {
			t.Errorf("startupFailure(%s) = %s, want %s", code, got, want)
		}
	}
}
