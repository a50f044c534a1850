package proxy

import (
	"crypto/tls"
	"net"
)

// TLS on the event loop: see The event loop in the package documentation.

// tlsTransport is what a tls.Conn of pgfence's reads and writes ciphertext
// through.
type tlsTransport struct {
	net.Conn        // the socket, while the session is off the loop
	fd       int    // the loop's descriptor of it, -1 off the loop
	more     bool   // fd may hold bytes not yet read (see side.more)
	hup      bool   // the peer hung up: read to the end (see side.hup)
	out      outbuf // ciphertext for the loop to write to fd
	// unsent is what the loop left unwritten when it handed the session
	// back: written first once off the loop.
	unsent []byte
}

// tlsBase returns the connection to build a tls.Conn on, over c.
func tlsBase(c net.Conn) net.Conn { return &tlsTransport{Conn: c, fd: -1} }

// wouldBlock is the error a tlsTransport on the loop reads when its socket
// is drained. crypto/tls checks Temporary (deprecated in package net, still
// what it reads) to keep the error from sticking to the connection.
type wouldBlock struct{}

func (wouldBlock) Error() string   { return "pgfence: TLS socket drained" }
func (wouldBlock) Timeout() bool   { return false }
func (wouldBlock) Temporary() bool { return true }

var errWouldBlock error = wouldBlock{}

func (t *tlsTransport) Read(p []byte) (int, error) {
	if t.fd < 0 {
		return t.Conn.Read(p)
	}
	if !t.more || len(p) == 0 {
		return 0, errWouldBlock
	}
	n, more, err := readSocket(t.fd, p)
	t.more = more || t.hup && n > 0
	if err == nil && n == 0 {
		err = errWouldBlock
	}
	return n, err
}

func (t *tlsTransport) Write(p []byte) (int, error) {
	if t.fd >= 0 {
		return t.out.Write(p)
	}
	if len(t.unsent) > 0 {
		if _, err := t.Conn.Write(t.unsent); err != nil {
			return 0, err
		}
		t.unsent = nil
	}
	return t.Conn.Write(p)
}

// tlsOf returns c's TLS layer and its transport if c is one of pgfence's
// tls.Conns, else nils.
func tlsOf(c net.Conn) (*tls.Conn, *tlsTransport) {
	if tc, ok := c.(*tls.Conn); ok {
		if t, ok := tc.NetConn().(*tlsTransport); ok {
			return tc, t
		}
	}
	return nil, nil
}

// socketOf returns the socket under c: c itself, or the one under its TLS.
func socketOf(c net.Conn) net.Conn {
	if _, t := tlsOf(c); t != nil {
		return t.Conn
	}
	return c
}

// onLoop puts x's TLS, if it has any, on the loop's descriptor fd.
func (x *side) onLoop(c net.Conn, fd int, pool *bufPool) {
	x.tc, x.tt = tlsOf(c)
	if x.tt != nil {
		x.tt.fd, x.tt.out.pool = fd, pool
	}
}

// offLoop returns the connection the session goes on with once the loop
// handed it back: c again, on a new socket for descriptor fd.
func (x *side) offLoop(c net.Conn, fd int, name string) net.Conn {
	sock := fileConn(fd, name)
	if x.tt == nil {
		return sock
	}
	x.tt.unsent = append(x.tt.unsent, x.tt.out.pendingBytes()...)
	x.tt.out = outbuf{}
	x.tt.fd, x.tt.Conn = -1, sock
	return c
}

// fillTLS is fill for a TLS side: it decrypts into buf what records are in
// hand, reading the socket as they need.
func (x *side) fillTLS(buf []byte) (int, error) {
	if x.readErr != nil {
		return 0, x.readErr
	}
	n := 0
	for n < len(buf) {
		m, err := x.tc.Read(buf[n:])
		n += m
		switch {
		case err == nil:
		case err == errWouldBlock:
			x.more = false
			return n, nil
		case n > 0:
			// Relay what came before it (a close_notify right behind a
			// Terminate, say) before ending.
			x.readErr = err
			return n, nil
		default:
			return 0, err
		}
	}
	return n, nil
}
