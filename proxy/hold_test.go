package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	ps "github.com/pgfence/pgfence/internal/pgscript"
	"github.com/pgfence/pgfence/proxy"
)

// The scripted sequences of a held statement (see Statement holds in the
// package documentation): what the proxy sends Postgres around it. The
// suites against a real Postgres (compat/hold_test.go, fence's DDL tests)
// prove the same with drivers.

const (
	ddlText  = "CREATE TABLE held (id int)"
	nextText = "DROP TABLE held"
)

// catalogRead is a hold's start (as fence's DDL hook): it notes that it
// was called, and is done at once.
func catalogRead(ic *scriptIC) func() <-chan struct{} {
	return func() <-chan struct{} {
		ic.note("catalog read")
		done := make(chan struct{})
		close(done)
		return done
	}
}

var (
	noParams = &pgproto3.ParameterDescription{}
	// noRowsDescribed are Postgres's replies to Parse and Describe of a
	// statement that returns no rows.
	noRowsDescribed = []pgproto3.BackendMessage{ps.ParseComplete, noParams, ps.NoData}
)

func TestScriptedHolds(t *testing.T) {
	playSequences(t, []sequence{
		{
			// pgx's batch of CREATE and DROP in its default mode: Parse
			// and Describe of each, then Sync. The DROP's Parse is held
			// until Postgres has answered the CREATE's, which it does only
			// at a Sync or Flush: the proxy sends a Flush. The catalog
			// read runs again for the first statement after the Sync,
			// when the batch's transaction has committed.
			name: "a hold in a batch flushes",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.holds[ddlText] = catalogRead(x.ic)
				return []ps.Step{
					ps.ClientSends(ps.Parse(ddlText), ps.DescribeStatement(""), ps.Parse(nextText), ps.DescribeStatement(""), ps.Sync),
					ps.BackendGets(ps.Parse(ddlText), ps.DescribeStatement(""), ps.Flush),
					ps.BackendQuiet(),
					ps.BackendSends(noRowsDescribed...),
					ps.ClientGets(noRowsDescribed...),
					ps.BackendGets(ps.Parse(nextText), ps.DescribeStatement(""), ps.Sync),
					ps.BackendSends(ps.Back(noRowsDescribed, ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.Back(noRowsDescribed, ps.Ready(ps.Idle))...),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				}
			},
			calls: []string{"Parse: " + ddlText, "catalog read", "Parse: " + nextText, "catalog read", "Query: SELECT 1"},
		},
		{
			// The same batch, the CREATE's Parse refused: Postgres sends the
			// error at once and skips the rest up to the Sync, the Flush too;
			// the hold ends with the error.
			name: "a hold in a batch that failed",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.holds[ddlText] = catalogRead(x.ic)
				refused := ps.Error("42601", "syntax error")
				return []ps.Step{
					ps.ClientSends(ps.Parse(ddlText), ps.Bind(""), ps.Execute(""), ps.Parse(nextText), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse(ddlText), ps.Bind(""), ps.Execute(""), ps.Flush),
					ps.BackendSends(refused),
					ps.ClientGets(refused),
					ps.BackendGets(ps.Parse(nextText), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + ddlText, "Error: 42601 syntax error", "catalog read", "Parse: " + nextText},
		},
		{
			// Outside a batch nothing is flushed: a Query ends with
			// ReadyForQuery, which Postgres sends at once.
			name: "a hold after a Query",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.holds[ddlText] = catalogRead(x.ic)
				created := []pgproto3.BackendMessage{ps.Complete("CREATE TABLE"), ps.Ready(ps.Idle)}
				return []ps.Step{
					ps.ClientSends(ps.Query(ddlText), ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query(ddlText)),
					ps.BackendQuiet(),
					ps.BackendSends(created...),
					ps.ClientGets(created...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				}
			},
			calls: []string{"Query: " + ddlText, "catalog read", "Query: SELECT 1"},
		},
		{
			// A client that leaves while its statement is held ends the
			// session at once on the event loop, which watches it for a
			// hang-up while it reads nothing of it.
			name:   "a held client that leaves",
			relays: onLoop,
			ends:   true,
			script: func(x *scriptEnv) []ps.Step {
				x.ic.holds[ddlText] = catalogRead(x.ic)
				return []ps.Step{
					ps.ClientSends(ps.Parse(ddlText), ps.Bind(""), ps.Execute(""), ps.Parse(nextText)),
					ps.BackendGets(ps.Parse(ddlText), ps.Bind(""), ps.Execute(""), ps.Flush),
					ps.Do(func(testing.TB) { x.c.Conn().Close() }),
					ps.BackendClosed(),
				}
			},
			calls: []string{"Parse: " + ddlText},
		},
	})
}

// The scripted sequences of a text held until the proxy knows how the
// server reads SQL (see Reading holds in the package documentation).
const (
	readingSQL = "SELECT reading"       // the reading probe's
	changeText = "SELECT change()"      // may change the settings, as any statement may
	heldText   = `UPDATE t SET v = '\'` // depends on them (DependsOnReading)
	plainText  = "SELECT 2"             // does not
)

// readingIC sets up x's Interceptor for a reading sequence.
func readingIC(x *scriptEnv) {
	x.ic.reading[heldText] = true
	x.ic.readingProbe = proxy.NewReadingProbe(readingSQL)
	x.ic.noteReading = true
}

// Replies to Parse, Bind and Execute of a statement without rows.
var ran = []pgproto3.BackendMessage{ps.ParseComplete, ps.BindComplete, ps.Complete("SELECT 1")}

func TestScriptedReadingHolds(t *testing.T) {
	const (
		reported = " (standard_conforming_strings on, UTF8)"
		probed   = " (standard_conforming_strings off, SJIS)"
	)
	playSequences(t, []sequence{
		{
			// Pipelined simple Queries: the text that depends on the
			// settings waits for the ReadyForQuery before it, right
			// before which Postgres reports any it changed; one that does
			// not depend on them goes at once.
			name: "a Query waits for the ReadyForQuery before it",
			script: func(x *scriptEnv) []ps.Step {
				readingIC(x)
				one := []pgproto3.BackendMessage{ps.Complete("SELECT 1"), ps.Ready(ps.Idle)}
				reportOff := &pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "off"}
				return []ps.Step{
					ps.ClientSends(ps.Query(changeText), ps.Query(plainText), ps.Query(heldText)),
					ps.BackendGets(ps.Query(changeText), ps.Query(plainText)),
					ps.BackendQuiet(),
					ps.BackendSends(ps.Complete("SELECT 1"), reportOff, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("SELECT 1"), reportOff, ps.Ready(ps.Idle)),
					ps.BackendQuiet(),
					ps.BackendSends(one...),
					ps.ClientGets(one...),
					ps.BackendGets(ps.Query(heldText)),
					ps.BackendSends(one...),
					ps.ClientGets(one...),
				}
			},
			calls: []string{
				"Query: " + changeText + reported,
				"Query: " + plainText + reported,
				"DependsOnReading: " + heldText,
				"Query: " + heldText + " (standard_conforming_strings off, UTF8)",
			},
		},
		{
			// In a batch Postgres reports nothing before the Sync: the
			// proxy runs its reading probe and a Flush before the held
			// Parse, which is judged with what the probe found, until
			// the ReadyForQuery, after which the session goes by what
			// Postgres reported again (here nothing: the change was
			// rolled back with the batch).
			name: "a Parse in a batch waits for the reading probe",
			script: func(x *scriptEnv) []ps.Step {
				readingIC(x)
				return []ps.Step{
					ps.ClientSends(ps.Parse(changeText), ps.Bind(""), ps.Execute(""), ps.Parse(heldText), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(ps.Parse(changeText), ps.Bind(""), ps.Execute(""), probePrepare(readingSQL), probeRun, ps.Flush)...),
					ps.BackendQuiet(),
					ps.BackendSends(ps.Back(ran, probePrepared, probeRan("off", "SJIS"))...),
					ps.ClientGets(ran...),
					ps.BackendGets(ps.Parse(heldText), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ran, ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.Back(ran, ps.Ready(ps.Idle))...),
					ps.ClientSends(ps.Query(plainText)),
					ps.BackendGets(ps.Query(plainText)),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				}
			},
			calls: []string{
				"Parse: " + changeText + reported,
				"DependsOnReading: " + heldText,
				"Parse: " + heldText + probed,
				"Query: " + plainText + reported,
			},
		},
		{
			// A Bind the server has not answered yet before the probe: its
			// BindComplete is the client's, not the probe's.
			name: "the reading probe after a Bind",
			script: func(x *scriptEnv) []ps.Step {
				readingIC(x)
				return []ps.Step{
					ps.ClientSends(ps.Parse(changeText), ps.Bind(""), ps.Parse(heldText), ps.Sync),
					ps.BackendGets(ps.Front(ps.Parse(changeText), ps.Bind(""), probePrepare(readingSQL), probeRun, ps.Flush)...),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, probePrepared, probeRan("on", "UTF8"))...),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete),
					ps.BackendGets(ps.Parse(heldText), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
				}
			},
			calls: []string{
				"Parse: " + changeText + reported,
				"DependsOnReading: " + heldText,
				"Parse: " + heldText + reported,
			},
		},
		{
			// After an error in the batch Postgres skips the probe with the
			// rest up to the Sync, and so the held Parse too: it waits for
			// nothing.
			name: "the reading probe in a batch that failed",
			script: func(x *scriptEnv) []ps.Step {
				readingIC(x)
				missing := ps.Error("26000", `prepared statement "nope" does not exist`)
				return []ps.Step{
					ps.ClientSends(ps.DescribeStatement("nope"), ps.Flush),
					ps.BackendGets(ps.DescribeStatement("nope"), ps.Flush),
					ps.BackendSends(missing),
					ps.ClientGets(missing),
					ps.ClientSends(ps.Parse(heldText), ps.Sync),
					ps.BackendGets(ps.Front(probePrepare(readingSQL), probeRun, ps.Flush, ps.Parse(heldText), ps.Sync)...),
					ps.BackendSends(ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Ready(ps.Idle)),
				}
			},
			calls: []string{
				"Error: 26000 " + `prepared statement "nope" does not exist`,
				"DependsOnReading: " + heldText,
				"Parse: " + heldText + reported,
			},
		},
		{
			// In a block that failed, the probe would fail too, where the
			// held text may be the ROLLBACK that ends the block: the proxy
			// first waits for Postgres's answers, and as nothing ran since
			// the ReadyForQuery that said the block failed, and reported
			// the settings, it needs no probe.
			name: "a held ROLLBACK in a failed block",
			script: func(x *scriptEnv) []ps.Step {
				readingIC(x)
				x.ic.holds[ddlText] = catalogRead(x.ic)
				exists := ps.Error("42P07", `relation "held" already exists`)
				rolledBack := []pgproto3.BackendMessage{ps.ParseComplete, ps.BindComplete, ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)}
				// The failed Query's portal is closed before the Bind that
				// replaces it (see stmtBook.portalStale).
				closedFirst := []pgproto3.BackendMessage{ps.ParseComplete, ps.CloseComplete, ps.BindComplete, ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)}
				return []ps.Step{
					ps.ClientSends(ps.Query(ddlText)),
					ps.BackendGets(ps.Query(ddlText)),
					ps.BackendSends(exists, ps.Ready(ps.Failed)),
					ps.ClientGets(exists, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.ClosePortal("x"), ps.Parse("ROLLBACK"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.ClosePortal("x"), ps.Flush),
					ps.BackendSends(ps.CloseComplete),
					ps.ClientGets(ps.CloseComplete),
					ps.BackendGets(ps.Parse("ROLLBACK"), ps.ClosePortal(""), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(closedFirst...),
					ps.ClientGets(rolledBack...),
				}
			},
			calls: []string{
				"Query: " + ddlText + reported,
				"Error: 42P07 " + `relation "held" already exists`,
				"catalog read",
				"Parse: ROLLBACK" + reported,
			},
		},
	})
}
