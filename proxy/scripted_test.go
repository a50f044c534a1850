package proxy_test

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	ps "github.com/pgfence/pgfence/internal/pgscript"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// The scripted tests play message sequences between a client and a
// scripted Postgres (internal/pgscript) through a proxy whose Interceptor
// gives scripted Plans: each checks, message by message, what the proxy
// sends Postgres for what the client sent, and what it relays back. They
// need no Postgres and run in make unit as in make test; the suites
// against a real Postgres (here and in fence) stay the proof that what is
// scripted here is what Postgres does.

// scriptIC is the Interceptor of a scripted sequence: plans by text, and a
// record of what it was asked.
type scriptIC struct {
	proxy.NopInterceptor
	mu sync.Mutex
	// query and parse are the Plans for a Query's or a Parse's text, and
	// batch for a Query's sent InExtendedBatch; a text not in them gets
	// Plan{}.
	query, parse, batch map[string]proxy.Plan
	// holds are the texts after which the next Query or Parse is held
	// (Client.HoldNextStatement), with the start each asks for (nil for
	// none); reading are the texts that depend on how the server reads
	// SQL (DependsOnReading), and readingProbe the probe that learns it.
	holds        map[string]func() <-chan struct{}
	reading      map[string]bool
	readingProbe *proxy.Probe
	// noteReading has Query and Parse note how the server reads SQL.
	noteReading bool
	// replace are replacements for the server's errors, by SQLSTATE.
	replace map[string]*pgproto3.ErrorResponse
	// hide are the messages of notices kept from the client.
	hide map[string]bool
	gen  atomic.Uint64
	// calls are what the proxy asked and told, in order (but Generation
	// and the session's start and end).
	calls []string
	ended chan error
}

func newScriptIC() *scriptIC {
	return &scriptIC{query: map[string]proxy.Plan{}, parse: map[string]proxy.Plan{}, batch: map[string]proxy.Plan{}, replace: map[string]*pgproto3.ErrorResponse{},
		hide: map[string]bool{}, ended: make(chan error, 4), holds: map[string]func() <-chan struct{}{}, reading: map[string]bool{}}
}

func (ic *scriptIC) note(format string, args ...any) {
	ic.mu.Lock()
	ic.calls = append(ic.calls, fmt.Sprintf(format, args...))
	ic.mu.Unlock()
}

// takeCalls returns the calls noted so far and forgets them.
func (ic *scriptIC) takeCalls() []string {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	calls := ic.calls
	ic.calls = nil
	return calls
}

func (ic *scriptIC) SessionEnd(_ *proxy.Client, err error) { ic.ended <- err }

// hold asks for the hold ic.holds gives sql, if any; ic.mu is held.
func (ic *scriptIC) hold(c *proxy.Client, sql string) {
	if start, ok := ic.holds[sql]; ok {
		c.HoldNextStatement(start)
	}
}

func (ic *scriptIC) Query(c *proxy.Client, sql string) proxy.Plan {
	ic.mu.Lock()
	ic.hold(c, sql)
	ic.mu.Unlock()
	if c.InExtendedBatch() {
		ic.note("Query (in a batch): %s%s", sql, ic.readingOf(c))
		ic.mu.Lock()
		defer ic.mu.Unlock()
		return ic.batch[sql]
	}
	ic.note("Query: %s%s", sql, ic.readingOf(c))
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.query[sql]
}

// readingOf says how c's server reads SQL, for a sequence that notes it
// (noteReading).
func (ic *scriptIC) readingOf(c *proxy.Client) string {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if !ic.noteReading {
		return ""
	}
	scs := "on"
	if !c.StandardConformingStrings() {
		scs = "off"
	}
	return fmt.Sprintf(" (standard_conforming_strings %s, %s)", scs, c.ClientEncoding())
}

func (ic *scriptIC) Parse(c *proxy.Client, sql string) proxy.Plan {
	ic.note("Parse: %s%s", sql, ic.readingOf(c))
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ic.hold(c, sql)
	return ic.parse[sql]
}

func (ic *scriptIC) DependsOnReading(c *proxy.Client, sql string) bool {
	ic.mu.Lock()
	depends := ic.reading[sql]
	ic.mu.Unlock()
	if depends {
		ic.note("DependsOnReading: %s", sql)
	}
	return depends
}

func (ic *scriptIC) ReadingProbe() *proxy.Probe {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.readingProbe
}

func (ic *scriptIC) Error(_ *proxy.Client, e *pgproto3.ErrorResponse) *pgproto3.ErrorResponse {
	ic.note("Error: %s %s", e.Code, e.Message)
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.replace[e.Code]
}

func (ic *scriptIC) Notice(_ *proxy.Client, n *pgproto3.NoticeResponse) bool {
	ic.note("Notice: %s", n.Message)
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return !ic.hide[n.Message]
}

func (ic *scriptIC) SettingAnswered(_ *proxy.Client, set *proxy.Setting) {
	local := ""
	if set.Local {
		local = " (local)"
	}
	ic.note("SettingAnswered: %s = %s%s", set.Name, set.Value, local)
}

func (ic *scriptIC) Generation() uint64 { return ic.gen.Load() }

// probe returns a probe running sql whose rows are noted as calls, and
// answered with the notice notice returns for them (notice may be nil).
func (ic *scriptIC) probe(sql string, notice func(row []string) *pgproto3.NoticeResponse) *proxy.Probe {
	return proxy.NewProbe(sql, func(_ *proxy.Client, row [][]byte) *pgproto3.NoticeResponse {
		vals := make([]string, len(row))
		for i, v := range row {
			if v == nil {
				vals[i] = "NULL"
			} else {
				vals[i] = string(v)
			}
		}
		ic.note("probe %s: %s", sql, strings.Join(vals, ", "))
		if notice == nil {
			return nil
		}
		return notice(vals)
	})
}

// setPlan plans a Query or Parse text as the SET of name to value that
// the proxy may answer itself.
func setPlan(name, value string, local bool) proxy.Plan {
	return proxy.Plan{Setting: &proxy.Setting{Name: name, Value: value, Local: local}}
}

// scriptEnv is what a sequence's script is played with.
type scriptEnv struct {
	ic   *scriptIC
	pg   *ps.Server
	addr string // the proxy's
	// c and b are the sequence's client and its server connection.
	c *ps.Client
	b *ps.Backend
}

// scriptRelay is how the proxy relays a sequence's sessions.
type scriptRelay uint8

const (
	onLoop scriptRelay = 1 << iota
	onGoroutines
	onBoth = onLoop | onGoroutines
)

// sequence is one scripted case.
type sequence struct {
	name string
	// relays it runs on: both unless it says (an answered SET is the event
	// loop's alone).
	relays scriptRelay
	config func(*proxy.Config)
	// script sets the Interceptor's plans and returns the steps to play on
	// the session's client and server connection, after startup.
	script func(x *scriptEnv) []ps.Step
	// calls are what the Interceptor must have been asked and told, in
	// order.
	calls []string
	// ends says the session ends within the script; otherwise the client
	// terminates it after, and the proxy must pass that on and close both
	// connections.
	ends bool
}

// playSequences runs each sequence on the event loop and on the goroutine
// relay (as each says).
func playSequences(t *testing.T, seqs []sequence) {
	t.Helper()
	for _, sq := range seqs {
		t.Run(sq.name, func(t *testing.T) {
			relays := sq.relays
			if relays == 0 {
				relays = onBoth
			}
			if relays&onLoop != 0 {
				t.Run("loop", func(t *testing.T) {
					if runtime.GOOS != "linux" {
						t.Skip("the event loop is Linux-only")
					}
					playSequence(t, sq, false)
				})
			}
			if relays&onGoroutines != 0 {
				t.Run("goroutines", func(t *testing.T) { playSequence(t, sq, true) })
			}
		})
	}
}

// sessionTag is what a session's statement names carry: the process's
// tag, then the session's number (the first of its Server: 1).
var sessionTag = regexp.MustCompile(`^[0-9a-f]{6}\.1$`)

// probeTag is what a probe's statement name carries: the process's tag,
// then the probe's number.
var probeTag = regexp.MustCompile(`^[0-9a-f]{6}\.[0-9]+$`)

func playSequence(t *testing.T, sq sequence, goroutines bool) {
	ic := newScriptIC()
	pg := ps.Listen(t)
	logs := &pgtest.LogBuffer{}
	cfg := proxy.Config{Upstream: pg.Addr(), Interceptor: ic, GoroutineRelay: goroutines, SettingSQL: setSQL, StandInSQL: standInSQL,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if sq.config != nil {
		sq.config(&cfg)
	}
	srv, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if l := logs.String(); t.Failed() && l != "" {
			t.Logf("the proxy's log:\n%s", l)
		}
	})

	x := &scriptEnv{ic: ic, pg: pg, addr: ln.Addr().String()}
	x.c, x.b = ps.Connect(t, pg, x.addr)
	// The script sets the plans under the Interceptor's lock: the race
	// detector cannot see that the proxy reads them only after the client
	// sent what they are for.
	ic.mu.Lock()
	steps := sq.script(x)
	ic.mu.Unlock()
	ps.Play(t, x.c, x.b, steps...)
	if !sq.ends {
		ps.Play(t, x.c, x.b,
			ps.ClientSends(&pgproto3.Terminate{}),
			ps.BackendGets(&pgproto3.Terminate{}),
			ps.BackendClosed(),
			ps.ClientClosed())
		if err := sessionEnd(t, ic); err != nil {
			t.Errorf("the session ended with %v, want a clean end", err)
		}
	}
	if got := ic.takeCalls(); strings.Join(got, "\n") != strings.Join(sq.calls, "\n") {
		t.Errorf("the Interceptor was called:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(sq.calls, "\n  "))
	}
	if tag, ok := x.b.Vars["tag"]; ok && !sessionTag.MatchString(tag) {
		t.Errorf("the session's statement names carry %q, want the process's tag and the session's number, 1", tag)
	}
	if p, ok := x.b.Vars["probe"]; ok && !probeTag.MatchString(p) {
		t.Errorf("a probe's statement name carries %q, want the process's tag and the probe's number", p)
	}
}

// sessionEnd waits for the Interceptor to be told the session ended, and
// returns the error it was told.
func sessionEnd(t testing.TB, ic *scriptIC) error {
	t.Helper()
	select {
	case err := <-ic.ended:
		return err
	case <-time.After(ps.Timeout):
		t.Fatal("the Interceptor was not told the session ended")
		return nil
	}
}

// paramTypes is the parameter-type section of a Parse (Plan.ParamTypes).
func paramTypes(oids ...uint32) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(oids)))
	for _, o := range oids {
		b = binary.BigEndian.AppendUint32(b, o)
	}
	return b
}

// The proxy's own statements, as the scripts expect them: {tag} is the
// session's tag, {probe} a probe's number (see Statement names in the
// package documentation).
const (
	reused1   = "pgfence.s.{tag}.1" // the first statement prepared for reuse
	reused2   = "pgfence.s.{tag}.2"
	reused3   = "pgfence.s.{tag}.3"
	setStmt   = "pgfence.set.{tag}"
	setPortal = "pgfence.set"
	// setSQL is Config.SettingSQL, which the Interceptor's package
	// provides: fence's is sqlrewrite.SettingSQL; the comment shows the
	// proxy runs what it is given.
	setSQL    = "SELECT pg_catalog.set_config($1, $2, $3), pg_catalog.pg_backend_pid() -- scripted"
	probeName = "pgfence.probe.{probe}"
	// standInSQL is Config.StandInSQL, which the Interceptor's package
	// provides too: fence's is sqlrewrite.StandInSQL; the comment shows
	// the proxy sends the stand-in it is given.
	standInSQL = `EXECUTE "pgfence: Parse the unnamed statement again" -- scripted`
	// backendPID is what the scripted backend says pg_backend_pid() is.
	backendPID = "4201"
)

// standIn is the Parse the proxy answers a reused Parse with.
var standIn = ps.Parse(standInSQL)

// setPrepare is the Close and Parse that prepare the proxy's set_config
// statement; setPrepared their replies.
var (
	setPrepare  = []pgproto3.FrontendMessage{ps.CloseStatement(setStmt), ps.ParseNamed(setStmt, setSQL, 25, 25, 16, 16)}
	setPrepared = []pgproto3.BackendMessage{ps.CloseComplete, ps.ParseComplete}
)

// setRun is what sets name to value on the server (a deferred setting),
// without the quiet mark (see Quiet).
func setRun(name, value string, local bool) []pgproto3.FrontendMessage {
	return setRunMarked(name, value, local, false)
}

// setRunMarked is setRun with the quiet mark quiet.
func setRunMarked(name, value string, local, quiet bool) []pgproto3.FrontendMessage {
	return []pgproto3.FrontendMessage{
		&pgproto3.Bind{DestinationPortal: setPortal, PreparedStatement: setStmt, Parameters: ps.Params(name, value, fmt.Sprint(local), fmt.Sprint(quiet))},
		ps.Execute(setPortal),
		ps.ClosePortal(setPortal),
	}
}

// setRan are Postgres's replies to setRun.
func setRan(value string) []pgproto3.BackendMessage {
	return []pgproto3.BackendMessage{ps.BindComplete, ps.Row(value, backendPID), ps.Complete("SELECT 1"), ps.CloseComplete}
}

// probePrepare and probeRun are what the proxy sends for a probe of sql:
// to prepare its statement, and to run it.
func probePrepare(sql string) []pgproto3.FrontendMessage {
	return []pgproto3.FrontendMessage{ps.CloseStatement(probeName), ps.ParseNamed(probeName, sql)}
}

var (
	probeRun = []pgproto3.FrontendMessage{
		&pgproto3.Bind{DestinationPortal: probeName, PreparedStatement: probeName},
		ps.Execute(probeName),
		ps.ClosePortal(probeName),
	}
	probePrepared = []pgproto3.BackendMessage{ps.CloseComplete, ps.ParseComplete}
)

// probeRan are Postgres's replies to probeRun, the probe's row vals.
func probeRan(vals ...string) []pgproto3.BackendMessage {
	return []pgproto3.BackendMessage{ps.BindComplete, ps.Row(vals...), ps.Complete("SELECT 1"), ps.CloseComplete}
}

// selectOne is Postgres's answer to a Query of SELECT 1.
var selectOne = []pgproto3.BackendMessage{ps.Columns("?column?"), ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)}
