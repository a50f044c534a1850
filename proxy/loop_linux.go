package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loop: see the package documentation.

// haveEventLoop says the event loop can run here.
const haveEventLoop = true

// startLoops starts n event loops; they run until stopLoops.
func startLoops(n int) ([]*loop, error) {
	loops := make([]*loop, n)
	for i := range loops {
		l, err := newLoop(i)
		if err != nil {
			stopLoops(loops[:i])
			return nil, err
		}
		loops[i] = l
		go l.run()
	}
	return loops, nil
}

// stopLoops ends loops whose sessions have all ended, and waits for them.
func stopLoops(loops []*loop) {
	for _, l := range loops {
		l.post(func() { l.quit = true })
	}
	for _, l := range loops {
		<-l.stopped
	}
}

// loop is one event loop: its epoll set, and the sessions in it. A
// session stays on the loop that took it until it ends.
type loop struct {
	id       int // its index among the Server's loops
	ep, wake int // the epoll set, and an eventfd in it that post signals
	// epf is ep as a file in Go's netpoller, and rc its descriptor, which
	// the loop waits on when it has nothing to do (see run).
	epf *os.File
	rc  syscall.RawConn

	mu     sync.Mutex
	queue  []func() // work posted from other goroutines
	closed bool     // ep and wake are closed: post drops what it is given

	stopped chan struct{} // closed once run has returned

	// Owned by the loop goroutine.
	sides []*side // by file descriptor
	pool  bufPool
	quit  bool // set by stopLoops: run returns
}

type loopSession struct {
	l     *loop
	s     *session
	c, sv side
	done  chan loopEnd
	ended bool
	// stop, made by park, is closed when the session ends.
	stop chan struct{}
}

// loopEnd says how a session ended: which side first, and why.
type loopEnd struct {
	fromClient bool
	err        error
}

func newLoop(id int) (*loop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, err
	}
	// Non-blocking, os.NewFile puts the epoll set in Go's netpoller: it
	// is readable while it has events.
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, err
	}
	epf := os.NewFile(uintptr(ep), "epoll")
	rc, err := epf.SyscallConn()
	if err != nil {
		epf.Close()
		unix.Close(wake)
		return nil, err
	}
	return &loop{id: id, ep: ep, wake: wake, epf: epf, rc: rc, stopped: make(chan struct{})}, nil
}

// post runs f on the loop goroutine; once the loop has stopped, never.
func (l *loop) post(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.queue = append(l.queue, f)
	one := [8]byte{1}
	unix.Write(l.wake, one[:])
}

// close ends the loop's descriptors, under mu so that no post writes to
// a descriptor number that may already be another file's.
func (l *loop) close() {
	l.mu.Lock()
	l.closed = true
	l.queue = nil
	l.epf.Close()
	unix.Close(l.wake)
	l.mu.Unlock()
	close(l.stopped)
}

// relay runs s on the loop until it ends, then gives s connections of its
// own again (with whatever the loop had not written yet buffered in s.cw
// and s.sw) for the end of the session. ok is false, with nothing done,
// when the connections cannot be relayed by the loop (not sockets).
func (l *loop) relay(s *session) (end loopEnd, ok bool) {
	s.mu.Lock()
	cfd, sfd := dupFD(s.client), dupFD(s.server)
	if cfd < 0 || sfd < 0 {
		s.mu.Unlock()
		closeFDs(cfd, sfd)
		return loopEnd{}, false
	}
	ls := &loopSession{l: l, s: s, done: make(chan loopEnd, 1)}
	ls.c = side{fd: cfd, ls: ls, client: true, peer: &ls.sv}
	ls.sv = side{fd: sfd, ls: ls, peer: &ls.c}
	ls.c.out.pool, ls.sv.out.pool = &l.pool, &l.pool
	ls.c.onLoop(s.client, cfd, &l.pool)
	ls.sv.onLoop(s.server, sfd, &l.pool)
	// What the client sent right behind its startup packet was read ahead.
	var early []byte
	if n := s.cr.Buffered(); n > 0 {
		b, _ := s.cr.Peek(n)
		early = append(early, b...)
	}
	s.cr, s.cw, s.sr, s.sw = &ls.c.in, &ls.c.out, &ls.sv.in, &ls.sv.out
	s.stop = func() { l.post(func() { l.end(ls, false, net.ErrClosed) }) }
	// Closing the originals takes them out of Go's netpoller, which would
	// otherwise wake for every byte the loop moves.
	socketOf(s.client).Close()
	socketOf(s.server).Close()
	s.mu.Unlock()

	s.pipe.single = true // post and done order it with the loop's use
	l.post(func() { l.add(ls, early) })
	end = <-ls.done
	s.pipe.single = false

	s.mu.Lock()
	s.stop = nil
	s.client = ls.c.offLoop(s.client, cfd, "client")
	s.server = ls.sv.offLoop(s.server, sfd, "server")
	s.mu.Unlock()
	s.cw = handBack(s.client, ls.c.out.pendingBytes())
	s.sw = handBack(s.server, ls.sv.out.pendingBytes())
	s.server.SetWriteDeadline(time.Now().Add(time.Second))
	s.sw.Flush() // a Terminate, say; Postgres may be gone, which is fine
	return end, true
}

// dupFD returns a descriptor of c's own for the loop, or -1 if c is neither
// a socket nor pgfence's TLS on one.
func dupFD(c net.Conn) int {
	var sc syscall.Conn
	switch c := socketOf(c).(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd, _ = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }) != nil {
		return -1
	}
	return fd
}

func closeFDs(fds ...int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// fileConn turns a descriptor back into a net.Conn, closing the
// descriptor. If that fails the session still ends; its conn just refuses
// I/O.
func fileConn(fd int, name string) net.Conn {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return deadConn{err}
	}
	return c
}

// handBack is a writer on c that has pending already buffered.
func handBack(c net.Conn, pending []byte) *bufio.Writer {
	w := bufio.NewWriterSize(c, max(4<<10, len(pending)))
	w.Write(pending)
	return w
}

// add starts relaying ls.
func (l *loop) add(ls *loopSession, early []byte) {
	for _, x := range []*side{&ls.c, &ls.sv} {
		for x.fd >= len(l.sides) {
			l.sides = append(l.sides, nil)
		}
		l.sides[x.fd] = x
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(x.fd)}
		if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, x.fd, &ev); err != nil {
			l.end(ls, x.client, fmt.Errorf("event loop: %w", err))
			return
		}
	}
	if len(early) > 0 {
		copy(ls.c.in.space(&l.pool, len(early)), early)
		ls.c.in.w += len(early)
		l.relayed(&ls.c)
	}
	// A tls.Conn may hold records it read ahead during startup, which no
	// edge will announce.
	for _, x := range []*side{&ls.c, &ls.sv} {
		if x.tt != nil {
			x.arrived(false)
			l.readable(x)
		}
	}
}

// end stops relaying ls and hands it back to its goroutine.
func (l *loop) end(ls *loopSession, fromClient bool, err error) {
	if ls.ended {
		return
	}
	ls.ended = true
	if ls.stop != nil {
		close(ls.stop)
	}
	ls.s.pipe.abandon()
	for _, x := range []*side{&ls.c, &ls.sv} {
		l.write(x) // best effort: what is left is handed back
		if x.fd < len(l.sides) && l.sides[x.fd] == x {
			l.sides[x.fd] = nil
			unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, x.fd, nil)
		}
		x.in.release(&l.pool)
	}
	ls.done <- loopEnd{fromClient, err}
}

func (l *loop) run() {
	defer l.close()
	evs := make([]unix.EpollEvent, 256)
	// serve handles what the epoll set has ready, until a wait returns
	// short of evs: the set was then drained, and whatever arrives later
	// is a new edge in the netpoller. Made once, as a closure made per
	// wait would be an allocation per wait.
	serve := func(uintptr) bool {
		for !l.quit {
			n, err := rawEpollWait(l.ep, evs, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				panic(fmt.Sprintf("pgfence: event loop: epoll_wait: %v", err))
			}
			l.handle(evs[:n])
			if n < len(evs) {
				return l.quit
			}
		}
		return true
	}
	// The loop parks in Go's netpoller inside this one Read, which returns
	// only once the loop quits (see The event loop in the package
	// documentation).
	if l.rc.Read(serve) == nil {
		return
	}
	// The netpoller refused the epoll set: block in the kernel.
	for !l.quit {
		n, err := unix.EpollWait(l.ep, evs, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			panic(fmt.Sprintf("pgfence: event loop: epoll_wait: %v", err))
		}
		l.handle(evs[:n])
	}
}

// handle handles one epoll_wait's events.
func (l *loop) handle(evs []unix.EpollEvent) {
	for i := range evs {
		fd, ev := int(evs[i].Fd), evs[i].Events
		if fd == l.wake {
			l.drainPosts()
			continue
		}
		if fd >= len(l.sides) || l.sides[fd] == nil {
			continue // its session ended earlier in this batch
		}
		x := l.sides[fd]
		if ev&unix.EPOLLOUT != 0 {
			// x takes more. What was pending for it may have gone out
			// since (written after reading x's own messages): its peer,
			// paused while x was backed up, is resumed all the same.
			l.writable(x)
		}
		if ev&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR|unix.EPOLLRDHUP) != 0 {
			x.arrived(ev&(unix.EPOLLHUP|unix.EPOLLERR|unix.EPOLLRDHUP) != 0)
			l.readable(x)
		}
	}
}

func (l *loop) drainPosts() {
	var b [8]byte
	unix.Read(l.wake, b[:])
	l.mu.Lock()
	q := l.queue
	l.queue = nil
	l.mu.Unlock()
	for _, f := range q {
		f()
	}
}

// readable reads what x has sent and relays it, until x is drained or its
// peer is backed up (so a slow reader slows its writer instead of growing
// a buffer); writable resumes it then.
func (l *loop) readable(x *side) {
	if x.parked && x.hup && x.client && !x.ls.ended {
		// The client left while its next statement waits (see
		// Client.HoldNextStatement): end the session now, as when it
		// leaves mid-query, rather than once the server has answered.
		l.end(x.ls, true, io.EOF)
		return
	}
	for x.more && !x.ls.ended && !x.parked && x.peer.flushed() {
		n, err := x.fill(x.in.space(&l.pool, x.need()))
		if err != nil {
			l.end(x.ls, x.client, err)
			return
		}
		if n == 0 { // drained
			// TLS may have answered a record of its own (a key update),
			// which must not wait for the next message.
			if x.tt != nil && !x.flushed() {
				if err := l.write(x); err != nil {
					l.end(x.ls, x.client, err)
				}
			}
			return
		}
		x.in.w += n
		l.relayed(x)
	}
}

// park stops reading and handling x's messages until ch is closed, then
// handles those it holds and reads on.
func (l *loop) park(x *side, ch <-chan struct{}) {
	x.parked = true
	if x.ls.stop == nil {
		x.ls.stop = make(chan struct{})
	}
	stop := x.ls.stop
	go func() {
		select {
		case <-ch:
		case <-stop:
			return
		}
		l.post(func() {
			if x.ls.ended || !x.parked {
				return
			}
			x.parked = false
			l.relayed(x)
			if !x.ls.ended {
				l.readable(x)
			}
		})
	}()
}

// resumeLocal resumes x, a client side parked on its pipeline's channel
// (see side.hold), if the server side's messages just handled closed it:
// the pipeline drained, or the session ended.
func (l *loop) resumeLocal(x *side) {
	if !x.parked || x.parkedOn == nil || x.ls.ended {
		return
	}
	select {
	case <-x.parkedOn:
	default:
		return
	}
	x.parked, x.parkedOn = false, nil
	l.relayed(x)
	if !x.ls.ended {
		l.readable(x)
	}
}

// relayed hands every message x's buffer holds to the session, then writes
// what that produced.
func (l *loop) relayed(x *side) {
	if report := x.ls.s.srv.cfg.RoundTrip; report != nil {
		defer x.ls.s.rt.add(x.ls.s.c, time.Now(), report)
	}
	if err := x.dispatch(); err != nil {
		if x.client {
			err = x.ls.s.framingError(err)
		}
		l.end(x.ls, x.client, err)
		return
	}
	x.in.release(&l.pool)
	// Handlers write to the peer. Anything left for x itself is written
	// too: edge-triggered, no event would come to say it could be.
	if err := l.write(x.peer); err != nil {
		l.end(x.ls, x.peer.client, err)
		return
	}
	if err := l.write(x); err != nil {
		l.end(x.ls, x.client, err)
		return
	}
	if !x.client {
		l.resumeLocal(x.peer)
	}
}

// write sends what is buffered for x, as much as x takes now. On a TLS side
// it first encrypts it all.
func (l *loop) write(x *side) error {
	o := &x.out
	if x.tc != nil {
		if o.off < len(o.b) {
			if _, err := x.tc.Write(o.b[o.off:]); err != nil {
				return err
			}
			o.off = len(o.b)
			o.release()
		}
		o = &x.tt.out
	}
	for o.off < len(o.b) {
		n, err := rawWrite(x.fd, o.b[o.off:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil
		case err != nil:
			return err
		}
		o.off += n
	}
	o.release()
	return nil
}

// writable continues writing to x once it takes more, and once all is
// written resumes reading its peer.
func (l *loop) writable(x *side) {
	if !x.flushed() {
		if err := l.write(x); err != nil {
			l.end(x.ls, x.client, err)
			return
		}
	}
	l.readable(x.peer)
}

// The raw system calls below do not tell the Go scheduler that the thread
// may block (entering and leaving the scheduler's care costs each call
// more than the call): they are only made on non-blocking descriptors,
// and epoll_wait without a timeout.

func rawEpollWait(ep int, evs []unix.EpollEvent, msec int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// rawRead and rawWrite use recvfrom and sendto rather than read and write:
// on a socket they skip the file layer (position lock, fsnotify, iov_iter
// setup), which perf shows as about 0.1 µs per call.

func rawRead(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// deadConn stands in for a connection that could not be handed back.
type deadConn struct{ err error }

func (d deadConn) Read([]byte) (int, error)         { return 0, d.err }
func (d deadConn) Write([]byte) (int, error)        { return 0, d.err }
func (d deadConn) Close() error                     { return nil }
func (d deadConn) LocalAddr() net.Addr              { return nil }
func (d deadConn) RemoteAddr() net.Addr             { return nil }
func (d deadConn) SetDeadline(time.Time) error      { return nil }
func (d deadConn) SetReadDeadline(time.Time) error  { return nil }
func (d deadConn) SetWriteDeadline(time.Time) error { return nil }
