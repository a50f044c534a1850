package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Config configures a Server.
type Config struct {
	// Upstream is the Postgres server's address: host:port, or a socket
	// path when UpstreamNetwork is "unix".
	Upstream        string
	UpstreamNetwork string // "tcp" (default) or "unix"
	// Interceptor sees SQL and errors; required.
	Interceptor Interceptor
	// Logger receives connection-level events; nil discards them.
	Logger *slog.Logger
	// MaxMessageSize bounds one client message's body in bytes; a larger
	// one ends that client's session. Default 256 MiB.
	MaxMessageSize int
	// StartupTimeout bounds how long a client may take to send its startup
	// packet. Default 30s.
	StartupTimeout time.Duration
	// DialTimeout bounds connecting to Upstream. Default 5s.
	DialTimeout time.Duration
	// MaxClientConns bounds the client connections open at once, counted
	// from accept to their end: sessions, and connections still in
	// startup or bringing a cancel request. One over it is refused at
	// once with SQLSTATE 53300, before anything of it is read, so that
	// connections that send nothing cannot hold more descriptors than the
	// limit allows (see Server.refuse). 0 means no limit.
	MaxClientConns int
	// TLS, if set, is offered to clients that send SSLRequest: pgfence
	// terminates their TLS. Without it they are told "N".
	TLS *tls.Config
	// RequireClientTLS refuses a client whose StartupMessage does not come
	// over TLS, with SQLSTATE 28000: where the proxy's leg to Postgres is
	// TLS, Postgres's hostssl rules see that leg, never the client's. It
	// needs TLS. A cancel request is taken either way (it carries no
	// credentials, and libpq before 17 always sends it in plain text), and
	// so is a client on a Unix socket, over which drivers never try TLS
	// (nor do Postgres's hostssl rules apply to one).
	RequireClientTLS bool
	// UpstreamTLS, if set, is used to connect to Postgres over TLS. If
	// Postgres refuses TLS, the session fails when UpstreamTLSRequired, and
	// goes on in plain text otherwise (sslmode=prefer).
	UpstreamTLS         *tls.Config
	UpstreamTLSRequired bool
	// GoroutineRelay relays every session with two goroutines of its own
	// instead of the event loops (see loop_linux.go), as off Linux, where
	// there are none: it does the same work at about twice the CPU per
	// message, without answered SETs, round-trip latencies or transaction
	// pooling. pgfence never sets it; it is here for the proxy's tests of
	// that fallback (PGFENCE_TEST_RELAY=goroutines, see
	// docs/development.md).
	GoroutineRelay bool
	// EventLoops is how many event loops relay the sessions, each on a
	// goroutine of its own with its own sessions (see The event loop in the
	// package documentation); 0 means one per usable core,
	// runtime.GOMAXPROCS(0) when New runs.
	EventLoops int
	// ForwardSettings sends every SET to Postgres as the client sent it.
	// By default a plain SET the Interceptor vouches for (Plan.Setting),
	// sent while the session is idle or in a transaction block that has
	// not failed, with nothing in flight, is answered by the proxy at once
	// and run on the server ahead of the client's next statement, in the
	// same transaction when that is one write, so setting the fencing
	// token costs no round trip to Postgres of its own (see Deferred
	// settings in the package documentation).
	// Event-loop sessions only.
	ForwardSettings bool
	// SettingSQL is the statement that runs an answered SET on the server:
	// a single-row SELECT of set_config($1, $2, $3) (the setting's name,
	// its value, and whether it is local) and then pg_backend_pid(), whose
	// change between transactions tells the proxy a transaction pooler is
	// behind it. The Interceptor's package provides it
	// (sqlrewrite.SettingSQL): the proxy writes no SQL of its own. ""
	// forwards every SET as sent, as ForwardSettings does.
	SettingSQL string
	// StandInSQL is the text of the Parse of the unnamed statement that
	// answers a client's Parse the proxy reuses a statement for (see
	// Plan.Reuse and Statement reuse in the package documentation): one
	// Postgres parses cheaply, refuses in a failed transaction block as it
	// would the client's text, and refuses to run if it is ever bound. The
	// Interceptor's package provides it (sqlrewrite.StandInSQL). "" turns
	// reuse for the unnamed statement off: each Parse of it is sent as
	// planned (a bound Query, Plan.ParamTypes, still reuses its statement).
	StandInSQL string
	// TransactionPooling says a transaction pooler (PgBouncer with
	// pool_mode = transaction) stands between the proxy and Postgres, so
	// the server connection behind a session may serve other clients
	// between its transactions: the proxy then leaves nothing on it past
	// a transaction, and sets the session's token settings, TokenSetting
	// among them, in each transaction that may need them (see txpooling.go).
	// It needs the event loop and answered settings (not GoroutineRelay
	// or ForwardSettings).
	TransactionPooling bool
	TokenSetting       string
	// Admit, if set, is asked before each client session is connected to
	// Postgres (and before the Interceptor's SessionStart); an error
	// refuses the session with FATAL 08004 and the error's text. It may
	// take its time (pgfence serve waits there for the first read of the
	// session's database's catalog): the client waits, and nothing else
	// does.
	Admit func(*Client) error
	// RequirePrimary ends a session whose server says it is a standby
	// (ParameterStatus in_hot_standby = on, Postgres 14 and later), as
	// libpq's target_session_attrs=read-write would not use it: after a
	// failover the address pgfence was given may be a standby for a while.
	RequirePrimary bool
	// Hints are what clients are told to do about limits and faults that
	// the deployment sets; the zero value gives generic ones.
	Hints Hints
	// UpstreamFailed, if set, is told why a session could not be
	// connected to Postgres: a failure to connect, or an error from
	// Postgres before the session's first ReadyForQuery.
	UpstreamFailed func(UpstreamFailure)
	// RoundTrip, if set, is told at each ReadyForQuery relayed to a client
	// how long the proxy spent on the round trip it ends: handling its
	// bytes both ways, from reading them to writing them on (not the time
	// Postgres took, nor the wait for a socket to be readable), from the
	// session's loop (see Client.Loop). Event-loop sessions only.
	RoundTrip func(*Client, time.Duration)
}

// Hints word the hints of errors whose remedy is in how the proxy was
// configured, so that a program built on the proxy can name its own
// settings (pgfence serve names its flags). Empty ones are generic.
type Hints struct {
	TooManyClients  string // a client over MaxClientConns
	CannotConnect   string // Postgres could not be reached
	MessageTooLarge string // a client message over MaxMessageSize
	Pooler          string // a transaction pooler found behind an undeclared proxy
}

// withDefaults fills in the generic hints.
func (h Hints) withDefaults() Hints {
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&h.TooManyClients, "try again later, or raise the proxy's limit on client connections")
	def(&h.CannotConnect, "check that Postgres is running and the proxy's upstream address is right; try again")
	def(&h.MessageTooLarge, "send smaller messages, or raise the proxy's message size limit")
	def(&h.Pooler, "declare the transaction pooler to the proxy, or connect it to Postgres directly")
	return h
}

// Server accepts clients and relays each to its own Postgres connection.
type Server struct {
	cfg    Config
	log    *slog.Logger
	nextID atomic.Uint64

	mu sync.Mutex
	// conns holds every client connection from accept to its end (nil
	// until its startup is done): MaxClientConns bounds how many.
	conns    map[net.Conn]*session
	active   int // sessions past startup
	closed   bool
	draining atomic.Bool
	wg       sync.WaitGroup
	up       atomic.Pointer[Upstream] // where new sessions connect (see SetUpstream)
	// The log lines of connections that end before their session starts
	// (refused over MaxClientConns, failed startups, refusals), which any
	// client can make as fast as it connects, are paced (see logPace).
	refusals, startups logPace

	// loops relay the sessions (none with GoroutineRelay, or off Linux).
	// loopSessions counts, under mu, the sessions each holds: those past
	// startup, from admit to untrack. nextLoop is where admit starts its
	// search for the loop with the fewest, so that ties go round.
	loops        []*loop
	loopSessions []int
	nextLoop     int
	stopOnce     sync.Once
	// standIn is the body of the Parse of Config.StandInSQL, nil without
	// one (see reuseState.standIn).
	standIn []byte
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Interceptor == nil {
		return nil, errors.New("proxy: Config.Interceptor is required")
	}
	if cfg.Upstream == "" {
		return nil, errors.New("proxy: Config.Upstream is required")
	}
	if cfg.TransactionPooling {
		if _, ok := cfg.Interceptor.(PooledSets); !ok {
			return nil, errors.New("proxy: Config.TransactionPooling needs an Interceptor that implements PooledSets")
		}
		switch {
		case cfg.TokenSetting == "":
			return nil, errors.New("proxy: Config.TransactionPooling needs Config.TokenSetting")
		case cfg.GoroutineRelay || cfg.ForwardSettings || cfg.SettingSQL == "" || !haveEventLoop:
			return nil, errors.New("proxy: Config.TransactionPooling needs the event loop (Linux, no GoroutineRelay) and answered settings (SettingSQL, no ForwardSettings)")
		}
	}
	if cfg.RequireClientTLS && cfg.TLS == nil {
		return nil, errors.New("proxy: Config.RequireClientTLS needs Config.TLS: the proxy cannot require TLS it does not offer")
	}
	if cfg.UpstreamNetwork == "" {
		cfg.UpstreamNetwork = "tcp"
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 256 << 20
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 30 * time.Second
	}
	cfg.Hints = cfg.Hints.withDefaults()
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.EventLoops < 0 {
		return nil, fmt.Errorf("proxy: Config.EventLoops is %d: want 0 (one per core) or more", cfg.EventLoops)
	}
	if cfg.EventLoops == 0 {
		cfg.EventLoops = runtime.GOMAXPROCS(0)
	}
	if strings.IndexByte(cfg.StandInSQL, 0) >= 0 {
		return nil, errors.New("proxy: Config.StandInSQL holds a zero byte, which no SQL text may")
	}
	srv := &Server{cfg: cfg, log: log, conns: make(map[net.Conn]*session), standIn: standInParse(cfg.StandInSQL)}
	if !cfg.GoroutineRelay && haveEventLoop {
		loops, err := startLoops(cfg.EventLoops)
		if err != nil {
			return nil, fmt.Errorf("proxy: cannot start %d event loops: %w (GoroutineRelay relays without them)", cfg.EventLoops, err)
		}
		srv.loops, srv.loopSessions = loops, make([]int, len(loops))
	}
	srv.up.Store(&Upstream{Network: cfg.UpstreamNetwork, Addr: cfg.Upstream, TLS: cfg.UpstreamTLS, TLSRequired: cfg.UpstreamTLSRequired})
	return srv, nil
}

// Upstream is where new sessions connect to Postgres, and how.
type Upstream struct {
	Network, Addr string // as net.Dial takes them
	TLS           *tls.Config
	TLSRequired   bool
}

// Upstream returns where new sessions connect.
func (s *Server) Upstream() Upstream { return *s.up.Load() }

// SetUpstream has new sessions connect to up, as after a failover. When its
// address is another, the sessions connected elsewhere are ended, so that
// their clients reconnect to up rather than go on writing to a server
// that is no longer the one pgfence was told is the primary.
func (s *Server) SetUpstream(up Upstream) {
	old := s.up.Swap(&up)
	if old.Addr == up.Addr {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ended := 0
	for _, sess := range s.conns {
		if sess != nil && sess.upstream != "" && sess.upstream != up.Addr {
			sess.closeServer()
			ended++
		}
	}
	s.log.Warn("upstream moved: new sessions go to the new one; sessions on the old one were ended", "from", old.Addr, "to", up.Addr, "sessions_ended", ended)
}

// Serve accepts connections on ln until ln is closed or Close is called.
func (s *Server) Serve(ln net.Listener) error {
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.isClosed() {
				return nil
			}
			// Out of file descriptors and the like: back off, keep serving.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Error("accept failed", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		switch s.track(conn) {
		case stopping:
			conn.Close()
			return nil
		case full:
			s.refuse(conn)
			continue
		}
		go func() {
			defer s.untrack(conn)
			s.handle(conn)
		}()
	}
}

// Close ends every session at once and waits for them. The caller closes
// the listener.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c, sess := range s.conns {
		c.Close()
		if sess != nil {
			sess.closeServer()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.stopLoops()
	return nil
}

// stopLoops ends the event loops once no session is left on them.
func (s *Server) stopLoops() {
	s.stopOnce.Do(func() { stopLoops(s.loops) })
}

// Shutdown drains: sessions that are idle (outside a transaction, nothing in
// flight) end now, the others as soon as they become idle, and whatever is
// left when ctx ends is closed. The caller closes the listener first.
// Clients are told why (SQLSTATE 57P01).
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.mu.Lock()
	for c, sess := range s.conns {
		switch {
		case sess == nil:
			c.Close() // still in startup
		case sess.idle.Load():
			sess.closeServer()
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.stopLoops() // draining admits no session: none will come
		return nil
	case <-ctx.Done():
		s.Close()
		return ctx.Err()
	}
}

// EventLoops is how many event loops relay the sessions: 0 when
// goroutines do (Config.GoroutineRelay, or off Linux).
func (s *Server) EventLoops() int { return len(s.loops) }

// LoopSessions returns how many sessions each event loop holds now.
func (s *Server) LoopSessions() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.loopSessions...)
}

// Sessions is the number of client sessions past startup.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// Connections is the number of client connections open: the sessions, and
// the connections still in startup or bringing a cancel request, which
// Config.MaxClientConns bounds together.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// tracking is what track did with a connection just accepted.
type tracking int

const (
	tracked  tracking = iota // counted until untrack: handle it
	full                     // MaxClientConns are open: refuse it
	stopping                 // the server closes or drains: stop accepting
)

// track counts a connection just accepted, from now to its untrack, if
// the limit allows: a connection takes a descriptor from accept on,
// whether it ever finishes startup or not (PgBouncer's max_client_conn
// counts its clients so too).
func (s *Server) track(c net.Conn) tracking {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed || s.draining.Load():
		return stopping
	case s.cfg.MaxClientConns > 0 && len(s.conns) >= s.cfg.MaxClientConns:
		return full
	}
	s.conns[c] = nil
	s.wg.Add(1)
	return tracked
}

// refuseWait bounds the write of a refusal: a new socket's send buffer
// takes it at once; this is for an embedder's listener whose connections
// block (or read, as a TLS one would for its handshake), which must not
// hold up the accept loop for long.
const refuseWait = 100 * time.Millisecond

// refuse turns away a connection over MaxClientConns at once, from the
// accept loop, with the FATAL 53300 a client over the limit gets: written
// before anything of the connection is read, as Postgres writes the error
// of a backend it cannot start, so that a flood of connections that send
// nothing costs a descriptor each for no longer than this. A client that
// opened with SSLRequest reads the 'E' as a refusal of TLS: libpq says
// "server sent an error response during SSL exchange", pgx that the server
// refused TLS.
func (s *Server) refuse(conn net.Conn) {
	addr := conn.RemoteAddr()
	conn.SetDeadline(time.Now().Add(refuseWait))
	writeError(conn, "FATAL", codeTooManyConnections, s.tooManyClients(), s.cfg.Hints.TooManyClients)
	conn.Close()
	s.refusals.log(s.log, slog.LevelWarn, "client refused: too many client connections", "client", addr.String(), "max_client_conns", s.cfg.MaxClientConns)
}

// tooManyClients is the message of a refusal over MaxClientConns.
func (s *Server) tooManyClients() string {
	return fmt.Sprintf("too many client connections: pgfence allows %d at once", s.cfg.MaxClientConns)
}

// admit registers a session past startup (its connection was counted
// against MaxClientConns when it was accepted).
func (s *Server) admit(c net.Conn, sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[c] = sess
	s.active++
	sess.c.loop = s.assignLoop()
}

// assignLoop picks the loop with the fewest sessions for a new one and
// counts it there (under mu); -1 when goroutines relay.
//
// The proxy hands sessions to loops itself rather than have the kernel
// spread them (a listener per loop with SO_REUSEPORT): the kernel spreads
// connections by a hash of their addresses, blind to how many each loop
// holds and to when they end, so a pool of 16 connections over 2 loops
// lands 4 or fewer on one loop about one time in 50, and a loop keeps
// the connections of a pool that reconnects while the other's pool went.
// Here a loop gets its next session by what it holds now, on every
// listener (TCP, Unix socket, an embedder's), which also leaves the
// startup of a session (TLS handshake, authentication) off the loops.
func (s *Server) assignLoop() int {
	n := len(s.loopSessions)
	if n == 0 {
		return -1
	}
	best := s.nextLoop % n
	for k := 1; k < n; k++ {
		if i := (s.nextLoop + k) % n; s.loopSessions[i] < s.loopSessions[best] {
			best = i
		}
	}
	s.nextLoop = best + 1
	s.loopSessions[best]++
	return best
}

func (s *Server) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	if sess := s.conns[c]; sess != nil {
		s.active--
		if l := sess.c.loop; l >= 0 {
			s.loopSessions[l]--
		}
	}
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Startup packet codes (protocol 3 section "Message Formats").
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
	maxStartupPacket  = 10000 // Postgres's own MAX_STARTUP_PACKET_LENGTH
)

// handle runs one client connection from startup to the end.
func (s *Server) handle(conn net.Conn) {
	id := s.nextID.Add(1)
	log := s.log.With("conn", id, "client", conn.RemoteAddr().String())
	cc := &clientConn{Conn: conn, r: bufio.NewReaderSize(conn, 32<<10), w: bufio.NewWriterSize(conn, 32<<10)}

	conn.SetDeadline(time.Now().Add(s.cfg.StartupTimeout))
	packet, startup, err := s.readStartup(cc)
	cw := cc.w // after readStartup: TLS may have replaced it
	if err != nil {
		if !isClosed(err) {
			code, hint := codeProtocolViolation, ""
			var ce *clientError
			if errors.As(err, &ce) {
				code, hint = ce.code, ce.hint
			}
			s.startups.log(log, slog.LevelInfo, "startup failed", "err", err)
			writeFatal(cw, code, err.Error(), hint)
			cw.Flush()
		}
		return
	}
	if startup == nil { // a cancel request, already handled
		return
	}
	settings := s.checkStartup(packet)
	if settings.internal != "" {
		s.startups.log(log, slog.LevelWarn, "client refused: its startup packet sets one of pgfence's own settings", "setting", settings.internal)
		writeFatal(cw, codeInsufficientPrivilege, "the setting "+settings.internal+" is pgfence's own: no client may set it through pgfence",
			"remove it from the connection's options and parameters")
		cw.Flush()
		return
	}
	packet = settings.packet
	c := &Client{ID: id, RemoteAddr: conn.RemoteAddr().String(), User: startup.Parameters["user"], Database: database(startup.Parameters),
		Replication: replication(startup.Parameters["replication"])}
	c.setApplicationName(startup.Parameters["application_name"])
	c.TLS = cc.tls
	sess := &session{srv: s, c: c, log: log, client: cc.Conn, cr: cc.r, fromServer: fromServer{cw: cc.w}, tag: sessionTag(id)}
	sess.via = sess
	sess.startParts(settings.tokens)
	c.answered, c.ended = sess.pipe.whenDrained, sess.pipe.ended
	s.admit(conn, sess)
	if s.cfg.Admit != nil {
		if err := s.cfg.Admit(c); err != nil {
			s.startups.log(log, slog.LevelWarn, "client refused", "database", c.Database, "user", truncateName(c.User), "err", err)
			writeError(cw, "FATAL", codeRejected, err.Error(), "")
			cw.Flush()
			return
		}
	}
	ic := s.cfg.Interceptor
	ic.SessionStart(c)

	up := s.up.Load()
	server, err := s.dialUpstream(up)
	if err != nil {
		s.upstreamFailed(err)
		log.Warn("cannot reach Postgres", "upstream", up.Addr, "err", err)
		writeFatal(cw, codeCannotConnect, fmt.Sprintf("cannot connect to Postgres at %s: %v", up.Addr, err), s.cfg.Hints.CannotConnect)
		cw.Flush()
		ic.SessionEnd(c, err)
		return
	}
	defer server.Close()
	if _, err := server.Write(packet); err != nil {
		writeFatal(cw, codeConnectionFailure, fmt.Sprintf("lost the connection to Postgres at %s during startup: %v", up.Addr, err), "")
		cw.Flush()
		ic.SessionEnd(c, err)
		return
	}
	conn.SetDeadline(time.Time{})

	s.mu.Lock()
	sess.upstream = up.Addr
	s.mu.Unlock()
	sess.setServer(server)
	err = sess.relay()
	if err != nil {
		log.Info("session ended", "err", err)
	}
	ic.SessionEnd(c, err)
}

// replication reports whether a startup packet's replication parameter
// makes the session a replication connection (physical: true, on, yes, 1;
// logical: database), which takes only the simple protocol.
func replication(v string) bool {
	switch strings.ToLower(v) {
	case "true", "on", "yes", "1", "database":
		return true
	}
	return false
}

// nameDataLen is Postgres's NAMEDATALEN: it cuts a startup packet's
// database name to one byte less.
const nameDataLen = 64

// database is the database a startup packet connects to, as Postgres
// picks it: the packet's database, else the user name, cut as Postgres
// cuts them; "" for a physical replication connection, which connects to
// no database. A logical one (replication=database) connects to its
// database.
func database(params map[string]string) string {
	switch strings.ToLower(params["replication"]) {
	case "true", "on", "yes", "1":
		return ""
	}
	name := params["database"]
	if name == "" {
		name = params["user"]
	}
	if len(name) >= nameDataLen {
		name = name[:nameDataLen-1]
	}
	return name
}

// clientConn is a client connection during startup, which TLS may upgrade.
type clientConn struct {
	net.Conn
	r   *bufio.Reader
	w   *bufio.Writer
	tls bool
}

// dialUpstream connects to Postgres, over TLS when configured.
func (s *Server) dialUpstream(up *Upstream) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, up.Network, up.Addr)
	if err != nil {
		return nil, dialFailure(err)
	}
	if up.TLS == nil {
		return conn, nil
	}
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	req := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), codeSSLRequest)
	var answer [1]byte
	if _, err := conn.Write(req); err != nil {
		conn.Close()
		return nil, dialFailure(err)
	}
	if _, err := io.ReadFull(conn, answer[:]); err != nil {
		conn.Close()
		return nil, dialFailure(err)
	}
	switch answer[0] {
	case encryptionAccepted:
		tc := tls.Client(tlsBase(conn), up.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, tlsFailure(fmt.Errorf("TLS handshake with Postgres: %w", err))
		}
		return tc, nil
	case encryptionRefused:
		if up.TLSRequired {
			conn.Close()
			return nil, tlsFailure(errors.New("the upstream URL's sslmode requires TLS, and Postgres does not accept TLS"))
		}
		return conn, nil
	}
	conn.Close()
	return nil, &upstreamError{UpstreamNetwork, fmt.Errorf("unexpected answer %q from Postgres to SSLRequest", answer[0])}
}

// readStartup reads startup packets until a StartupMessage, answering
// SSLRequest (with TLS when configured) and GSSENCRequest ("no"), and
// forwarding a CancelRequest. It returns the raw StartupMessage packet to
// forward, and its decoded form (nil after a CancelRequest). Under
// RequireClientTLS a StartupMessage in plain text is errTLSRequired.
func (s *Server) readStartup(cc *clientConn) ([]byte, *pgproto3.StartupMessage, error) {
	r, w := cc.r, cc.w
	for {
		var h [4]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return nil, nil, err
		}
		n := int(binary.BigEndian.Uint32(h[:]))
		if n < 8 || n > maxStartupPacket {
			return nil, nil, fmt.Errorf("%w: startup packet length %d is outside 8..%d", ErrMalformed, n, maxStartupPacket)
		}
		packet := make([]byte, n)
		copy(packet, h[:])
		if _, err := io.ReadFull(r, packet[4:]); err != nil {
			return nil, nil, err
		}
		code := binary.BigEndian.Uint32(packet[4:8])
		switch code {
		case codeSSLRequest:
			if s.cfg.TLS == nil || cc.tls {
				break // answered "N" below
			}
			if r.Buffered() > 0 {
				// Bytes sent before the handshake were not encrypted: taking
				// them as part of the session would let a man in the middle
				// inject them (CVE-2021-23214).
				return nil, nil, fmt.Errorf("%w: unencrypted data after SSLRequest", ErrMalformed)
			}
			if err := w.WriteByte(encryptionAccepted); err != nil {
				return nil, nil, err
			}
			if err := w.Flush(); err != nil {
				return nil, nil, err
			}
			tc := tls.Server(tlsBase(cc.Conn), s.cfg.TLS)
			if err := tc.Handshake(); err != nil {
				return nil, nil, fmt.Errorf("TLS handshake: %w", err)
			}
			cc.Conn, cc.tls = tc, true
			cc.r, cc.w = bufio.NewReaderSize(tc, 32<<10), bufio.NewWriterSize(tc, 32<<10)
			r, w = cc.r, cc.w
			continue
		}
		switch code {
		case codeSSLRequest, codeGSSENCRequest:
			// Encryption is not offered: the client may go on in plain text
			// or give up, as it chooses.
			if err := w.WriteByte(encryptionRefused); err != nil {
				return nil, nil, err
			}
			if err := w.Flush(); err != nil {
				return nil, nil, err
			}
			continue
		case codeCancelRequest:
			s.forwardCancel(packet)
			return nil, nil, nil
		}
		if s.cfg.RequireClientTLS && !cc.tls && !onUnixSocket(cc.Conn) {
			return nil, nil, errTLSRequired
		}
		if major := code >> 16; major != 3 {
			return nil, nil, fmt.Errorf("unsupported frontend protocol %d.%d: pgfence speaks protocol 3", major, code&0xffff)
		}
		var m pgproto3.StartupMessage
		if code == pgproto3.ProtocolVersion30 || code == pgproto3.ProtocolVersion32 {
			if err := m.Decode(packet[4:]); err != nil {
				return nil, nil, fmt.Errorf("%w: startup message: %v", ErrMalformed, err)
			}
		} else {
			// A newer 3.x minor: Postgres negotiates it down itself.
			m.Parameters = map[string]string{}
		}
		return packet, &m, nil
	}
}

// errTLSRequired refuses a startup in plain text under RequireClientTLS.
var errTLSRequired = &clientError{
	err:  errors.New("this connection is not encrypted, and pgfence requires TLS of its clients"),
	code: codeInvalidAuthorization,
	hint: "connect with sslmode=require (or verify-ca or verify-full)",
}

// onUnixSocket reports whether c came over a Unix socket, where drivers
// never ask for TLS.
func onUnixSocket(c net.Conn) bool {
	return c.LocalAddr() != nil && c.LocalAddr().Network() == "unix"
}

// forwardCancel relays a CancelRequest to Postgres as is: sessions are
// one-to-one, so the backend key the client holds is the server's own.
func (s *Server) forwardCancel(packet []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	up := s.up.Load()
	c, err := d.DialContext(ctx, up.Network, up.Addr)
	if err != nil {
		s.log.Warn("cannot forward cancel request", "err", err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(s.cfg.DialTimeout))
	c.Write(packet)
	// Postgres closes the connection once it has read the request; waiting
	// for that keeps the cancel ahead of whatever the client sends next.
	io.Copy(io.Discard, c)
}

// CheckUpstream reports whether Postgres accepts connections at Upstream.
func (s *Server) CheckUpstream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	up := s.up.Load()
	c, err := d.DialContext(ctx, up.Network, up.Addr)
	if err != nil {
		return err
	}
	return c.Close()
}
