package proxy

import "errors"

// bufSize is the event loop's unit of buffer: what one read takes in, and
// the largest message it keeps whole before streaming it through.
const bufSize = 16 << 10

// errShort means the event loop's buffer does not hold what was asked for.
// The loop dispatches a message only once the bytes its handler reads are
// in, so seeing it is a bug, and ends the session.
var errShort = errors.New("pgfence: message handler read past what the event loop had buffered")

// bufPool recycles the event loop's buffers, so an idle session holds none.
// Only the loop uses it: no locking.
type bufPool struct{ free [][]byte }

func (p *bufPool) get() []byte {
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free = p.free[:n-1]
		return b
	}
	return make([]byte, bufSize)
}

func (p *bufPool) put(b []byte) {
	if cap(b) == bufSize && len(p.free) < 1024 {
		p.free = append(p.free, b[:bufSize])
	}
}

// inbuf holds what the event loop read from one side and has not yet
// relayed. It reads like a bufio.Reader that never blocks.
type inbuf struct {
	b    []byte // b[r:w] is unread
	r, w int
	// pending counts the bytes of a message being forwarded that are still
	// to arrive: they go straight through before the next message.
	pending int
}

func (b *inbuf) Buffered() int { return b.w - b.r }

func (b *inbuf) Peek(n int) ([]byte, error) {
	if n > b.w-b.r {
		return b.b[b.r:b.w], errShort
	}
	return b.b[b.r : b.r+n], nil
}

func (b *inbuf) Discard(n int) (int, error) {
	if n > b.w-b.r {
		d := b.w - b.r
		b.r = b.w
		return d, errShort
	}
	b.r += n
	return n, nil
}

func (b *inbuf) Read(p []byte) (int, error) {
	if b.r == b.w {
		return 0, errShort
	}
	n := copy(p, b.b[b.r:b.w])
	b.r += n
	return n, nil
}

// forward writes up to n bytes to w and notes how many are still to come.
func (b *inbuf) forward(w msgWriter, n int) {
	k := min(n, b.w-b.r)
	w.Write(b.b[b.r : b.r+k])
	b.r += k
	b.pending = n - k
}

// space makes room to read at least 1 KiB more, and to hold whole the
// message of need bytes that starts at the first unread byte (0 when there
// is none), and returns where to read into.
func (b *inbuf) space(p *bufPool, need int) []byte {
	if b.b == nil {
		b.b = p.get()
	}
	if b.r == b.w {
		b.r, b.w = 0, 0
	}
	want := max(need, b.w-b.r+1<<10)
	switch {
	case b.r+want <= len(b.b):
	case want <= len(b.b):
		b.w = copy(b.b, b.b[b.r:b.w])
		b.r = 0
	default:
		nb := make([]byte, (want+bufSize-1)/bufSize*bufSize)
		b.w = copy(nb, b.b[b.r:b.w])
		p.put(b.b)
		b.b, b.r = nb, 0
	}
	return b.b[b.w:]
}

// release gives an emptied buffer back to the pool.
func (b *inbuf) release(p *bufPool) {
	if b.r == b.w && b.b != nil {
		p.put(b.b)
		b.b, b.r, b.w = nil, 0, 0
	}
}

// outbuf collects what the event loop is to write to one side.
type outbuf struct {
	pool *bufPool
	b    []byte
	off  int // b[off:] is not written yet
}

func (o *outbuf) Write(p []byte) (int, error) {
	if o.b == nil {
		o.b = o.pool.get()[:0]
	}
	o.b = append(o.b, p...)
	return len(p), nil
}

func (o *outbuf) WriteByte(c byte) error {
	if o.b == nil {
		o.b = o.pool.get()[:0]
	}
	o.b = append(o.b, c)
	return nil
}

// Flush is the loop's to do, once it has relayed all it read.
func (o *outbuf) Flush() error { return nil }

func (o *outbuf) pendingBytes() []byte { return o.b[o.off:] }

// release gives an emptied buffer back to the pool.
func (o *outbuf) release() {
	if o.off == len(o.b) && o.b != nil {
		o.pool.put(o.b)
		o.b, o.off = nil, 0
	}
}
