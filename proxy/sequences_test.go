package proxy_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	ps "github.com/pgfence/pgfence/internal/pgscript"
	"github.com/pgfence/pgfence/proxy"
)

// Texts the sequences use: a write, and what the Interceptor makes of it.
const (
	write      = "UPDATE t SET v = $1 WHERE id = $2"
	fenced     = "UPDATE t SET v = $1 WHERE id = $2 AND fenced"
	probeSQL   = "SELECT 'probe'"
	simpleSQL  = "UPDATE t SET v = 'x' WHERE id = 1"
	simpleRW   = "UPDATE t SET v = 'x' WHERE id = 1 AND fenced"
	boundSQL   = "UPDATE t SET v = $1 WHERE id = $2 AND fenced"
	tokenSet   = "SET fence.token = '7'"
	tokenName  = "fence.token"
	tokenValue = "7"
)

// described is what Postgres answers a Describe of write's statement
// with, before NoData.
var described = &pgproto3.ParameterDescription{ParameterOIDs: []uint32{25, 20}}

// boundPlan plans a simple Query as boundSQL bound to vals (text and int8).
func boundPlan(vals ...string) proxy.Plan {
	return proxy.Plan{SQL: boundSQL, ParamTypes: paramTypes(25, 20), Params: vals}
}

// shift is an Origin that moves error positions by n characters.
type shift int

func (s shift) Position(_ *proxy.Client, pos int, _ []string) int {
	if pos+int(s) < 1 {
		return 0
	}
	return pos + int(s)
}
func (shift) Param(*proxy.Client, int, []string) int { return 0 }

// TestScriptedSequences plays the proxy's core protocol cases against a
// scripted Postgres.
func TestScriptedSequences(t *testing.T) {
	playSequences(t, []sequence{
		{
			name: "Query passed through",
			script: func(x *scriptEnv) []ps.Step {
				return []ps.Step{
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				}
			},
			calls: []string{"Query: SELECT 1"},
		},
		{
			name: "Query rewritten",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.query[simpleSQL] = proxy.Plan{SQL: simpleRW}
				return []ps.Step{
					ps.ClientSends(ps.Query(simpleSQL)),
					ps.BackendGets(ps.Query(simpleRW)),
					ps.BackendSends(ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Query: " + simpleSQL},
		},
		{
			name: "unnamed Parse Bind Execute Sync rewritten",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.parse[write] = proxy.Plan{SQL: fenced}
				return []ps.Step{
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Bind("", "x", "1"), ps.DescribePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse(fenced, 25, 20), ps.Bind("", "x", "1"), ps.DescribePortal(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.NoData, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + write},
		},
		{
			// The probe runs right after the Execute, in its transaction;
			// its statement is prepared once. Its replies never reach the
			// client: its row goes to the probe, and a notice the probe
			// returns follows the write's results.
			name: "probe after Execute",
			script: func(x *scriptEnv) []ps.Step {
				p := x.ic.probe(probeSQL, func(row []string) *pgproto3.NoticeResponse {
					if row[0] == "stale" {
						return ps.Notice("WARNING", "01000", "stale write")
					}
					return nil
				})
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Probes: []proxy.ProbeAt{{Probe: p}}}
				unit := []pgproto3.FrontendMessage{ps.Parse(write, 25, 20), ps.Bind("", "x", "1"), ps.Execute(""), ps.Sync}
				return []ps.Step{
					ps.ClientSends(unit...),
					ps.BackendGets(ps.Front(ps.Parse(fenced, 25, 20), ps.Bind("", "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1", "t"), ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					// Prepared once: now only run.
					ps.ClientSends(unit...),
					ps.BackendGets(ps.Front(ps.Parse(fenced, 25, 20), ps.Bind("", "x", "1"), ps.Execute(""), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 0"), probeRan("stale", "f"), ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 0"), ps.Notice("WARNING", "01000", "stale write"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + write, "probe " + probeSQL + ": 1, t", "Parse: " + write, "probe " + probeSQL + ": stale, f"},
		},
		{
			// A probe among a simple Query's statements: its replies are
			// kept from the client, its row handed to the probe.
			name: "probe in a simple Query",
			script: func(x *scriptEnv) []ps.Step {
				p := x.ic.probe(probeSQL, nil)
				x.ic.query[simpleSQL] = proxy.Plan{SQL: simpleRW + "; " + probeSQL, Probes: []proxy.ProbeAt{{Index: 1, Probe: p}}}
				return []ps.Step{
					ps.ClientSends(ps.Query(simpleSQL)),
					ps.BackendGets(ps.Query(simpleRW + "; " + probeSQL)),
					ps.BackendSends(ps.Complete("UPDATE 1"), ps.Columns("a", "b"), ps.Row("1", "t"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Query: " + simpleSQL, "probe " + probeSQL + ": 1, t"},
		},
		{
			// Plan.Reuse: the first Parse prepares the rewrite under the
			// proxy's own name (closing the server's unnamed statement,
			// which a Parse would have replaced); later Parses of the text
			// are answered with the stand-in, and Binds and Describes of
			// the unnamed statement go to the prepared one. The client
			// sees what it would without the proxy.
			name: "statement reuse",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Reuse: true}
				return []ps.Step{
					ps.ClientSends(ps.Parse(write, 25, 20), ps.Bind("", "a", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused1, fenced, 25, 20), ps.Bind(reused1, "a", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.CloseComplete, ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),

					ps.ClientSends(ps.Parse(write, 25, 20), ps.Bind("", "b", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(standIn, ps.Bind(reused1, "b", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),

					// Described, as pgx does to learn the parameter types.
					ps.ClientSends(ps.Parse(write, 25, 20), ps.DescribeStatement(""), ps.Sync),
					ps.BackendGets(standIn, ps.DescribeStatement(reused1), ps.Sync),
					ps.BackendSends(ps.ParseComplete, described, ps.NoData, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, described, ps.NoData, ps.Ready(ps.Idle)),

					// The same text with other parameter types is another
					// statement.
					ps.ClientSends(ps.Parse(write), ps.DescribeStatement(""), ps.Sync),
					ps.BackendGets(ps.CloseStatement(""), ps.ParseNamed(reused2, fenced), ps.DescribeStatement(reused2), ps.Sync),
					ps.BackendSends(ps.CloseComplete, ps.ParseComplete, described, ps.NoData, ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, described, ps.NoData, ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: " + write, "Parse: " + write, "Parse: " + write, "Parse: " + write},
		},
		{
			// Without a stand-in to answer a reused Parse with, the proxy
			// writes none of its own: each Parse of the unnamed statement
			// goes to the server as planned, and its Binds with it.
			name:   "statement reuse off without StandInSQL",
			config: func(c *proxy.Config) { c.StandInSQL = "" },
			script: func(x *scriptEnv) []ps.Step {
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Reuse: true}
				var steps []ps.Step
				for _, v := range []string{"a", "b"} {
					steps = append(steps,
						ps.ClientSends(ps.Parse(write, 25, 20), ps.Bind("", v, "1"), ps.Execute(""), ps.Sync),
						ps.BackendGets(ps.Parse(fenced, 25, 20), ps.Bind("", v, "1"), ps.Execute(""), ps.Sync),
						ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
						ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)))
				}
				return steps
			},
			calls: []string{"Parse: " + write, "Parse: " + write},
		},
		{
			// A bound Query runs as Parse (once), Bind, Execute and Sync of
			// the proxy's; the client sees only what a Query gets.
			name: "bound simple Query",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.query[simpleSQL] = boundPlan("x", "1")
				return []ps.Step{
					ps.ClientSends(ps.Query(simpleSQL)),
					ps.BackendGets(ps.ParseNamed(reused1, boundSQL, 25, 20), ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					// Prepared: bound at once.
					ps.ClientSends(ps.Query(simpleSQL)),
					ps.BackendGets(ps.Bind(reused1, "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Query: " + simpleSQL, "Query: " + simpleSQL},
		},
		{
			// A SET the Interceptor vouches for is answered at once; the
			// proxy sets it with its own statement, with a Sync of its own,
			// ahead of the next statement, which waits for it.
			name:   "answered SET",
			relays: onLoop,
			script: func(x *scriptEnv) []ps.Step {
				x.ic.query[tokenSet] = setPlan(tokenName, tokenValue, false)
				return []ps.Step{
					ps.ClientSends(ps.Query(tokenSet)),
					ps.ClientGets(ps.Complete("SET"), ps.Ready(ps.Idle)),
					ps.BackendQuiet(),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Front(setPrepare, setRun(tokenName, tokenValue, false), ps.Sync)...),
					ps.BackendQuiet(), // the Query waits for the setting
					ps.BackendSends(ps.Back(setPrepared, setRan(tokenValue), ps.Ready(ps.Idle))...),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
					// Kept: the next statement goes alone.
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				}
			},
			calls: []string{"Query: " + tokenSet, "SettingAnswered: fence.token = 7", "Query: SELECT 1", "Query: SELECT 1"},
		},
		{
			// The goroutine relay answers no SET; nor does the event loop
			// with Config.ForwardSettings.
			name:   "SET forwarded on the goroutine relay",
			relays: onGoroutines,
			script: forwardedSet,
			calls:  []string{"Query: " + tokenSet},
		},
		{
			name:   "SET forwarded with ForwardSettings",
			config: func(c *proxy.Config) { c.ForwardSettings = true },
			script: forwardedSet,
			calls:  []string{"Query: " + tokenSet},
		},
		{
			// Without the statement that would run it, a SET cannot be
			// answered: the proxy writes no SQL of its own.
			name:   "SET forwarded without SettingSQL",
			config: func(c *proxy.Config) { c.SettingSQL = "" },
			script: forwardedSet,
			calls:  []string{"Query: " + tokenSet},
		},
		{
			// An error skips the rest of the batch to its Sync, as Postgres
			// does: the proxy expects no reply to the messages after it,
			// the probe's included, and the next batch is answered as its
			// own. The probe, never prepared, is prepared again.
			name: "error in the middle of a pipeline",
			script: func(x *scriptEnv) []ps.Step {
				p := x.ic.probe(probeSQL, nil)
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Probes: []proxy.ProbeAt{{Probe: p}}}
				return []ps.Step{
					ps.ClientSends(
						ps.Parse("SELECT 1/0"), ps.Bind(""), ps.Execute(""),
						ps.Parse(write), ps.Bind("", "x", "1"), ps.Execute(""), ps.Sync,
						ps.Parse("SELECT 2"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(
						ps.Parse("SELECT 1/0"), ps.Bind(""), ps.Execute(""),
						ps.Parse(fenced), ps.Bind("", "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync,
						ps.Parse("SELECT 2"), ps.Bind(""), ps.Execute(""), ps.Sync)...),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Error("22012", "division by zero"), ps.Ready(ps.Idle),
						ps.ParseComplete, ps.BindComplete, ps.Row("2"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Error("22012", "division by zero"), ps.Ready(ps.Idle),
						ps.ParseComplete, ps.BindComplete, ps.Row("2"), ps.Complete("SELECT 1"), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Parse(write), ps.Bind("", "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(ps.Parse(fenced), ps.Bind("", "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.Back(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), probePrepared, probeRan("1"), ps.Ready(ps.Idle))...),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Parse: SELECT 1/0", "Parse: " + write, "Parse: SELECT 2", "Error: 22012 division by zero",
				"Parse: " + write, "probe " + probeSQL + ": 1"},
		},
		{
			// The probe itself fails (its write failed after all, say): the
			// client gets the error, and the session goes on.
			name: "error in a probe",
			script: func(x *scriptEnv) []ps.Step {
				p := x.ic.probe(probeSQL, nil)
				x.ic.parse[write] = proxy.Plan{SQL: fenced, Probes: []proxy.ProbeAt{{Probe: p}}}
				return []ps.Step{
					ps.ClientSends(ps.Parse(write), ps.Bind("", "x", "1"), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Front(ps.Parse(fenced), ps.Bind("", "x", "1"), ps.Execute(""), probePrepare(probeSQL), probeRun, ps.Sync)...),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.CloseComplete, ps.Error("42P01", "relation does not exist"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, ps.Complete("UPDATE 1"), ps.Error("42P01", "relation does not exist"), ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Query("SELECT 1")),
					ps.BackendGets(ps.Query("SELECT 1")),
					ps.BackendSends(selectOne...),
					ps.ClientGets(selectOne...),
				}
			},
			calls: []string{"Parse: " + write, "Error: 42P01 relation does not exist", "Query: SELECT 1"},
		},
		{
			// Interceptor.Error's replacement reaches the client in place
			// of the server's error, in both protocols; Notice keeps what
			// it says from the client.
			name: "error replaced and notice kept back",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.replace["P0001"] = &pgproto3.ErrorResponse{Severity: "ERROR", Code: "40001", Message: "pgfence: replaced", Hint: "retry"}
				x.ic.hide["hidden"] = true
				return []ps.Step{
					ps.ClientSends(ps.Query("SELECT boom()")),
					ps.BackendGets(ps.Query("SELECT boom()")),
					ps.BackendSends(ps.Notice("NOTICE", "00000", "hidden"), ps.Notice("NOTICE", "00000", "shown"), ps.Error("P0001", "boom"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Notice("NOTICE", "00000", "shown"), &pgproto3.ErrorResponse{Severity: "ERROR", Code: "40001", Message: "pgfence: replaced", Hint: "retry"}, ps.Ready(ps.Idle)),
					ps.ClientSends(ps.Parse("SELECT boom()"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendGets(ps.Parse("SELECT boom()"), ps.Bind(""), ps.Execute(""), ps.Sync),
					ps.BackendSends(ps.ParseComplete, ps.BindComplete, ps.Error("P0001", "boom"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.ParseComplete, ps.BindComplete, &pgproto3.ErrorResponse{Severity: "ERROR", Code: "40001", Message: "pgfence: replaced", Hint: "retry"}, ps.Ready(ps.Idle)),
					// Other errors pass as they are.
					ps.ClientSends(ps.Query("SELECT 1/0")),
					ps.BackendGets(ps.Query("SELECT 1/0")),
					ps.BackendSends(ps.Error("22012", "division by zero"), ps.Ready(ps.Idle)),
					ps.ClientGets(ps.Error("22012", "division by zero"), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Query: SELECT boom()", "Notice: hidden", "Notice: shown", "Error: P0001 boom",
				"Parse: SELECT boom()", "Error: P0001 boom", "Query: SELECT 1/0", "Error: 22012 division by zero"},
		},
		{
			// Plan.Origin maps an error's position in the rewrite to the
			// client's text.
			name: "error position mapped to the client's text",
			script: func(x *scriptEnv) []ps.Step {
				x.ic.query["SELECT nosuch"] = proxy.Plan{SQL: "/* x */ SELECT nosuch", Origin: shift(-8)}
				at := func(pos int32) *pgproto3.ErrorResponse {
					e := ps.Error("42703", `column "nosuch" does not exist`)
					e.Position = pos
					return e
				}
				return []ps.Step{
					ps.ClientSends(ps.Query("SELECT nosuch")),
					ps.BackendGets(ps.Query("/* x */ SELECT nosuch")),
					ps.BackendSends(at(16), ps.Ready(ps.Idle)),
					ps.ClientGets(at(8), ps.Ready(ps.Idle)),
				}
			},
			calls: []string{"Query: SELECT nosuch", `Error: 42703 column "nosuch" does not exist`},
		},
		{
			// A message whose length cannot be ends that session alone,
			// with an error that says why; another session, in the middle
			// of a transaction, goes on.
			name: "malformed client message",
			ends: true,
			script: func(x *scriptEnv) []ps.Step {
				var c2 *ps.Client
				var b2 *ps.Backend
				return []ps.Step{
					ps.Do(func(t testing.TB) {
						c2, b2 = ps.Connect(t, x.pg, x.addr)
						ps.Play(t, c2, b2,
							ps.ClientSends(ps.Query("BEGIN")),
							ps.BackendGets(ps.Query("BEGIN")),
							ps.BackendSends(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)),
							ps.ClientGets(ps.Complete("BEGIN"), ps.Ready(ps.InBlock)))
					}),
					ps.ClientSendsBytes([]byte{'Q', 0, 0, 0, 3}),
					ps.ClientGets(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "08P01",
						Message: "pgfence: malformed message: message 'Q' has length 3, the minimum is 4",
						Hint:    "the connection was closed by pgfence; other sessions are not affected"}),
					ps.ClientClosed(),
					ps.BackendClosed(),
					ps.Do(func(t testing.TB) {
						if err := sessionEnd(t, x.ic); err == nil || !strings.Contains(err.Error(), "malformed message") {
							t.Errorf("the Interceptor was told the session ended with %v, want the malformed message", err)
						}
						ps.Play(t, c2, b2,
							ps.ClientSends(ps.Query("COMMIT")),
							ps.BackendGets(ps.Query("COMMIT")),
							ps.BackendSends(ps.Complete("COMMIT"), ps.Ready(ps.Idle)),
							ps.ClientGets(ps.Complete("COMMIT"), ps.Ready(ps.Idle)))
					}),
				}
			},
			calls: []string{"Query: BEGIN", "Query: COMMIT"},
		},
		{
			// A client that goes away in the middle of a query: the proxy
			// cancels it with the backend's key, so that the backend does
			// not run on for nobody, then closes the connection.
			name: "client gone mid-query",
			ends: true,
			script: func(x *scriptEnv) []ps.Step {
				return []ps.Step{
					ps.ClientSends(ps.Query("SELECT pg_sleep(60)")),
					ps.BackendGets(ps.Query("SELECT pg_sleep(60)")),
					ps.Do(func(testing.TB) { x.c.Conn().Close() }),
					ps.BackendClosed(),
					ps.Do(func(t testing.TB) {
						want := append(binary.BigEndian.AppendUint32(nil, x.b.PID), ps.SecretKey...)
						if got := x.pg.Cancels(); len(got) != 1 || !bytes.Equal(got[0], want) {
							t.Errorf("cancel requests: %x, want one with the backend's key %x", got, want)
						}
					}),
				}
			},
			calls: []string{"Query: SELECT pg_sleep(60)"},
		},
		{
			// One over Config.MaxMessageSize too, with the hint the
			// program built on the proxy words (Config.Hints).
			name: "client message over the size limit",
			ends: true,
			config: func(c *proxy.Config) {
				c.MaxMessageSize = 4096
				c.Hints.MessageTooLarge = "send less (scripted)"
			},
			script: func(x *scriptEnv) []ps.Step {
				return []ps.Step{
					ps.ClientSendsBytes([]byte{'Q', 0, 0, 0x20, 0x04}),
					ps.ClientGets(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "08P01",
						Message: "pgfence: malformed message: message 'Q' of 8192 bytes is over the 4096-byte limit: too large",
						Hint:    "send less (scripted)"}),
					ps.ClientClosed(),
					ps.BackendClosed(),
				}
			},
		},
	})
}

// forwardedSet is a SET that reaches the server as the client sent it.
func forwardedSet(x *scriptEnv) []ps.Step {
	x.ic.query[tokenSet] = setPlan(tokenName, tokenValue, false)
	return []ps.Step{
		ps.ClientSends(ps.Query(tokenSet)),
		ps.BackendGets(ps.Query(tokenSet)),
		ps.BackendSends(ps.Complete("SET"), ps.Ready(ps.Idle)),
		ps.ClientGets(ps.Complete("SET"), ps.Ready(ps.Idle)),
	}
}
