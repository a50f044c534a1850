// Package netfault puts faults on a TCP link for tests: a relay that
// delays, partitions or cuts what goes through it, between a client and
// Postgres, pgfence, etcd or a replica.
package netfault

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Relay is a TCP hop on 127.0.0.1 to a fixed target, for faults on a link:
// SetDelay makes it sleep before forwarding each chunk (a slow link),
// Partition makes it hold every byte until Heal (the peers' connections
// stay open but nothing gets through, like a dropped route), and Cut closes
// every connection through it.
type Relay struct {
	target string
	ln     net.Listener

	delay  atomic.Int64 // nanoseconds
	parted atomic.Bool

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewRelay listens on a free 127.0.0.1 port and forwards each connection
// to target (host:port), dialed when the connection arrives.
func NewRelay(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// Addr is where clients connect.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// SetDelay sets the sleep before each forwarded chunk, both ways; 0 for none.
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Partition holds all traffic, in both directions, until Heal.
func (r *Relay) Partition() { r.parted.Store(true) }

// Heal lets held and new traffic through again.
func (r *Relay) Heal() { r.parted.Store(false) }

// Cut closes every open connection (new ones are still accepted).
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
}

// Close stops accepting and closes every connection.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	err := r.ln.Close()
	r.Cut()
	r.wg.Wait()
	return err
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *Relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !r.track(c) {
			return
		}
		r.wg.Add(1)
		go r.handle(c)
	}
}

func (r *Relay) handle(c net.Conn) {
	defer r.wg.Done()
	defer r.untrack(c)
	up, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		return
	}
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	done := make(chan struct{}, 2)
	go func() { r.pipe(up, c); done <- struct{}{} }()
	go func() { r.pipe(c, up); done <- struct{}{} }()
	<-done // one side ended: end both
}

// pipe copies src to dst chunk by chunk, honouring delay and partition.
func (r *Relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			for r.parted.Load() {
				if r.isClosed() {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			if d := time.Duration(r.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *Relay) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
