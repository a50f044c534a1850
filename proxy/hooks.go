package proxy

import (
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Interceptor is where the proxy hands over everything that is not plain
// byte forwarding. The proxy knows the wire protocol; the Interceptor knows
// SQL. Its methods are called from a session's two relay goroutines at once,
// so implementations must be safe for concurrent use.
type Interceptor interface {
	// SessionStart is called once a client's startup packet has been read.
	SessionStart(c *Client)
	// SessionEnd is called when the session is over; err is nil for a clean
	// Terminate or disconnect.
	SessionEnd(c *Client, err error)
	// Query sees the text of a simple-protocol Query message. sql shares
	// the proxy's read buffer, so that a Query costs no copy: it is valid
	// only until Query returns, and must be copied (strings.Clone) to be
	// kept.
	Query(c *Client, sql string) Plan
	// Parse sees the text of an extended-protocol Parse message; like
	// Query's, sql must be copied to be kept.
	Parse(c *Client, sql string) Plan
	// Error sees every ErrorResponse from the server and may return a
	// replacement; nil keeps the original bytes.
	Error(c *Client, e *pgproto3.ErrorResponse) *pgproto3.ErrorResponse
	// Notice sees every NoticeResponse from the server (rare: decoding
	// them costs nothing on the common path) and reports whether the
	// client gets it.
	Notice(c *Client, n *pgproto3.NoticeResponse) bool
	// SettingAnswered is told of each SET the proxy answered itself for a
	// Plan.Setting, deferring set to the server (see
	// Config.ForwardSettings); set is the Plan's own.
	SettingAnswered(c *Client, set *Setting)
	// Generation changes whenever the Interceptor's configuration does;
	// a prepared statement planned under an older one is planned again
	// (and re-prepared if its plan changed) before its next Bind.
	Generation() uint64
	// DependsOnReading sees the text of a Query or Parse that the client
	// sent before the server reported how it reads SQL after what the
	// client sent earlier (see Reading holds in the package
	// documentation), and reports whether what Query or Parse would make
	// of it may depend on that: on standard_conforming_strings or
	// client_encoding. The proxy then holds the text until it knows them,
	// and only then hands it to Query or Parse. Like Query's, sql must be
	// copied to be kept.
	DependsOnReading(c *Client, sql string) bool
	// ReadingProbe returns the probe (see NewReadingProbe) the proxy runs
	// to learn those settings in the middle of an extended-protocol batch,
	// where Postgres reports none; nil if the Interceptor needs none.
	ReadingProbe() *Probe
}

// Plan says what to send in place of a Query or Parse text.
type Plan struct {
	// SQL replaces the client's text; "" forwards the original bytes.
	SQL string
	// Forget says the text may deallocate prepared statements (DEALLOCATE,
	// DISCARD) or change what the names in them stand for (search_path):
	// the proxy prepares its own statements again before their next use,
	// and once more when the change may have been undone: after the
	// ReadyForQuery that ends the text's unit of work, or, if that finds a
	// transaction block open, the one that finds it ended.
	Forget bool
	// Reuse, for a Parse of the unnamed statement with SQL set, lets the
	// proxy prepare SQL once per session as a statement of its own and bind
	// that for every later Parse of the same text, so Postgres parses and
	// plans it once rather than every time. Set it only for SQL that
	// returns no rows (a server-side plan cache could otherwise fail the
	// statement after a column change), as a named statement's plan may be
	// cached where an unnamed one's is not.
	Reuse bool
	// ParamTypes, for a Query, says that SQL is one statement returning no
	// rows, with parameters $1...$n of these types (the parameter-type
	// section of a Parse message), to run in the extended protocol bound to
	// the text values Params: the session prepares SQL once under a name of
	// its own, as for Reuse, so Postgres parses and plans it once rather
	// than for every Query. The client sees the replies a Query would get.
	// Probes[0] (if any) runs right after the Execute, as for a Parse.
	// Not for a Query sent while the Client is InExtendedBatch.
	ParamTypes []byte
	// Params are the values bound for ParamTypes. Like the Query text, they
	// may share the proxy's read buffer.
	Params []string
	// Origin, for a Plan with SQL set, maps the position of an error in SQL
	// to the client's text; nil leaves positions as Postgres reports them.
	Origin Origin
	// Probes, for a Query, are statements of SQL whose results the proxy
	// keeps from the client and hands to the Probe instead, by index among
	// the statements of SQL. For a Parse, Probes[0] (if any) is run by the
	// proxy right after each Execute of a portal bound to that statement, in
	// the same transaction.
	Probes []ProbeAt
	// Setting, for a text that is exactly one SET of a session setting to
	// a constant, names the setting and the value Postgres would store:
	// the proxy may answer the text itself and set the value later, ahead
	// of the client's next statement (see Config.ForwardSettings). Set it
	// only for a setting whose SET can fail for no reason of its own (a
	// placeholder setting, such as the fencing token), and only with SQL
	// "" and no Probes.
	Setting *Setting
	// NeedsToken says that, under Config.TransactionPooling, the text may
	// need the session's token settings in its transaction: it may write,
	// or it reads or sets a token setting itself. The proxy then sets them
	// ahead of it (see txpooling.go). Ignored otherwise.
	NeedsToken bool
	// TxStarts, for a Query with NeedsToken, are the statements of SQL
	// (or of the client's text, if SQL is "") that start a transaction of
	// their own, in order: the proxy sets the token settings again ahead
	// of each.
	TxStarts []TxStart
}

// TxStart is a statement of a Query's SQL that starts a transaction of its
// own (see Plan.TxStarts).
type TxStart struct {
	Offset int // where it starts in the SQL, in bytes
	Index  int // its index among the SQL's statements
}

// Setting is a session setting and its value, as set_config takes them.
type Setting struct {
	Name, Value string
	// Local is set for SET LOCAL: the value lasts until the transaction
	// ends, so the proxy answers it only inside a transaction block.
	Local bool
	// Reset is set for a RESET of the setting (Value ""), which only a
	// session under Config.TransactionPooling answers.
	Reset bool
}

// Origin maps where Postgres says an error is in a Plan's SQL to the same
// place in the client's text, so that the client's error cursor points
// into what it sent. params are the Params the SQL was bound to (nil for a
// Plan without ParamTypes).
type Origin interface {
	// Position maps pos, an error's position in SQL as Postgres reports it
	// (1-based, in characters). It returns 0 for a position in text the
	// Interceptor added: the proxy then leaves the position out.
	Position(c *Client, pos int, params []string) int
	// Param returns the position in the client's text of what Params[n-1]
	// stands for, for an error Postgres raised reading that value (which
	// it reports with no position, as a parameter's); 0 for none.
	Param(c *Client, n int, params []string) int
}

// probe is a Parse plan's probe, if any.
func (p Plan) probe() *Probe {
	if len(p.Probes) > 0 {
		return p.Probes[0].Probe
	}
	return nil
}

// ProbeAt places a probe at a statement index of a simple Query.
type ProbeAt struct {
	Index int
	Probe *Probe
}

// Probe is a statement the proxy runs on the client's session to learn
// something (such as whether a fenced write was rejected) without the client
// seeing it.
type Probe struct {
	sql     string
	prepare []byte // Close and Parse of the probe's statement, pre-encoded
	run     []byte // Bind, Execute and Close of its portal, pre-encoded
	bindLen int    // run's Bind
	// closeStmt closes the statement, under transaction pooling.
	closeStmt []byte
	done      ProbeFunc
	// quiet, if set, lets the proxy leave the probe out (see Quiet).
	quiet *Quiet
}

// Quiet lets the proxy leave a probe out after an Execute whose write
// tells all the probe would: the write raises a notice for each stale row
// it leaves alone, and the token it runs with is the one the proxy's
// deferred settings (see Config.ForwardSettings) set right ahead of it, in
// the same transaction. That holds for the Execute of a unit of one
// fenced write (Bind, Execute, Sync) that the proxy sends joined to the
// deferred settings while the session is idle: the transaction is the
// unit's own, so a flag the write raised goes with it, and no statement of
// the client's runs between the settings and the write. The proxy then
// watches the write's replies in place of the probe's.
type Quiet struct {
	// Known reports whether set, the settings set ahead of the write,
	// tell the token it runs with.
	Known func(c *Client, set []Setting) bool
	// Notice sees each notice the watched write raises, and reports
	// whether it is the write's own account of a stale row: it is then
	// kept from the client, and note is what Done gets of it.
	Notice func(c *Client, n *pgproto3.NoticeResponse) (note string, ok bool)
	// Done is told the write completed (CommandComplete, or
	// PortalSuspended), with set and the notes of its notices, as the
	// probe's ProbeFunc would be told its row. A non-nil notice is sent
	// to the client ahead of the write's completion.
	Done func(c *Client, set []Setting, notes []string) *pgproto3.NoticeResponse
}

// SetQuiet lets the proxy leave p out where q says it may. Call it before
// p is first used.
func (p *Probe) SetQuiet(q *Quiet) { p.quiet = q }

// ProbeFunc receives a probe's row: its text values, nil for NULL, valid
// only during the call (the session reuses their buffers). A non-nil notice
// is sent to the client right after the probed statement's results.
type ProbeFunc func(c *Client, row [][]byte) (notice *pgproto3.NoticeResponse)

// probeIDs numbers probes, so each has a statement name of its own.
var probeIDs atomic.Uint64

// NewProbe returns a probe running sql (a single-row SELECT without
// parameters); done receives the row's text values (nil for NULL).
//
// In the extended protocol a session prepares the probe's statement once
// and then only binds and executes it, so a fenced write costs Postgres no
// extra parse.
func NewProbe(sql string, done ProbeFunc) *Probe {
	name := fmt.Sprintf("pgfence.probe.%s.%d", instanceTag, probeIDs.Add(1))
	var prep, run []byte
	// Close first: re-preparing after the client may have deallocated it
	// must not fail on a statement that still exists.
	prep, _ = (&pgproto3.Close{ObjectType: byte(targetStatement), Name: name}).Encode(prep)
	prep, _ = (&pgproto3.Parse{Name: name, Query: sql}).Encode(prep)
	run, _ = (&pgproto3.Bind{DestinationPortal: name, PreparedStatement: name}).Encode(run)
	bindLen := len(run)
	run, _ = (&pgproto3.Execute{Portal: name}).Encode(run)
	run, _ = (&pgproto3.Close{ObjectType: byte(targetPortal), Name: name}).Encode(run)
	closeStmt, _ := (&pgproto3.Close{ObjectType: byte(targetStatement), Name: name}).Encode(nil)
	return &Probe{sql: sql, prepare: prep, run: run, bindLen: bindLen, closeStmt: closeStmt, done: done}
}

// NewReadingProbe returns a probe running sql, which must select the
// session's standard_conforming_strings and client_encoding, in that
// order, as one row (see Interceptor.ReadingProbe). The session reads SQL
// text with what it returns until the next ReadyForQuery, from which on
// it goes by what the server reported again: Postgres reports every
// setting that changed right before ReadyForQuery, and a change the probe
// saw may have been rolled back since.
func NewReadingProbe(sql string) *Probe {
	return NewProbe(sql, func(c *Client, row [][]byte) *pgproto3.NoticeResponse {
		if len(row) == 2 && row[0] != nil && row[1] != nil {
			c.probedReading(string(row[0]) == "on", string(row[1]))
		}
		return nil
	})
}

// Replies to an injected probe: BindComplete, DataRow, CommandComplete and
// CloseComplete, plus CloseComplete and ParseComplete when it prepares.
const (
	probeRunReplies     = 4
	probePrepareReplies = 2
)

// Client describes one client session, for logs and metrics.
type Client struct {
	// Local is the Interceptor's own per-session state: set it in
	// SessionStart. The proxy never touches it.
	Local any

	ID         uint64
	RemoteAddr string
	User       string
	// Database is the database the session connects to: the startup
	// packet's, or the user name when it names none, as Postgres does; ""
	// for a physical replication connection (Replication set), which
	// connects to none, and for a startup packet of a protocol version
	// whose parameters the proxy does not read (Replication not set).
	Database string
	TLS      bool // the client connected to pgfence over TLS
	// Replication is set for a replication connection (the startup
	// packet's replication parameter): Postgres takes only simple-protocol
	// Queries there, so the proxy answers no SET and sends nothing in the
	// extended protocol (a Plan with ParamTypes runs as its text).
	Replication bool
	// loop is the index of the event loop that relays the session, -1
	// when goroutines do (see Loop).
	loop    int
	appName atomic.Pointer[string]
	// How the session's server reads SQL text: what it reported last, or
	// what a reading probe found since the last ReadyForQuery.
	nonStandardStrings atomic.Bool            // standard_conforming_strings = off
	encoding           atomic.Pointer[string] // client_encoding, if not UTF8
	serverEncoding     atomic.Pointer[string] // server_encoding, if not UTF8
	// reported are the two settings as the server reported them, and
	// probed says a reading probe has set the fields above since the last
	// ReadyForQuery, which sets them back to reported (see
	// NewReadingProbe); owned by the server side.
	reported struct {
		nonStandardStrings bool
		encoding           *string
	}
	probed bool
	// midBatch is set from an extended-protocol message to the next Sync
	// (owned by the session's client side, which calls the Interceptor).
	midBatch bool
	// held says the session's next Query or Parse waits, and holdStarts
	// what for besides the server's answers (see HoldNextStatement); owned
	// by the client side too, as are the fields below up to answered.
	held       bool
	holdStarts []func() <-chan struct{}
	// afterSync are the holdStarts of a hold taken in the middle of an
	// extended-protocol batch, which the batch's Sync moves to holdAgain:
	// the first Query or Parse after it waits for them again (see
	// Statement holds in the package documentation), once.
	afterSync, holdAgain []func() <-chan struct{}
	// settled is set once the client's next Query or Parse has waited
	// for its hold, until it reaches the Interceptor: it waits no more.
	// probeLater is set while it waits to learn whether the transaction
	// block has failed before a reading probe (see session.holdFor).
	settled, probeLater bool
	// answered returns a channel closed once the server has answered what
	// the client sent so far (the session's pipeline drained), or the
	// session ended.
	answered func() <-chan struct{}
	// ended reports whether the session has ended.
	ended func() bool
	// lastReady is the transaction status of the server's last
	// ReadyForQuery (0 before the first), written by the server side.
	lastReady atomic.Uint32
}

// InTransactionBlock reports whether the server's last ReadyForQuery said
// the session is in a transaction block (failed or not). Once the server
// has answered all the client sent (as when a hold's start function runs,
// see HoldNextStatement), that is where the next statement will run.
func (c *Client) InTransactionBlock() bool {
	st := txStatus(c.lastReady.Load())
	return st == txInBlock || st == txFailed
}

// Loop is the index of the event loop that relays the session, from 0 to
// the Server's EventLoops()-1, fixed before the Interceptor's
// SessionStart; -1 when goroutines relay it. While the session is
// relayed, the Interceptor is called for it (Query, Parse, Error, a
// probe's ProbeFunc...) from its loop's goroutine only, so what an
// Interceptor keeps per loop is written by one thread at a time and
// shares no cache line with the other loops'.
func (c *Client) Loop() int { return c.loop }

// HoldNextStatement has the session's next Query or Parse wait, before it
// reaches the Interceptor, until the server has answered everything the
// client sent before it (and the proxy knows the settings it reads SQL
// with, see StandardConformingStrings), and then, if start is not nil,
// until the channel start returns (called then) is closed. Only the
// client's side of the session waits: the server's replies go on. A
// client that waits for each reply before it sends on never waits for the
// first part. Holds asked for by one text add up. Call it from Query or
// Parse. In the middle of an extended-protocol batch the proxy asks the
// server for its answers, and start is called again once the batch has
// ended (see Statement holds in the package documentation).
//
// It is for a text after which pgfence does not know what the next one
// means until something has happened: the server's reply to it says the
// session's new client_encoding, or a catalog read started after the
// server ran its DDL finds the tables it made.
func (c *Client) HoldNextStatement(start func() <-chan struct{}) {
	c.held = true
	if start != nil {
		c.holdStarts = append(c.holdStarts, start)
	}
}

// takeHold returns the channel the next Query or Parse must wait for, or
// nil when there is nothing to wait for, and takes the hold (if any) that
// HoldNextStatement asked for.
func (c *Client) takeHold() <-chan struct{} {
	starts := append(c.holdAgain, c.holdStarts...)
	c.held, c.holdStarts, c.holdAgain = false, nil, nil
	var answered <-chan struct{} = closedChan
	if c.answered != nil {
		answered = c.answered()
	}
	if len(starts) == 0 {
		select {
		case <-answered:
			return nil
		default:
			return answered
		}
	}
	done := make(chan struct{})
	go func() {
		<-answered
		if c.ended != nil && c.ended() {
			close(done) // nobody to hold: start nothing for it
			return
		}
		for _, start := range starts {
			<-start()
		}
		close(done)
	}()
	return done
}

// InExtendedBatch reports whether the client has sent extended-protocol
// messages since its last Sync. A Query then runs inside that batch: a
// plan for it with ParamTypes would end the batch at the proxy's Sync.
func (c *Client) InExtendedBatch() bool { return c.midBatch }

// SimpleOnly reports whether a Query's plan must not use the extended
// protocol (ParamTypes): the client is InExtendedBatch, or its session is a
// replication connection.
func (c *Client) SimpleOnly() bool { return c.midBatch || c.Replication }

// StandardConformingStrings reports whether backslashes in '...' literals
// are plain characters in this session, as the parser assumes.
func (c *Client) StandardConformingStrings() bool { return !c.nonStandardStrings.Load() }

// ClientEncoding is the session's client_encoding ("UTF8" until the server
// says otherwise).
func (c *Client) ClientEncoding() string {
	if p := c.encoding.Load(); p != nil {
		return *p
	}
	return "UTF8"
}

// serverParam records a ParameterStatus the session cares about.
func (c *Client) serverParam(name, value string) {
	switch name {
	case "application_name":
		c.setApplicationName(value)
	case "standard_conforming_strings":
		c.reported.nonStandardStrings = value != "on"
		c.nonStandardStrings.Store(value != "on")
	case "client_encoding":
		c.reported.encoding = storeEncoding(&c.encoding, value)
	case "server_encoding":
		storeEncoding(&c.serverEncoding, value)
	}
}

// probedReading records what a reading probe found (see
// NewReadingProbe), until the next ReadyForQuery (see readyForQuery).
func (c *Client) probedReading(standard bool, encoding string) {
	c.probed = true
	c.nonStandardStrings.Store(!standard)
	storeEncoding(&c.encoding, encoding)
}

// readyForQuery notes a ReadyForQuery: the server has reported every
// setting that changed, so what it reported is what it reads SQL with.
func (c *Client) readyForQuery() {
	if c.probed {
		c.probed = false
		c.nonStandardStrings.Store(c.reported.nonStandardStrings)
		c.encoding.Store(c.reported.encoding)
	}
}

// storeEncoding stores value in p, nil for UTF8, and returns what it
// stored.
func storeEncoding(p *atomic.Pointer[string], value string) *string {
	var v *string
	if value != "UTF8" {
		v = &value
	}
	p.Store(v)
	return v
}

// ServerEncoding is the database's server_encoding ("UTF8" until the server
// says otherwise). Error positions count its characters: bytes for
// SQL_ASCII.
func (c *Client) ServerEncoding() string {
	if p := c.serverEncoding.Load(); p != nil {
		return *p
	}
	return "UTF8"
}

// ApplicationName is the session's current application_name, as the server
// last reported it.
func (c *Client) ApplicationName() string {
	if p := c.appName.Load(); p != nil {
		return *p
	}
	return ""
}

func (c *Client) setApplicationName(s string) { c.appName.Store(&s) }
