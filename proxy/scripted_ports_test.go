package proxy_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	ps "github.com/pgfence/pgfence/internal/pgscript"
	"github.com/pgfence/pgfence/proxy"
)

// The protocol cases of fence's suites against Postgres
// (fence/reuse_test.go, bound_test.go and deferred_test.go), as scripted
// sequences: what the proxy does with the messages, whatever the SQL. The
// fence suites stay, as the proof that Postgres answers as scripted here.

// reload changes the Interceptor's configuration: its Generation moves on
// and f changes its plans.
func (ic *scriptIC) reload(f func()) ps.Step {
	return ps.Do(func(testing.TB) {
		ic.mu.Lock()
		f()
		ic.mu.Unlock()
		ic.gen.Add(1)
	})
}

// writeUnit is a unit of write's statement bound to vals, and ranUnit its
// replies with the client's view of them.
func writeUnit(vals ...string) []pgproto3.FrontendMessage {
	return []pgproto3.FrontendMessage{ps.Parse(write, 25, 20), ps.Bind("", vals...), ps.Execute(""), ps.Sync}
}

var ranUnit = []pgproto3.BackendMessage{ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)}

// reuseFirst is the first unit of write with Plan.Reuse: it prepares
// reused1.
func reuseFirst(vals ...string) []ps.Step {
	return []ps.Step{
		ps.ClientSends(writeUnit(vals...)...),
		ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused1, fenced, 25, 20), ps.Bind(reused1, vals...), ps.Execute(""), ps.Sync),
		ps.BackendSends(ps.Back(ps.CloseComplete, ranUnit)...),
		ps.ClientGets(ranUnit...),
	}
}

// gone is Postgres's error for a Bind or Describe of an unnamed statement
// it does not have.
var gone = ps.Error("26000", "unnamed prepared statement does not exist")

// Texts of the ported cases.
const (
	plainWrite = "UPDATE t_plain SET v = 'u' WHERE id = 1" // left alone by the Interceptor
	badWrite   = "UPDATE t SET nosuch = $1 WHERE id = 1"
	badFenced  = "UPDATE t SET nosuch = $1 WHERE id = 1 AND fenced"
)

// TestScriptedReuse: statement reuse (Plan.Reuse), from
// fence/reuse_test.go and the unnamed-statement cases of bound_test.go.
func TestScriptedReuse(t *testing.T) {
	reuse := func(x *scriptEnv) { x.ic.parse[write] = proxy.Plan{SQL: fenced, Reuse: true} }
	playSequences(t, []sequence{
		{
			// TestReusedStatementProtocol: a client that flushes and waits
			// for ParseComplete, then describes the statement, then binds.
			name: "Parse and Flush, Describe, then Bind",
			script: func(x *scriptEnv) []ps.Step {
				reuse(x)
				return append(reuseFirst("a", "1"),
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Flush),
					ps.BackendGets(standIn, ps.Flush),
					ps.BackendSends(ps.ParseComplete),
					ps.ClientGets(ps.ParseComplete),
					ps.ClientSends(ps.DescribeStatement(""), ps.Flush),
					ps.BackendGets(ps.DescribeStatement(reused1), ps.Flush),
					ps.BackendSends(described, ps.NoData),
					ps.ClientGets(described, ps.NoData),
					ps.ClientSends(ps.Bind("", "c", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Bind(reused1, "c", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				)
			},
			calls: []string{"Parse: " + write, "Parse: " + write},
		},
		{
			// TestReusedStatementProtocol: a Query destroys the unnamed
			// statement; the Bind after it goes to the server as sent, to
			// fail there, not to the proxy's statement.
			name: "a Query destroys the unnamed statement",
			script: func(x *scriptEnv) []ps.Step {
				reuse(x)
				return append(reuseFirst("a", "1"),
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Sync),
					ps.BackendGets(standIn, ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
					ps.ClientSends(ps.Bind("", "nope", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Bind("", "nope", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(gone, ps.Ready(ps.Idle)),
					ps.ClientGets(gone, ps.Ready(ps.Idle)),
					// The session goes on. A 26000 may mean the proxy's own
					// statements were deallocated: it prepares them again.
					ps.ClientSends(writeUnit("d", "1")...),
					ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused2, fenced, 25, 20), ps.Bind(reused2, "d", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.CloseComplete, ranUnit)...),
					ps.ClientGets(ranUnit...),
				)
			},
			calls: []string{"Parse: " + write, "Parse: " + write, "Query: SELECT 1", "Error: 26000 unnamed prepared statement does not exist", "Parse: " + write},
		},
		{
			// TestReusedStatementProtocol: so does a Close of it; the
			// server's unnamed statement may be the stand-in, so the proxy
			// closes it again before a Bind of the unnamed statement.
			name: "Close destroys the unnamed statement",
			script: func(x *scriptEnv) []ps.Step {
				reuse(x)
				return append(reuseFirst("a", "1"),
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Sync),
					ps.BackendGets(standIn, ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.CloseStatement(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.CloseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Bind("", "nope", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.Bind("", "nope", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, gone, ps.Ready(ps.Idle)),
					ps.ClientGets(gone, ps.Ready(ps.Idle)),
				)
			},
			calls: []string{"Parse: " + write, "Parse: " + write, "Error: 26000 unnamed prepared statement does not exist"},
		},
		{
			// TestReusedStatementProtocol: a reload between Parse and Bind
			// that changes the text's plan prepares the new plan as the
			// server's unnamed statement before the Bind; guarded again,
			// the text is reused as before.
			name: "reload between Parse and Bind",
			script: func(x *scriptEnv) []ps.Step {
				reuse(x)
				return append(reuseFirst("a", "1"),
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Sync),
					ps.BackendGets(standIn, ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					x.ic.reload(func() { x.ic.parse[write] = proxy.Plan{} }),
					ps.ClientSends(ps.Bind("", "unfenced", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.Parse(write, 25, 20), ps.Bind("", "unfenced", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					x.ic.reload(func() { reuse(x) }),
					ps.ClientSends(writeUnit("stale", "1")...),
					ps.BackendGets(standIn, ps.Bind(reused1, "stale", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 0"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 0"), ps.Ready(ps.Idle)),
				)
			},
			calls: []string{"Parse: " + write, "Parse: " + write, "Parse: " + write, "Parse: " + write},
		},
		{
			// TestUnnamedStatementGoneAfterFailedParse: the failed Parse is
			// of the proxy's own statement, and the server still has the
			// client's previous unnamed statement: neither may be bound or
			// described in its place. Tried again, the same name is used.
			name: "failed Parse of a reused statement",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.parse[badWrite] = proxy.Plan{SQL: badFenced, Reuse: true}
				bad := ps.Error("42703", `column "nosuch" of relation "t" does not exist`)
				return []ps.Step{
					ps.ClientSends(ps.Parse(plainWrite), ps.Sync),
					ps.BackendGets(ps.Parse(plainWrite), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Parse(badWrite, 25), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused1, badFenced, 25), ps.Sync),
					ps.BackendSends(ps.CloseComplete, bad, ps.Ready(ps.Idle)),
					ps.ClientGets(bad, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.DescribeStatement(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.DescribeStatement(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, gone, ps.Ready(ps.Idle)),
					ps.ClientGets(gone, ps.Ready(ps.Idle)),

					ps.ClientSends(ps.Parse(plainWrite), ps.Sync),
					ps.BackendGets(ps.Parse(plainWrite), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					// Prepared again under a new name: the 26000 made the
					// proxy forget its statements.
					ps.ClientSends(ps.Parse(badWrite, 25), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused2, badFenced, 25), ps.Sync),
					ps.BackendSends(ps.CloseComplete, bad, ps.Ready(ps.Idle)),
					ps.ClientGets(bad, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Bind("", "x"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.Bind("", "x"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, gone, ps.Ready(ps.Idle)),
					ps.ClientGets(gone, ps.Ready(ps.Idle)),

					// The session goes on.
					ps.ClientSends(ps.Parse("SELECT 1"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse("SELECT 1"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{
				"Parse: " + plainWrite, "Parse: " + badWrite, `Error: 42703 column "nosuch" of relation "t" does not exist`,
				"Error: 26000 unnamed prepared statement does not exist",
				"Parse: " + plainWrite, "Parse: " + badWrite, `Error: 42703 column "nosuch" of relation "t" does not exist`,
				"Error: 26000 unnamed prepared statement does not exist",
				"Parse: SELECT 1",
			},
		},
		{
			// TestFailedQueryPortalClosed: after a simple Query, the unnamed
			// portal is closed before its first use only where the block
			// may have failed by then. Answered first in a healthy block,
			// a Query costs the Bind behind it nothing; pipelined ahead of
			// its answer, or after a failure, the Bind goes behind a Close.
			name: "the unnamed portal after a simple Query",
			script: func(x *scriptEnv) []ps.Step {
				one := []pgproto3.BackendMessage{ps.ParseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1")}
				selectOne := []pgproto3.FrontendMessage{ps.Parse("SELECT 1"), ps.Bind(""), ps.Execute(""), ps.Sync}
				zero := ps.Error("22012", "division by zero")
				return []ps.Step{
					ps.ClientSends(ps.Query("BEGIN")),
					ps.BackendGets(ps.Query("BEGIN")),
					ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientSends(selectOne...),
					ps.BackendGets(selectOne...),
					ps.BackendSends(append(one, ps.Ready(ps.InBlock))...),
					ps.ClientGets(append(one, ps.Ready(ps.InBlock))...),
					// Pipelined behind a Query: the Query may fail.
					ps.ClientSends(append([]pgproto3.FrontendMessage{ps.Query("SELECT 1")}, selectOne...)...),
					ps.BackendGets(ps.Query("SELECT 1"), ps.Parse("SELECT 1"), ps.ClosePortal(""), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(append([]pgproto3.BackendMessage{ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.InBlock),
						ps.ParseComplete, ps.CloseComplete}, append(one[1:], ps.Ready(ps.InBlock))...)...),
					ps.ClientGets(append([]pgproto3.BackendMessage{ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.InBlock)},
						append(one, ps.Ready(ps.InBlock))...)...),
					// A Query that failed: its portal is closed before the
					// Execute that names it.
					ps.ClientSends(ps.Query("SELECT 1/0")),
					ps.BackendGets(ps.Query("SELECT 1/0")),
					ps.BackendSends(zero, ps.Ready(ps.Failed)),
					ps.ClientGets(zero, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.ClosePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, ps.Error("34000", `portal "" does not exist`), ps.Ready(ps.Failed)),
					ps.ClientGets(ps.Error("34000", `portal "" does not exist`), ps.Ready(ps.Failed)),
					// Once Postgres has confirmed the Close, the next Execute
					// goes as sent.
					ps.ClientSends(ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Error("34000", `portal "" does not exist`), ps.Ready(ps.Failed)),
					ps.ClientGets(ps.Error("34000", `portal "" does not exist`), ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query("ROLLBACK")),
					ps.BackendGets(ps.Query("ROLLBACK")),
					ps.BackendSends(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Query: BEGIN", "Parse: SELECT 1", "Query: SELECT 1", "Parse: SELECT 1", "Query: SELECT 1/0",
				"Error: 22012 division by zero", `Error: 34000 portal "" does not exist`, `Error: 34000 portal "" does not exist`,
				"Query: ROLLBACK"},
		},
		{
			// TestNoNamedParseInFailedBlock, pipelined: while the block
			// may have failed (the client is ahead of the replies), the
			// proxy prepares nothing under a name of its own: a named
			// Parse refused there can crash Postgres 15.
			name: "no named Parse while the block may have failed",
			script: func(x *scriptEnv) []ps.Step {
				reuse(x)
				x.ic.query["DISCARD ALL"] = proxy.Plan{Forget: true}
				aborted := ps.Error("25P02", "current transaction is aborted, commands ignored until end of transaction block")
				// The Execute of the portal DISCARD ALL left failed goes
				// behind a Close of it (see stmtBook.portalStale).
				noPortal := ps.Error("34000", `portal "" does not exist`)
				return append([]ps.Step{
					ps.ClientSends(ps.Query("BEGIN"), ps.Query("DISCARD ALL"), ps.Parse(write, 25, 20), ps.Sync, ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Query("BEGIN"), ps.Query("DISCARD ALL"), ps.Parse(fenced, 25, 20), ps.Sync, ps.ClosePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock),
						ps.Error("25001", "DISCARD ALL cannot run inside a transaction block"), ps.Ready(ps.Failed),
						aborted, ps.Ready(ps.Failed), ps.CloseComplete, noPortal, ps.Ready(ps.Failed)),
					ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock),
						ps.Error("25001", "DISCARD ALL cannot run inside a transaction block"), ps.Ready(ps.Failed),
						aborted, ps.Ready(ps.Failed), noPortal, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query("ROLLBACK")),
					ps.BackendGets(ps.Query("ROLLBACK")),
					ps.BackendSends(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
				}, reuseFirst("a", "1")...)
			},
			calls: []string{"Query: BEGIN", "Query: DISCARD ALL", "Parse: " + write,
				"Error: 25001 DISCARD ALL cannot run inside a transaction block",
				"Error: 25P02 current transaction is aborted, commands ignored until end of transaction block",
				`Error: 34000 portal "" does not exist`,
				"Query: ROLLBACK", "Parse: " + write},
		},
		{
			// TestHiddenDeallocate: a 26000 says the proxy's statements may
			// be gone (a function deallocated them): the write that met it
			// fails as the client's own statement would, and the session
			// prepares its statements again.
			name: "statement deallocated out of sight",
			script: func(x *scriptEnv) []ps.Step {
				reuse(x)
				deallocated := ps.Error("26000", "prepared statement does not exist")
				return append(reuseFirst("a", "1"),
					ps.ClientSends(writeUnit("b", "1")...),
					ps.BackendGets(standIn, ps.Bind(reused1, "b", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, deallocated, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, deallocated, ps.Ready(ps.Idle)),
					ps.ClientSends(writeUnit("c", "1")...),
					ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused2, fenced, 25, 20), ps.Bind(reused2, "c", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.CloseComplete, ranUnit)...),
					ps.ClientGets(ranUnit...),
				)
			},
			calls: []string{"Parse: " + write, "Parse: " + write, "Error: 26000 prepared statement does not exist", "Parse: " + write},
		},
	})
}

// Simple-protocol writes the Interceptor binds (Plan.ParamTypes).
const (
	w1      = "UPDATE t SET v = 'x' WHERE id = 1"
	w2      = "UPDATE t SET v = 'x' WHERE id = 2"
	w0      = "UPDATE t SET v = 'x' WHERE id = 1 / 0"
	w0SQL   = "UPDATE t SET v = $1 WHERE id = 1 / 0 AND fenced"
	wBad    = "UPDATE t SET nope = 1 WHERE id = 1"
	wBadSQL = "UPDATE t SET nope = $1 WHERE id = $2 AND fenced"
)

// TestScriptedBound: bound simple Queries (Plan.ParamTypes), from
// fence/bound_test.go.
func TestScriptedBound(t *testing.T) {
	plans := func(x *scriptEnv) {
		x.ic.query[w1] = boundPlan("x", "1")
		x.ic.query[w2] = boundPlan("x", "2")
		x.ic.query[w0] = proxy.Plan{SQL: w0SQL, ParamTypes: paramTypes(25), Params: []string{"x"}}
		x.ic.query[wBad] = proxy.Plan{SQL: wBadSQL, ParamTypes: paramTypes(20, 20), Params: []string{"1", "1"}}
	}
	done := []pgproto3.BackendMessage{ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)}
	nope := ps.Error("42703", `column "nope" of relation "t" does not exist`)
	playSequences(t, []sequence{
		{
			// TestBoundSimpleWriteProtocol: the client sees exactly what a
			// Query gets; a statement whose Parse failed is prepared again
			// (under its name); pipelined Queries each get their replies.
			name: "what the client sees",
			script: func(x *scriptEnv) []ps.Step {
				plans(x)
				return []ps.Step{
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.Query(w2)),
					ps.BackendGets(ps.Bind(reused1, "x", "2"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.BindComplete, done)...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.Query(w0)),
					ps.BackendGets(ps.ParseNamed(reused2, w0SQL, 25), ps.Bind(reused2, "x"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, divide(), ps.Ready(ps.Idle)),
					ps.ClientGets(divide(), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(wBad)),
					ps.BackendGets(ps.ParseNamed(reused3, wBadSQL, 20, 20), ps.Bind(reused3, "1", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(nope, ps.Ready(ps.Idle)),
					ps.ClientGets(nope, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(wBad)),
					ps.BackendGets(ps.ParseNamed(reused3, wBadSQL, 20, 20), ps.Bind(reused3, "1", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(nope, ps.Ready(ps.Idle)),
					ps.ClientGets(nope, ps.Ready(ps.Idle)),
					// Pipelined.
					ps.ClientSends(ps.Query(w1), ps.Query(w0), ps.Query(w2)),
					ps.BackendGets(ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync,
						ps.Bind(reused2, "x"), ps.Execute(""), ps.Sync,
						ps.Bind(reused1, "x", "2"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.BindComplete, done, ps.BindComplete, divide(), ps.Ready(ps.Idle), ps.BindComplete, done)...),
					ps.ClientGets(ps.Back(done, divide(), ps.Ready(ps.Idle), done)...),
				}
			},
			calls: []string{"Query: " + w1, "Query: " + w2, "Query: " + w0, "Error: 22012 division by zero",
				"Query: " + wBad, `Error: 42703 column "nope" of relation "t" does not exist`,
				"Query: " + wBad, `Error: 42703 column "nope" of relation "t" does not exist`,
				"Query: " + w1, "Query: " + w0, "Query: " + w2, "Error: 22012 division by zero"},
		},
		{
			// TestUnnamedStatementGoneAfterBoundQuery: a bound Query leaves
			// the server's unnamed statement and portal where Postgres
			// would have destroyed them: a Bind, Execute or Describe of
			// them closes them first, so that it fails as it would have.
			name: "unnamed statement gone after a bound Query",
			script: func(x *scriptEnv) []ps.Step {
				plans(x)
				return []ps.Step{
					ps.ClientSends(ps.Parse(plainWrite), ps.Sync),
					ps.BackendGets(ps.Parse(plainWrite), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.ClosePortal(""), ps.CloseStatement(""), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, ps.CloseComplete, gone, ps.Ready(ps.Idle)),
					ps.ClientGets(gone, ps.Ready(ps.Idle)),

					ps.ClientSends(ps.Parse("SELECT 1"), ps.Sync),
					ps.BackendGets(ps.Parse("SELECT 1"), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					// Prepared again: the 26000 made the proxy forget it.
					ps.ClientSends(ps.Query(w2)),
					ps.BackendGets(ps.ParseNamed(reused2, boundSQL, 25, 20), ps.Bind(reused2, "x", "2"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.DescribeStatement(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.DescribeStatement(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, gone, ps.Ready(ps.Idle)),
					ps.ClientGets(gone, ps.Ready(ps.Idle)),

					// The session goes on; the portal the bound Query left
					// is closed before the client's Bind.
					ps.ClientSends(ps.Parse("SELECT 1"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse("SELECT 1"), ps.ClosePortal(""), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.CloseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + plainWrite, "Query: " + w1, "Error: 26000 unnamed prepared statement does not exist",
				"Parse: SELECT 1", "Query: " + w2, "Error: 26000 unnamed prepared statement does not exist", "Parse: SELECT 1"},
		},
		{
			// TestNoNamedParseInFailedBlock, bound Query: in a block the
			// last ReadyForQuery said failed, the bound Query is parsed as
			// the unnamed statement, and leaves the unnamed portal as it
			// was: the one DISCARD ALL's Query left failed, which the
			// client's Execute finds closed (see stmtBook.portalStale).
			name: "bound Query in a failed block",
			script: func(x *scriptEnv) []ps.Step {
				plans(x)
				x.ic.query["DISCARD ALL"] = proxy.Plan{Forget: true}
				discard := ps.Error("25001", "DISCARD ALL cannot run inside a transaction block")
				aborted := ps.Error("25P02", "current transaction is aborted, commands ignored until end of transaction block")
				noPortal := ps.Error("34000", `portal "" does not exist`)
				return []ps.Step{
					ps.ClientSends(ps.Query("BEGIN")),
					ps.BackendGets(ps.Query("BEGIN")),
					ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientSends(ps.Query("DISCARD ALL")),
					ps.BackendGets(ps.Query("DISCARD ALL")),
					ps.BackendSends(discard, ps.Ready(ps.Failed)),
					ps.ClientGets(discard, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Parse(boundSQL, 25, 20), ps.Bind("", "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(aborted, ps.Ready(ps.Failed)),
					ps.ClientGets(aborted, ps.Ready(ps.Failed)),
					// The portal DISCARD ALL left failed is closed first
					// (see stmtBook.portalStale).
					ps.ClientSends(ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.ClosePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, noPortal, ps.Ready(ps.Failed)),
					ps.ClientGets(noPortal, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query("ROLLBACK")),
					ps.BackendGets(ps.Query("ROLLBACK")),
					ps.BackendSends(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
				}
			},
			calls: []string{"Query: BEGIN", "Query: DISCARD ALL", "Error: 25001 DISCARD ALL cannot run inside a transaction block",
				"Query: " + w1, "Error: 25P02 current transaction is aborted, commands ignored until end of transaction block",
				`Error: 34000 portal "" does not exist`,
				"Query: ROLLBACK", "Query: " + w1},
		},
		{
			// TestQueryInsideExtendedBatch: a Query before the batch's Sync
			// runs inside it (the Interceptor is told, and binds nothing);
			// after an error in the batch Postgres skips it, and so does
			// the proxy's account of the replies.
			name: "Query inside an extended batch",
			script: func(x *scriptEnv) []ps.Step {
				plans(x)
				x.ic.batch[w1] = proxy.Plan{SQL: simpleRW}
				return []ps.Step{
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.Parse("SELECT 1"), ps.Bind(""), ps.Execute(""), ps.Query(w1), ps.Sync),
					ps.BackendGets(ps.Parse("SELECT 1"), ps.ClosePortal(""), ps.Bind(""), ps.Execute(""), ps.Query(simpleRW), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.CloseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1"),
						ps.Complete("UPDATE 1"), ps.Ready(ps.Idle), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Row("1"), ps.Complete("SELECT 1"),
						ps.Complete("UPDATE 1"), ps.Ready(ps.Idle), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Parse("SELECT 1/0"), ps.Bind(""), ps.Execute(""), ps.Query(w1), ps.Sync),
					ps.BackendGets(ps.Parse("SELECT 1/0"), ps.Bind(""), ps.Execute(""), ps.Query(simpleRW), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, divide(), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, divide(), ps.Ready(ps.Idle)),
					// The session goes on.
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.BindComplete, done)...),
					ps.ClientGets(done...),
				}
			},
			calls: []string{"Query: " + w1, "Parse: SELECT 1", "Query (in a batch): " + w1,
				"Parse: SELECT 1/0", "Query (in a batch): " + w1, "Error: 22012 division by zero", "Query: " + w1},
		},
		{
			// TestHiddenDeallocate, simple protocol.
			name: "statement deallocated out of sight",
			script: func(x *scriptEnv) []ps.Step {
				plans(x)
				deallocated := ps.Error("26000", "prepared statement does not exist")
				return []ps.Step{
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(deallocated, ps.Ready(ps.Idle)),
					ps.ClientGets(deallocated, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.ParseNamed(reused2, boundSQL, 25, 20), ps.Bind(reused2, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, done)...),
					ps.ClientGets(done...),
				}
			},
			calls: []string{"Query: " + w1, "Query: " + w1, "Error: 26000 prepared statement does not exist", "Query: " + w1},
		},
	})
}

// The token SETs of the deferred cases, and what they plan to.
func tokenSQL(value string, local bool) string {
	if local {
		return "SET LOCAL fence.token = '" + value + "'"
	}
	return "SET fence.token = '" + value + "'"
}

// setTokens plans each value's SET (and SET LOCAL) of the token.
func setTokens(x *scriptEnv, values ...string) {
	for _, v := range values {
		x.ic.query[tokenSQL(v, false)] = setPlan(tokenName, v, false)
		x.ic.query[tokenSQL(v, true)] = setPlan(tokenName, v, true)
		x.ic.parse[tokenSQL(v, false)] = setPlan(tokenName, v, false)
	}
}

// answered is the proxy answering a SET of the token to value (idle, or
// in a block: status) without the server.
func answered(value string, local bool, status byte) []ps.Step {
	return []ps.Step{
		ps.ClientSends(ps.Query(tokenSQL(value, local))),
		ps.ClientGets(ps.Complete("SET"), ps.Ready(status)),
		ps.BackendQuiet(),
	}
}

// answeredCalls are the Interceptor's calls for answered.
func answeredCalls(value string, local bool) []string {
	l := ""
	if local {
		l = " (local)"
	}
	return []string{"Query: " + tokenSQL(value, local), "SettingAnswered: fence.token = " + value + l}
}

// fencedWrite plans w1 as a bound write with a probe, as fence plans a
// guarded write.
func fencedWrite(x *scriptEnv) {
	p := x.ic.probe(probeSQL, nil)
	plan := boundPlan("x", "1")
	plan.Probes = []proxy.ProbeAt{{Probe: p}}
	x.ic.query[w1] = plan
}

// quietWrite plans w1 as fencedWrite does, with a probe whose Quiet lets
// the proxy leave it out after a SET of fence.token it answered: notices
// whose message is "stale" are the write's own.
func quietWrite(x *scriptEnv) {
	fencedWrite(x)
	x.ic.query[w1].Probes[0].Probe.SetQuiet(&proxy.Quiet{
		Known: func(_ *proxy.Client, set []proxy.Setting) bool {
			for _, s := range set {
				x.ic.note("Known: %s = %s", s.Name, s.Value)
			}
			return len(set) > 0
		},
		Notice: func(_ *proxy.Client, n *pgproto3.NoticeResponse) (string, bool) {
			return n.Detail, n.Message == "stale"
		},
		Done: func(_ *proxy.Client, set []proxy.Setting, notes []string) *pgproto3.NoticeResponse {
			x.ic.note("Done: %d settings, notes %q", len(set), notes)
			return nil
		},
	})
}

// calls concatenates lists of calls.
func calls(parts ...any) []string {
	var out []string
	for _, p := range parts {
		switch p := p.(type) {
		case string:
			out = append(out, p)
		case []string:
			out = append(out, p...)
		}
	}
	return out
}

// TestScriptedDeferred: SETs the proxy answers itself (Plan.Setting, the
// event loop's alone), from fence/deferred_test.go.
func TestScriptedDeferred(t *testing.T) {
	probed := "probe " + probeSQL + ": 1"
	missing := ps.Error("26000", "prepared statement does not exist")
	done := []pgproto3.BackendMessage{ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)}
	playSequences(t, []sequence{
		{
			// TestTokenSetAnsweredByProxy: the write after an answered SET
			// carries it in its own transaction, without a Sync between,
			// in both protocols; once it ended well nothing is sent again.
			name:   "answered SET carried by the next write",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "7", "8")
				fencedWrite(x)
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Probes: x.ic.query[w1].Probes}
				return append(append(answered("7", false, ps.Idle),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "7", false),
						ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("7"), ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(done...),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				), append(answered("8", false, ps.Idle),
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Bind("", "y", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(setRun(tokenName, "8", false), ps.Parse(fenced, 25, 20), ps.Bind("", "y", "1"), ps.Execute(""), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(setRan("8"), ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(ranUnit...),
				)...)
			},
			calls: calls(answeredCalls("7", false), "Query: "+w1, probed, "Query: SELECT 1",
				answeredCalls("8", false), "Parse: "+write, probed),
		},
		{
			// TestQuietWrites: where the write's probe has a Quiet that the
			// settings tell all it needs, the settings go with the quiet
			// mark, the probe is left out, the write's own notice goes to
			// the Quiet and not to the client (another notice does), and
			// its completion tells the Quiet. A write whose token was not
			// set right ahead of it is probed.
			name:   "write after an answered SET goes without its probe",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "7")
				quietWrite(x)
				stale := &pgproto3.NoticeResponse{Severity: "NOTICE", Code: "PF011", Message: "stale", Detail: "pgfence.stale_0 t:9"}
				other := &pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "other"}
				return append(answered("7", false, ps.Idle),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setPrepare, setRunMarked(tokenName, "7", false, true),
						ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("7"), ps.ParseComplete, ps.BindComplete, stale, other, stale,
						ps.Complete("UPDATE 0"), ps.Ready(ps.Idle))...),
					ps.ClientGets(other, ps.Complete("UPDATE 0"), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(ps.Bind(reused1, "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(done...),
				)
			},
			calls: calls(answeredCalls("7", false), "Query: "+w1, "Known: fence.token = 7", "Notice: other",
				`Done: 1 settings, notes ["pgfence.stale_0 t:9" "pgfence.stale_0 t:9"]`, "Query: "+w1, "probe "+probeSQL+": 1"),
		},
		{
			// TestAnsweredUnnamedSetBoundAgain: an unnamed SET statement
			// and its unit are answered together, and bound again while
			// idle, answered again; bound where the proxy forwards it (here
			// behind another statement), it is prepared on the server first
			// rather than bind the server's unnamed statement.
			name:   "answered unnamed SET statement bound again",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "31")
				set := tokenSQL("31", false)
				return []ps.Step{
					// A named statement, for later.
					ps.ClientSends(ps.ParseNamed("b", "SELECT 2"), ps.Sync),
					ps.BackendGets(ps.ParseNamed("b", "SELECT 2"), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),

					ps.ClientSends(ps.Parse(set), ps.Bind(""), ps.DescribePortal(""), ps.Execute(""), ps.Sync),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("SET"), ps.Ready(ps.Idle)),
					ps.BackendQuiet(),
					ps.ClientSends(ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.ClientGets(ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.Idle)),
					ps.BackendQuiet(),
					// The named statement bound with the unnamed SET behind
					// it, which is then not answered. (Not a Query: that
					// destroys the unnamed statement.)
					ps.ClientSends(ps.Bind("b"), ps.Execute(""), ps.Sync, ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "31", false), ps.Sync)...),
					ps.BackendQuiet(),
					ps.BackendSends(ps.Back(setPrepared, setRan("31"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Bind("b"), ps.Execute(""), ps.Sync, ps.CloseStatement(""), ps.Parse(set), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.BindComplete, ps.Row("2"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle),
						ps.CloseComplete, ps.ParseComplete, ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.BindComplete, ps.Row("2"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle),
						ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: SELECT 2", "Parse: SET fence.token = '31'", "SettingAnswered: fence.token = 31",
				"SettingAnswered: fence.token = 31", "Parse: SET fence.token = '31'"},
		},
		{
			// TestAnsweredUnnamedSetBoundAgain, in a block: bound again
			// there, with nothing in flight, the unnamed SET is answered
			// too (the fence test says "forwarded" there, and cannot tell),
			// and set in the block ahead of its next statement.
			name:   "answered unnamed SET statement bound again in a block",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "31", "32")
				return []ps.Step{
					ps.ClientSends(ps.Parse(tokenSQL("31", false)), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.Idle)),
					// BEGIN as a named statement: a Query would destroy the
					// unnamed statement.
					ps.ClientSends(ps.ParseNamed("b", "BEGIN"), ps.Bind("b"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "31", false), ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("31"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.ParseNamed("b", "BEGIN"), ps.Bind("b"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientSends(ps.ParseNamed("s", tokenSQL("32", false)), ps.Bind("s"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.ParseNamed("s", tokenSQL("32", false)), ps.Bind("s"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.InBlock)),
					ps.ClientSends(ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.ClientGets(ps.BindComplete, ps.Complete("SET"), ps.Ready(ps.InBlock)),
					ps.BackendQuiet(),
					ps.ClientSends(ps.Query("COMMIT")),
					ps.BackendGets(ps.Front(setRun(tokenName, "31", false), ps.Sync)...),
					ps.BackendSends(ps.Back(setRan("31"), ps.Ready(ps.InBlock))...),
					ps.BackendGets(ps.Query("COMMIT")),
					ps.BackendSends(ps.Complete("COMMIT"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("COMMIT"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: SET fence.token = '31'", "SettingAnswered: fence.token = 31", "Parse: BEGIN",
				"Parse: SET fence.token = '32'", "SettingAnswered: fence.token = 31", "Query: COMMIT"},
		},
		{
			// TestDeferredTokenFailsClosed: when setting the token fails on
			// the server, nothing runs without it. A write it was joined to
			// is skipped, and the client gets the error; the token is set
			// again (prepared again) ahead of the next. Ahead of anything
			// else it had a Sync of its own, and is tried once more, while
			// what waits for it waits on.
			name:   "deferred SET fails closed",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "6", "7", "8")
				fencedWrite(x)
				return append(append(append(answered("6", false, ps.Idle),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "6", false),
						ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("6"), ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(done...),
				), answered("7", false, ps.Idle)...), append(append([]ps.Step{
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setRun(tokenName, "7", false), ps.Bind(reused1, "x", "1"), ps.Execute(""), probeRun, ps.Sync)...),
					ps.BackendSends(missing, ps.Ready(ps.Idle)),
					ps.ClientGets(missing, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "7", false),
						ps.ParseNamed(reused2, boundSQL, 25, 20), ps.Bind(reused2, "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("7"), ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(done...),
				}, answered("8", false, ps.Idle)...),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setRun(tokenName, "8", false), ps.Sync)...),
					ps.BackendSends(missing, ps.Ready(ps.Idle)),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "8", false), ps.Sync)...),
					ps.BackendQuiet(),
					ps.BackendSends(ps.Back(setPrepared, setRan("8"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				)...)
			},
			calls: calls(answeredCalls("6", false), "Query: "+w1, probed,
				answeredCalls("7", false), "Query: "+w1, "Error: 26000 prepared statement does not exist",
				"Query: "+w1, probed, answeredCalls("8", false), "Query: SELECT 1"),
		},
		{
			// TestDeferredTokenRolledBackWithWrite: a token set in the
			// transaction of a write that fails is rolled back with it,
			// and set again ahead of the next statement.
			name:   "deferred SET rolled back with its write",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "5")
				fencedWrite(x)
				return append(answered("5", false, ps.Idle),
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "5", false),
						ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("5"), ps.ParseComplete, ps.BindComplete, divide(), ps.Ready(ps.Idle))...),
					ps.ClientGets(divide(), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setRun(tokenName, "5", false), ps.Sync)...),
					ps.BackendSends(ps.Back(setRan("5"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				)
			},
			calls: calls(answeredCalls("5", false), "Query: "+w1, "Error: 22012 division by zero", "Query: SELECT 1", "Query: SELECT 1"),
		},
		{
			// TestTokenSetInBlock: a SET, and a SET LOCAL, in a block that
			// has not failed are answered too, and set in the block; once
			// run there, Postgres undoes them with the block. In a failed
			// block, and for a SET LOCAL outside one, the server answers.
			name:   "SET in a block",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "9", "10", "11", "40")
				inBlock := []pgproto3.BackendMessage{ps.Columns("?column?"), ps.Row("1"), ps.Complete("SELECT 1"), ps.Ready(ps.InBlock)}
				aborted := ps.Error("25P02", "current transaction is aborted, commands ignored until end of transaction block")
				warning := ps.Notice("WARNING", "25P01", "SET LOCAL can only be used in transaction blocks")
				steps := []ps.Step{
					ps.ClientSends(ps.Query("BEGIN")),
					ps.BackendGets(ps.Query("BEGIN")),
					ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
				}
				steps = append(steps, answered("9", false, ps.InBlock)...)
				steps = append(steps,
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "9", false), ps.Sync)...),
					ps.BackendQuiet(),
					ps.BackendSends(ps.Back(setPrepared, setRan("9"), ps.Ready(ps.InBlock))...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(inBlock...),
					ps.ClientGets(inBlock...),
				)
				steps = append(steps, answered("10", true, ps.InBlock)...)
				steps = append(steps,
					ps.ClientSends(ps.Query("ROLLBACK")),
					ps.BackendGets(ps.Front(setRun(tokenName, "10", true), ps.Sync)...),
					ps.BackendSends(ps.Back(setRan("10"), ps.Ready(ps.InBlock))...),
					ps.BackendGets(ps.Query("ROLLBACK")),
					ps.BackendSends(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					// Nothing is left to set.
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),

					ps.ClientSends(ps.Query("BEGIN")),
					ps.BackendGets(ps.Query("BEGIN")),
					ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientSends(ps.Query("SELECT 1/0")),
					ps.BackendGets(ps.Query("SELECT 1/0")),
					ps.BackendSends(divide(), ps.Ready(ps.Failed)),
					ps.ClientGets(divide(), ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query(tokenSQL("11", false))),
					ps.BackendGets(ps.Query(tokenSQL("11", false))),
					ps.BackendSends(aborted, ps.Ready(ps.Failed)),
					ps.ClientGets(aborted, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query("ROLLBACK")),
					ps.BackendGets(ps.Query("ROLLBACK")),
					ps.BackendSends(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),

					ps.ClientSends(ps.Query(tokenSQL("40", true))),
					ps.BackendGets(ps.Query(tokenSQL("40", true))),
					ps.BackendSends(warning, ps.Complete("SET"), ps.Ready(ps.Idle)),
					ps.ClientGets(warning, ps.Complete("SET"), ps.Ready(ps.Idle)),
				)
				return steps
			},
			calls: calls("Query: BEGIN", answeredCalls("9", false), "Query: SELECT 1", answeredCalls("10", true), "Query: ROLLBACK", "Query: SELECT 1",
				"Query: BEGIN", "Query: SELECT 1/0", "Error: 22012 division by zero",
				"Query: "+tokenSQL("11", false), "Error: 25P02 current transaction is aborted, commands ignored until end of transaction block",
				"Query: ROLLBACK", "Query: "+tokenSQL("40", true), "Notice: SET LOCAL can only be used in transaction blocks"),
		},
		{
			// TestDeferredTokenFailsInBlock: a token answered in a block
			// that fails to be set ahead of a write fails the write and the
			// block, which rolls back as the client asks; ahead of anything
			// else the session ends, and what waited never reaches the
			// server.
			name:   "deferred SET failing in a block",
			relays: onLoop,
			ends:   true,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "5", "6", "7")
				fencedWrite(x)
				begin := []ps.Step{
					ps.ClientSends(ps.Query("BEGIN")),
					ps.BackendGets(ps.Query("BEGIN")),
					ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
					ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
				}
				steps := answered("5", false, ps.Idle)
				steps = append(steps,
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "5", false),
						ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("5"), ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(done...),
				)
				steps = append(append(steps, begin...), answered("6", false, ps.InBlock)...)
				steps = append(steps,
					ps.ClientSends(ps.Query(w1)),
					ps.BackendGets(ps.Front(setRun(tokenName, "6", false), ps.Bind(reused1, "x", "1"), ps.Execute(""), probeRun, ps.Sync)...),
					ps.BackendSends(missing, ps.Ready(ps.Failed)),
					ps.ClientGets(missing, ps.Ready(ps.Failed)),
					ps.ClientSends(ps.Query("ROLLBACK")),
					ps.BackendGets(ps.Query("ROLLBACK")),
					ps.BackendSends(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("ROLLBACK"), ps.Ready(ps.Idle)),
				)
				steps = append(append(steps, begin...), answered("7", true, ps.InBlock)...)
				return append(steps,
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "7", true), ps.Sync)...),
					ps.BackendSends(missing, ps.Ready(ps.Failed)),
					ps.ClientGets(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "26000",
						Message: "pgfence: SET fence.token, which pgfence answered at once, failed when it ran on the server: prepared statement does not exist",
						Hint:    "reconnect and set it again; pgfence ended the session so that nothing would run without it"}),
					ps.ClientClosed(),
					ps.BackendClosed(), // SELECT 1 never reached it
					ps.Do(func(t testing.TB) {
						if err := sessionEnd(t, x.ic); err == nil || !strings.Contains(err.Error(), "deferred SET failed") {
							t.Errorf("the session ended with %v, want the deferred SET's failure", err)
						}
					}),
				)
			},
			calls: calls(answeredCalls("5", false), "Query: "+w1, probed, "Query: BEGIN", answeredCalls("6", false), "Query: "+w1,
				"Error: 26000 prepared statement does not exist", "Query: ROLLBACK", "Query: BEGIN", answeredCalls("7", true), "Query: SELECT 1"),
		},
		{
			// TestDeferredTokenPipelined: a SET pipelined with a write, in
			// one batch or behind a Query in flight, is not answered alone.
			name:   "pipelined SET not answered",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "11", "12")
				x.ic.parse[write] = proxy.Plan{SQL: fenced}
				set := tokenSQL("11", false)
				return []ps.Step{
					ps.ClientSends(ps.Parse(set), ps.Bind(""), ps.DescribePortal(""), ps.Execute(""),
						ps.Parse(write, 25, 20), ps.Bind("", "b", "1"), ps.DescribePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse(set), ps.Bind(""), ps.DescribePortal(""), ps.Execute(""),
						ps.Parse(fenced, 25, 20), ps.Bind("", "b", "1"), ps.DescribePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("SET"),
						ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("SET"),
						ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query("SELECT 1"), ps.Query(tokenSQL("12", false))),
					ps.BackendGets(ps.Query("SELECT 1"), ps.Query(tokenSQL("12", false))),
					ps.BackendSends(ps.Back(selectOne, ps.Complete("SET"), ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.Back(selectOne, ps.Complete("SET"), ps.Ready(ps.Idle))...),
				}
			},
			calls: []string{"Parse: " + tokenSQL("11", false), "Parse: " + write, "Query: SELECT 1", "Query: " + tokenSQL("12", false)},
		},
		{
			// TestTokenSetDeclaringParamsIsForwarded: a SET prepared with a
			// parameter type declared is not answered: bound with no
			// value, Postgres refuses it, and so the client must see it.
			name:   "SET declaring a parameter forwarded",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "40", "41")
				refused := ps.Error("08P01", `bind message supplies 0 parameters, but prepared statement "p" requires 1`)
				refusedUnnamed := ps.Error("08P01", `bind message supplies 0 parameters, but prepared statement "" requires 1`)
				return []ps.Step{
					ps.ClientSends(ps.ParseNamed("p", tokenSQL("40", false), 23), ps.Sync),
					ps.BackendGets(ps.ParseNamed("p", tokenSQL("40", false), 23), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Bind("p"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Bind("p"), ps.Execute(""), ps.Sync),
					ps.BackendSends(refused, ps.Ready(ps.Idle)),
					ps.ClientGets(refused, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Parse(tokenSQL("41", false), 23), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse(tokenSQL("41", false), 23), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, refusedUnnamed, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, refusedUnnamed, ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + tokenSQL("40", false), "Error: 08P01 bind message supplies 0 parameters, but prepared statement \"p\" requires 1",
				"Parse: " + tokenSQL("41", false), "Error: 08P01 bind message supplies 0 parameters, but prepared statement \"\" requires 1"},
		},
		{
			// A SET's unit whose Execute, or Describe, is of another
			// portal than its Bind's is not one statement's unit (see
			// session.unit): it is forwarded, and the client gets
			// Postgres's error, not the proxy's answer.
			name:   "SET unit of another portal forwarded",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "42")
				set := tokenSQL("42", false)
				noPortal := ps.Error("34000", `portal "x" does not exist`)
				return []ps.Step{
					ps.ClientSends(ps.Parse(set), ps.Bind(""), ps.Execute("x"), ps.Sync),
					ps.BackendGets(ps.Parse(set), ps.Bind(""), ps.Execute("x"), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, noPortal, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, noPortal, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Parse(set), ps.Bind(""), ps.DescribePortal("x"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse(set), ps.Bind(""), ps.DescribePortal("x"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, noPortal, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, noPortal, ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: SET fence.token = '42'", `Error: 34000 portal "x" does not exist`,
				"Parse: SET fence.token = '42'", `Error: 34000 portal "x" does not exist`},
		},
		{
			// TestDeferredTokenAfterDeallocateAll: a text that deallocates
			// every statement, right behind an answered SET (so the
			// proxy's statement is prepared ahead of it, and Postgres
			// confirms that after the text was planned), has the proxy
			// prepare it again for the next deferred SET.
			name:   "set statement prepared again after DEALLOCATE ALL",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "5", "6")
				x.ic.query["DEALLOCATE ALL"] = proxy.Plan{Forget: true}
				return append(append(answered("5", false, ps.Idle),
					ps.ClientSends(ps.Query("DEALLOCATE ALL")),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "5", false), ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("5"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Query("DEALLOCATE ALL")),
					ps.BackendSends(ps.Complete("DEALLOCATE ALL"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("DEALLOCATE ALL"), ps.Ready(ps.Idle)),
				), append(answered("6", false, ps.Idle),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "6", false), ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("6"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				)...)
			},
			calls: calls(answeredCalls("5", false), "Query: DEALLOCATE ALL", answeredCalls("6", false), "Query: SELECT 1"),
		},
		{
			// A transaction pooler nobody declared gave the session another
			// server process between transactions: the set_config
			// statement's pg_backend_pid() says so, and the session ends.
			name:   "server process changed between transactions",
			relays: onLoop,
			ends:   true,
			config: func(c *proxy.Config) { c.Hints.Pooler = "declare the pooler (scripted)" },
			script: func(x *scriptEnv) []ps.Step {
				setTokens(x, "5", "6")
				return append(append(answered("5", false, ps.Idle),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, "5", false), ps.Sync)...),
					ps.BackendSends(ps.Back(setPrepared, setRan("5"), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				), append(answered("6", false, ps.Idle),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setRun(tokenName, "6", false), ps.Sync)...),
					ps.BackendSends(ps.BindComplete, ps.Row("6", "9999")),
					ps.ClientGets(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "08006",
						Message: "pgfence: the server process behind this session changed between transactions (" + backendPID + ", then 9999): a transaction pooler stands between pgfence and Postgres",
						Hint:    "declare the pooler (scripted)"}),
					ps.ClientClosed(),
					ps.BackendClosed(),
				)...)
			},
			calls: calls(answeredCalls("5", false), "Query: SELECT 1", answeredCalls("6", false), "Query: SELECT 1"),
		},
		{
			// TestProbeAfterPipelinedDeallocateAll: a probe prepared in a
			// pipeline ahead of DEALLOCATE ALL (Postgres confirms it after
			// the text was planned) is prepared again before the next
			// write binds it, rather than fail that write with 26000.
			name: "probe prepared again after a pipelined DEALLOCATE ALL",
			script: func(x *scriptEnv) []ps.Step {
				p := x.ic.probe(probeSQL, nil)
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Probes: []proxy.ProbeAt{{Probe: p}}}
				x.ic.query["DEALLOCATE ALL"] = proxy.Plan{Forget: true}
				return []ps.Step{
					ps.ClientSends(ps.ParseNamed("w", write), ps.Bind("w", "x", "1"), ps.Execute(""), ps.Sync,
						ps.Query("DEALLOCATE ALL"), ps.ParseNamed("w2", write), ps.Sync),
					ps.BackendGets(ps.Front(ps.ParseNamed("w", fenced), ps.Bind("w", "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync,
						ps.Query("DEALLOCATE ALL"), ps.ParseNamed("w2", fenced), ps.Sync)...),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle),
						ps.Complete("DEALLOCATE ALL"), ps.Ready(ps.Idle), ps.ParseComplete, ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle),
						ps.Complete("DEALLOCATE ALL"), ps.Ready(ps.Idle), ps.ParseComplete, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Bind("w2", "y", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(ps.Bind("w2", "y", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + write, "Query: DEALLOCATE ALL", "Parse: " + write, "probe " + probeSQL + ": 1", "probe " + probeSQL + ": 1"},
		},
	})
}

// divide is Postgres's error for a division by zero.
func divide() *pgproto3.ErrorResponse { return ps.Error("22012", "division by zero") }
