//go:build !linux

package proxy

import "net"

// Without epoll every session is relayed by goroutines.

type loop struct{}

// loopEnd says how a session ended: which side first, and why.
type loopEnd struct {
	fromClient bool
	err        error
}

const haveEventLoop = false

func startLoops(int) ([]*loop, error) { return nil, nil }

func stopLoops([]*loop) {}

func (l *loop) relay(s *session) (loopEnd, bool) { return loopEnd{}, false }

// tlsBase returns the connection to build a tls.Conn on, over c.
func tlsBase(c net.Conn) net.Conn { return c }
