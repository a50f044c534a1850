package proxy_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	ps "github.com/pgfence/pgfence/internal/pgscript"
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
					ps.BackendSends(ps.Back(noRowsDescribed, ps.Ready('I'))...),
					ps.ClientGets(ps.Back(noRowsDescribed, ps.Ready('I'))...),
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
					ps.BackendSends(ps.Ready('I')),
					ps.ClientGets(ps.Ready('I')),
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
				created := []pgproto3.BackendMessage{ps.Complete("CREATE TABLE"), ps.Ready('I')}
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
