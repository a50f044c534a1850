package proxy

import (
	"crypto/tls"
	"io"

	"golang.org/x/sys/unix"
)

// side is one connection of a session relayed by the loop.
type side struct {
	fd     int
	ls     *loopSession
	client bool
	peer   *side
	in     inbuf  // read from fd, not yet relayed
	out    outbuf // to be written to fd
	// more is set while fd may hold bytes not yet read: since its last
	// edge, no read has come back short.
	more bool
	// hup is set once the peer hung up or the socket failed: the edge that
	// said so may have come with the last bytes, so a short read no longer
	// means drained, and x is read until its end of file or error.
	hup bool
	// On a TLS side, the session's tls.Conn and its transport (see
	// tls_linux.go), and an error to report once what came before it is
	// relayed.
	tc      *tls.Conn
	tt      *tlsTransport
	readErr error
	// parked is set while the client's next statement waits (see
	// Client.HoldNextStatement): nothing more of x is read or handled.
	// parkedOn, if set, is the pipeline's channel it waits for, which the
	// loop checks itself (see loop.resumeLocal).
	parked   bool
	parkedOn <-chan struct{}
}

// arrived notes an edge: x's socket has bytes to read, and, with hup, its
// peer hung up or it failed.
func (x *side) arrived(hup bool) {
	x.more = true
	if hup {
		x.hup = true
	}
	if x.tt != nil {
		x.tt.more = true
		x.tt.hup = x.tt.hup || hup
	}
}

// fill reads into buf what x has sent, and returns 0 once x is drained
// (x.more is then false), or io.EOF once x closed.
func (x *side) fill(buf []byte) (n int, err error) {
	if x.tc != nil {
		return x.fillTLS(buf)
	}
	n, x.more, err = readSocket(x.fd, buf)
	if x.hup && n > 0 {
		x.more = true // read on to the end of file or the error
	}
	return n, err
}

// readSocket reads what fd holds into p. It returns 0 and nil once fd is
// drained, io.EOF once its peer closed; more is false once a read came back
// short of p (see side.more).
func readSocket(fd int, p []byte) (n int, more bool, err error) {
	for {
		n, err := rawRead(fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, false, nil
		case err != nil:
			return 0, false, err
		case n == 0:
			return 0, false, io.EOF
		}
		return n, n == len(p), nil
	}
}

// flushed reports whether all that is for x has been written to it.
func (x *side) flushed() bool {
	return x.out.off == len(x.out.b) && (x.tt == nil || x.tt.out.off == len(x.tt.out.b))
}

// need is how much of the message at the front of x's buffer must be in
// hand before its handler runs (0 if there is no valid header there yet).
func (x *side) need() int {
	if x.in.pending > 0 {
		return 0
	}
	typ, n, err := header(&x.in, x.maxMessage())
	if err != nil {
		return 0
	}
	return x.needFor(typ, n)
}

// needFor is need for a message whose header says typ and n.
func (x *side) needFor(typ byte, n int) int {
	if 5+n <= bufSize || x.whole(typ) {
		return 5 + n
	}
	// A large message the handler only forwards: its first bytes suffice,
	// the rest streams through.
	return 5 + peekLimit
}

func (x *side) maxMessage() int {
	if x.client {
		return x.ls.s.srv.cfg.MaxMessageSize
	}
	return maxServerMessage
}

// whole reports whether the handler of a message of type typ reads all of
// it, or does more after forwarding it.
func (x *side) whole(typ byte) bool {
	if !x.client {
		return x.ls.s.wholeServerMessage(serverMsg(typ))
	}
	switch clientMsg(typ) {
	case clientMsgQuery, clientMsgParse, clientMsgExecute, clientMsgTerminate:
		return true
	}
	return false
}

// dispatch runs the session's handler for each message in x's buffer that
// is in hand, leaving a partial one for later.
func (x *side) dispatch() error {
	s, in := x.ls.s, &x.in
	for {
		if in.pending > 0 {
			k := min(in.pending, in.Buffered())
			if k == 0 {
				return nil
			}
			if x.client {
				// Through the session's writer: it may be holding back
				// what goes to the server (see applyState.held).
				s.sw.Write(in.b[in.r : in.r+k])
			} else {
				x.peer.out.Write(in.b[in.r : in.r+k])
			}
			in.r += k
			in.pending -= k
			continue
		}
		if in.Buffered() < 5 {
			return nil
		}
		typ, n, err := header(in, x.maxMessage())
		if err != nil {
			return err
		}
		if in.Buffered() < x.needFor(typ, n) {
			return nil
		}
		if x.client {
			f := clientFrame{typ: clientMsg(typ), n: n}
			if mayHold(f.typ) {
				if parked, err := x.hold(&f); parked || err != nil {
					return err
				}
			}
			err = s.clientMessage(&f)
		} else {
			err = s.serverMessage(serverMsg(typ), n)
		}
		if err != nil {
			return err
		}
	}
}

// hold parks x, the client side, while its message f must wait (see
// session.holdFor), and reports whether it did.
func (x *side) hold(f *clientFrame) (parked bool, err error) {
	for {
		ch, local, err := x.ls.s.holdFor(f)
		if ch == nil || err != nil {
			return false, err
		}
		select {
		case <-ch:
			continue // nothing to wait for after all: ask again
		default:
		}
		if local {
			// Closed by the server side, on the loop: the loop resumes x
			// when it is (see loop.resumeLocal), with no goroutine.
			x.parked, x.parkedOn = true, ch
		} else {
			x.ls.l.park(x, ch) // dispatch runs on the session's loop
		}
		return true, nil
	}
}
