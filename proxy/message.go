package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// msgReader is what a relay reads messages from: a bufio.Reader over the
// connection, or the event loop's buffer of what it has read.
type msgReader interface {
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
	Buffered() int
	Read(p []byte) (int, error)
}

// msgWriter is what a relay writes messages to; Flush sends what is
// buffered.
type msgWriter interface {
	Write(p []byte) (int, error)
	WriteByte(c byte) error
	Flush() error
}

// ErrMalformed is wrapped by every error about bytes that are not a valid
// protocol message.
var ErrMalformed = errors.New("malformed message")

// header peeks at the next message's type and body length without consuming
// it, the way an interceptor decides whether a message matters before
// touching its body. max bounds the body length.
func header(r msgReader, max int) (typ byte, n int, err error) {
	h, err := r.Peek(5)
	if err != nil {
		return 0, 0, err
	}
	l := int(binary.BigEndian.Uint32(h[1:5]))
	if l < 4 {
		return 0, 0, fmt.Errorf("%w: message %q has length %d, the minimum is 4", ErrMalformed, h[0], l)
	}
	if l-4 > max {
		return 0, 0, fmt.Errorf("%w: message %q of %d bytes is over the %d-byte limit: %w", ErrMalformed, h[0], l-4, max, errTooLarge)
	}
	return h[0], l - 4, nil
}

// errTooLarge marks a message over the size limit.
var errTooLarge = errors.New("too large")

// forward copies the next message (header and body of n bytes) from r to w
// untouched, without an intermediate buffer or allocation.
func forward(w msgWriter, r msgReader, n int) error {
	return forwardBytes(w, r, n+5)
}

// forwardBytes copies the next n bytes from r to w.
func forwardBytes(w msgWriter, r msgReader, n int) error {
	if ib, ok := r.(*inbuf); ok {
		// The event loop has only what it has read so far: the rest of a
		// large message follows as it arrives.
		ib.forward(w, n)
		return nil
	}
	for n > 0 {
		if r.Buffered() == 0 {
			if _, err := r.Peek(1); err != nil {
				return err
			}
		}
		k := min(n, r.Buffered())
		b, _ := r.Peek(k)
		if _, err := w.Write(b); err != nil {
			return err
		}
		r.Discard(k)
		n -= k
	}
	return nil
}

// skip drops the next message.
func skip(r msgReader, n int) error {
	_, err := r.Discard(n + 5)
	return err
}

// message consumes the next message, whose body is n bytes, and returns it
// whole, header and body. The bytes are the reader's own when it holds the
// message whole (the event loop always has a Query or Parse whole), valid
// until the next read from r; only otherwise are they copied into buf. So a
// message taken to be looked at and then passed on is copied once, into
// the writer.
func message(r msgReader, n int, buf *[]byte) ([]byte, error) {
	if m, err := r.Peek(5 + n); err == nil {
		r.Discard(5 + n)
		return m, nil
	}
	if cap(*buf) < 5+n {
		*buf = make([]byte, 5+n)
	}
	m := (*buf)[:5+n]
	if _, err := readFull(r, m); err != nil {
		return nil, err
	}
	return m, nil
}

// body consumes the next message and returns its body in buf (grown as
// needed and reused across calls).
func body(r msgReader, n int, buf *[]byte) ([]byte, error) {
	if _, err := r.Discard(5); err != nil {
		return nil, err
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	if _, err := readFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

func readFull(r msgReader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// cstring splits a NUL-terminated string off the front of b.
func cstring(b []byte) (s, rest []byte, err error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, nil, fmt.Errorf("%w: missing string terminator", ErrMalformed)
	}
	return b[:i], b[i+1:], nil
}

// msgType is a message type of either direction.
type msgType interface{ clientMsg | serverMsg }

// writeMessage writes a message of type typ with body b: a clientMsg to
// the server, a serverMsg to the client.
func writeMessage[T msgType](w msgWriter, typ T, b []byte) error {
	// Byte by byte: a header array handed to an interface's Write would
	// be allocated on the heap, once per message.
	n := uint32(len(b) + 4)
	w.WriteByte(byte(typ))
	w.WriteByte(byte(n >> 24))
	w.WriteByte(byte(n >> 16))
	w.WriteByte(byte(n >> 8))
	w.WriteByte(byte(n))
	_, err := w.Write(b)
	return err
}
