// Package pgscript plays Postgres wire-protocol conversations from a
// script, so that what a proxy does with each message can be tested
// without Postgres.
//
// A Server listens on loopback and stands in for Postgres: each connection
// it accepts is a Backend, which completes startup the way Postgres does
// (AuthenticationOk, ParameterStatus for the encodings and
// standard_conforming_strings, BackendKeyData, ReadyForQuery) and then
// does what the script says. A Client connects to the proxy in front of
// it. A script is a list of Steps, played in order on one goroutine: what
// the client sends, what the backend must receive and answers, what the
// client must get back. Every wait is bounded (Timeout), and a message
// that is not the one the script expects fails the test with the
// conversation's messages side by side, expected and received.
//
// Messages are framed here rather than by pgproto3's Frontend and
// Backend, which read ahead: a step that says nothing more has arrived
// (BackendQuiet, ClientQuiet, ...Closed) must see every byte that did.
// They are decoded and encoded with pgproto3's message types.
package pgscript

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Timeout bounds every wait for a message or a connection.
var Timeout = 5 * time.Second

// Settle is how long a quiet step waits for a message that should not
// come, and how long a failed expectation keeps reading for its report.
var Settle = 50 * time.Millisecond

// Server is a scripted Postgres: it accepts connections on 127.0.0.1 and
// hands each to the test (Accept) once it has read its startup packet.
type Server struct {
	ln      net.Listener
	conns   chan *Backend
	cancels chan []byte
	pids    atomic.Uint32
	done    chan struct{} // closed when the test ends
}

// Listen starts a Server, closed when the test ends.
func Listen(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln, conns: make(chan *Backend, 16), cancels: make(chan []byte, 16), done: make(chan struct{})}
	s.pids.Store(4200)
	go s.accept()
	t.Cleanup(func() {
		close(s.done)
		ln.Close()
		for {
			select {
			case b := <-s.conns:
				b.conn.Close()
			default:
				return
			}
		}
	})
	return s
}

// Addr is the host:port the Server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go s.startup(c)
	}
}

// Startup packet codes.
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
)

// startup reads c's startup packets: an SSLRequest or GSSENCRequest is
// refused, a CancelRequest noted (see Cancels), a StartupMessage makes c
// a Backend for Accept.
func (s *Server) startup(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(Timeout))
		var h [4]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			c.Close()
			return
		}
		n := int(binary.BigEndian.Uint32(h[:]))
		if n < 8 || n > 10000 {
			c.Close()
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(r, body); err != nil {
			c.Close()
			return
		}
		switch binary.BigEndian.Uint32(body) {
		case codeSSLRequest, codeGSSENCRequest:
			c.Write([]byte{'N'}) // no encryption
			continue
		case codeCancelRequest:
			select {
			case s.cancels <- body[4:]:
			case <-s.done:
			}
			c.Close()
			return
		}
		var m pgproto3.StartupMessage
		if err := m.Decode(body); err != nil {
			c.Close()
			return
		}
		c.SetReadDeadline(time.Time{})
		select {
		case s.conns <- &Backend{wire: wire{conn: c, r: r}, Startup: &m, PID: s.pids.Add(1), Vars: Vars{}}:
		case <-s.done:
			c.Close()
		}
		return
	}
}

// Accept returns the next connection, once it has completed startup: its
// StartupMessage was read, and it was answered with AuthenticationOk,
// ParameterStatus server_encoding and client_encoding UTF8 and
// standard_conforming_strings on, BackendKeyData and ReadyForQuery idle.
func (s *Server) Accept(t testing.TB) *Backend {
	t.Helper()
	select {
	case b := <-s.conns:
		t.Cleanup(func() { b.conn.Close() })
		replies := b.StartupReplies()
		msgs := make([]pgproto3.Message, len(replies))
		for i, m := range replies {
			msgs[i] = m
		}
		b.send(t, "startup", msgs...)
		return b
	case <-time.After(Timeout):
		t.Fatalf("pgscript: no connection reached the scripted Postgres at %s within %v", s.Addr(), Timeout)
		return nil
	}
}

// Cancels returns the CancelRequests received so far (the process ID and
// secret key of each, as sent).
func (s *Server) Cancels() [][]byte {
	var out [][]byte
	for {
		select {
		case c := <-s.cancels:
			out = append(out, c)
		default:
			return out
		}
	}
}

// Backend is one server connection of a Server, driven by the script.
type Backend struct {
	wire
	// Startup is the StartupMessage the backend received.
	Startup *pgproto3.StartupMessage
	// PID is the process ID it gave in BackendKeyData.
	PID uint32
	// Vars are the placeholders the script's names have bound so far.
	Vars Vars
}

// SecretKey is the key every Backend gives in BackendKeyData.
var SecretKey = []byte{0, 0, 0x1e, 0x61}

// StartupReplies are what the backend answers a StartupMessage with.
func (b *Backend) StartupReplies() []pgproto3.BackendMessage {
	return []pgproto3.BackendMessage{
		&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_encoding", Value: "UTF8"},
		&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"},
		&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"},
		&pgproto3.BackendKeyData{ProcessID: b.PID, SecretKey: SecretKey},
		Ready(Idle),
	}
}

// Client is a client connection, driven by the script.
type Client struct {
	wire
}

// Dial connects a client to addr and sends its StartupMessage (user and
// database "postgres", plus params); it is closed when the test ends.
func Dial(t testing.TB, addr string, params map[string]string) *Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, Timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p := map[string]string{"user": "postgres", "database": "postgres"}
	for k, v := range params {
		p[k] = v
	}
	c := &Client{wire{conn: conn, r: bufio.NewReader(conn)}}
	c.send(t, "startup", &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: p})
	return c
}

// Connect dials the proxy at addr, which connects to s, and completes
// startup on both sides: the client must get the backend's startup
// replies, relayed as they were sent.
func Connect(t testing.TB, s *Server, addr string) (*Client, *Backend) {
	t.Helper()
	c := Dial(t, addr, nil)
	b := s.Accept(t)
	if u := b.Startup.Parameters["user"]; u != "postgres" {
		t.Fatalf("pgscript: the backend's StartupMessage has user %q, want postgres", u)
	}
	want := make([]rendered, 0, 6)
	for _, m := range b.StartupReplies() {
		want = append(want, render(m))
	}
	c.expect(t, "startup: proxy → client", want, false, b.Vars)
	return c, b
}

// wire is one end of a connection the script reads and writes.
type wire struct {
	conn net.Conn
	r    *bufio.Reader
}

// Conn is the connection itself.
func (w *wire) Conn() net.Conn { return w.conn }

func (w *wire) send(t testing.TB, what string, msgs ...pgproto3.Message) {
	t.Helper()
	var buf []byte
	for _, m := range msgs {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			t.Fatalf("%s: encoding %T: %v", what, m, err)
		}
	}
	w.write(t, what, buf)
}

func (w *wire) write(t testing.TB, what string, b []byte) {
	t.Helper()
	w.conn.SetWriteDeadline(time.Now().Add(Timeout))
	if _, err := w.conn.Write(b); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// errMalformed is a message whose length cannot be.
var errMalformed = errors.New("malformed message length")

// read reads the next message, sent by a frontend (front) or a backend,
// waiting up to d.
func (w *wire) read(front bool, d time.Duration) (pgproto3.Message, error) {
	w.conn.SetReadDeadline(time.Now().Add(d))
	var h [5]byte
	if _, err := io.ReadFull(w.r, h[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.BigEndian.Uint32(h[1:])))
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("%w: %q of length %d", errMalformed, h[0], n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(w.r, body); err != nil {
		return nil, err
	}
	var m pgproto3.Message
	if front {
		m = frontendMessage(h[0])
	} else {
		m = backendMessage(h[0], body)
	}
	if m == nil {
		return &unknown{typ: h[0], body: body}, nil
	}
	if err := m.Decode(body); err != nil {
		return nil, fmt.Errorf("decoding %T: %w", m, err)
	}
	return m, nil
}

// unknown is a message of a type pgscript does not decode.
type unknown struct {
	typ  byte
	body []byte
}

func (u *unknown) Decode(b []byte) error { u.body = b; return nil }
func (u *unknown) Encode(b []byte) ([]byte, error) {
	b = append(b, u.typ)
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(u.body)))
	return append(b, u.body...), nil
}

// frontendMessage and backendMessage are the decoders of each direction's
// message types: each case's type byte is the message it returns.
func frontendMessage(typ byte) pgproto3.Message {
	switch typ {
	case 'B':
		return &pgproto3.Bind{}
	case 'C':
		return &pgproto3.Close{}
	case 'D':
		return &pgproto3.Describe{}
	case 'E':
		return &pgproto3.Execute{}
	case 'F':
		return &pgproto3.FunctionCall{}
	case 'H':
		return &pgproto3.Flush{}
	case 'P':
		return &pgproto3.Parse{}
	case 'Q':
		return &pgproto3.Query{}
	case 'S':
		return &pgproto3.Sync{}
	case 'X':
		return &pgproto3.Terminate{}
	case 'd':
		return &pgproto3.CopyData{}
	case 'c':
		return &pgproto3.CopyDone{}
	case 'f':
		return &pgproto3.CopyFail{}
	}
	return nil
}

func backendMessage(typ byte, body []byte) pgproto3.Message {
	switch typ {
	case '1':
		return &pgproto3.ParseComplete{}
	case '2':
		return &pgproto3.BindComplete{}
	case '3':
		return &pgproto3.CloseComplete{}
	case 'A':
		return &pgproto3.NotificationResponse{}
	case 'C':
		return &pgproto3.CommandComplete{}
	case 'D':
		return &pgproto3.DataRow{}
	case 'E':
		return &pgproto3.ErrorResponse{}
	case 'I':
		return &pgproto3.EmptyQueryResponse{}
	case 'K':
		return &pgproto3.BackendKeyData{}
	case 'N':
		return &pgproto3.NoticeResponse{}
	case 'R':
		if len(body) == 4 && binary.BigEndian.Uint32(body) == 0 {
			return &pgproto3.AuthenticationOk{}
		}
	case 'S':
		return &pgproto3.ParameterStatus{}
	case 'T':
		return &pgproto3.RowDescription{}
	case 'Z':
		return &pgproto3.ReadyForQuery{}
	case 'c':
		return &pgproto3.CopyDone{}
	case 'd':
		return &pgproto3.CopyData{}
	case 'n':
		return &pgproto3.NoData{}
	case 's':
		return &pgproto3.PortalSuspended{}
	case 't':
		return &pgproto3.ParameterDescription{}
	}
	return nil
}

// expect reads len(want) messages and fails the test unless they match
// want, one by one; a message that does not match ends the step, after
// whatever else arrives within Settle is read for the report.
func (w *wire) expect(t testing.TB, what string, want []rendered, front bool, vars Vars) {
	t.Helper()
	var got []rendered
	for i := range want {
		m, err := w.read(front, Timeout)
		if err != nil {
			t.Fatalf("%s: after %d of %d messages: %s%s", what, len(got), len(want), describeErr(err), diff(want, got, len(got), vars))
		}
		r := render(m)
		got = append(got, r)
		if !vars.match(want[i], r) {
			got = append(got, w.drain(front)...)
			t.Fatalf("%s: message %d of %d is not the one expected:%s", what, i+1, len(want), diff(want, got, i, vars))
		}
	}
}

// drain reads what else arrives within Settle.
func (w *wire) drain(front bool) []rendered {
	var more []rendered
	for len(more) < 100 {
		m, err := w.read(front, Settle)
		if err != nil {
			break
		}
		more = append(more, render(m))
	}
	return more
}

// quiet fails the test if a message arrives within d, or the connection
// ends.
func (w *wire) quiet(t testing.TB, what string, front bool, d time.Duration) {
	t.Helper()
	w.conn.SetReadDeadline(time.Now().Add(d))
	_, err := w.r.Peek(1)
	if isTimeout(err) {
		return
	}
	if err != nil {
		t.Fatalf("%s: want nothing for %v, and the connection ended: %s", what, d, describeErr(err))
	}
	got := w.drain(front)
	t.Fatalf("%s: want nothing for %v, got:%s", what, d, diff(nil, got, 0, nil))
}

// closed fails the test unless the peer closes the connection, with
// nothing more, within Timeout.
func (w *wire) closed(t testing.TB, what string, front bool) {
	t.Helper()
	m, err := w.read(front, Timeout)
	if err == nil {
		got := append([]rendered{render(m)}, w.drain(front)...)
		t.Fatalf("%s: want the connection closed, got:%s", what, diff(nil, got, 0, nil))
	}
	if isTimeout(err) {
		t.Fatalf("%s: want the connection closed, and it is still open after %v", what, Timeout)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
		t.Fatalf("%s: want the connection closed: %v", what, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func describeErr(err error) string {
	switch {
	case isTimeout(err):
		return fmt.Sprintf("nothing more arrived within %v", Timeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection was closed"
	}
	return err.Error()
}

// Step is one step of a script (see Play).
type Step struct {
	op    op
	front []pgproto3.FrontendMessage
	back  []pgproto3.BackendMessage
	raw   []byte
	wait  time.Duration
	do    func(t testing.TB)
	at    string // where the script made it, for failures
}

type op uint8

const (
	opClientSends op = iota
	opClientSendsRaw
	opBackendGets
	opBackendSends
	opClientGets
	opBackendQuiet
	opClientQuiet
	opBackendClosed
	opClientClosed
	opDo
)

var opNames = [...]string{"client sends", "client sends bytes", "proxy → backend", "backend sends", "proxy → client",
	"backend gets nothing", "client gets nothing", "backend connection closed", "client connection closed", "check"}

func step(s Step) Step {
	if _, file, line, ok := runtime.Caller(2); ok {
		s.at = fmt.Sprintf("%s:%d", filepath.Base(file), line)
	}
	return s
}

// ClientSends has the client send msgs, all at once.
func ClientSends(msgs ...pgproto3.FrontendMessage) Step {
	return step(Step{op: opClientSends, front: msgs})
}

// ClientSendsBytes has the client send b as it is.
func ClientSendsBytes(b []byte) Step { return step(Step{op: opClientSendsRaw, raw: b}) }

// BackendGets expects the backend to receive exactly msgs, in order: the
// proxy sent them.
func BackendGets(msgs ...pgproto3.FrontendMessage) Step {
	return step(Step{op: opBackendGets, front: msgs})
}

// BackendSends has the backend send msgs, all at once.
func BackendSends(msgs ...pgproto3.BackendMessage) Step {
	return step(Step{op: opBackendSends, back: msgs})
}

// ClientGets expects the client to receive exactly msgs, in order.
func ClientGets(msgs ...pgproto3.BackendMessage) Step {
	return step(Step{op: opClientGets, back: msgs})
}

// BackendQuiet expects the backend to receive nothing for Settle.
func BackendQuiet() Step { return step(Step{op: opBackendQuiet, wait: Settle}) }

// ClientQuiet expects the client to receive nothing for Settle.
func ClientQuiet() Step { return step(Step{op: opClientQuiet, wait: Settle}) }

// BackendClosed expects the proxy to close the backend's connection with
// nothing more sent.
func BackendClosed() Step { return step(Step{op: opBackendClosed}) }

// ClientClosed expects the proxy to close the client's connection with
// nothing more sent.
func ClientClosed() Step { return step(Step{op: opClientClosed}) }

// Do runs f at this point of the script.
func Do(f func(t testing.TB)) Step { return step(Step{op: opDo, do: f}) }

// Play plays steps on the client c and the backend b, in order, failing
// the test at the first step that does not go as scripted. The backend's
// Vars bind the placeholders of every step's names.
func Play(t testing.TB, c *Client, b *Backend, steps ...Step) {
	t.Helper()
	for i, s := range steps {
		what := fmt.Sprintf("step %d (%s, %s)", i+1, opNames[s.op], s.at)
		switch s.op {
		case opClientSends:
			var buf []byte
			for _, m := range s.front {
				var err error
				if buf, err = m.Encode(buf); err != nil {
					t.Fatalf("%s: encoding %T: %v", what, m, err)
				}
			}
			c.write(t, what, buf)
		case opClientSendsRaw:
			c.write(t, what, s.raw)
		case opBackendGets:
			want := make([]rendered, len(s.front))
			for i, m := range s.front {
				want[i] = render(m)
			}
			b.expect(t, what, want, true, b.Vars)
		case opBackendSends:
			msgs := make([]pgproto3.Message, len(s.back))
			for i, m := range s.back {
				msgs[i] = m
			}
			b.send(t, what, msgs...)
		case opClientGets:
			want := make([]rendered, len(s.back))
			for i, m := range s.back {
				want[i] = render(m)
			}
			c.expect(t, what, want, false, b.Vars)
		case opBackendQuiet:
			b.quiet(t, what, true, s.wait)
		case opClientQuiet:
			c.quiet(t, what, false, s.wait)
		case opBackendClosed:
			b.closed(t, what, true)
		case opClientClosed:
			c.closed(t, what, false)
		case opDo:
			s.do(t)
		}
	}
}
