package pgscript

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/poll"
)

// failing is a testing.TB whose Fatalf ends the script being played (by a
// panic that catch recovers) and keeps what it said.
type failing struct {
	testing.TB
	msg string
}

func (f *failing) Helper() {}

func (f *failing) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func (f *failing) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(f)
}

// catch plays steps with a failing TB and returns what made them fail, ""
// if nothing did.
func catch(t *testing.T, c *Client, b *Backend, steps ...Step) (msg string) {
	t.Helper()
	f := &failing{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if r != f {
				panic(r)
			}
			msg = f.msg
		}
	}()
	Play(f, c, b, steps...)
	return ""
}

func TestPlaceholders(t *testing.T) {
	v := Vars{}
	want := render(&pgproto3.Parse{Name: "pgfence.s.{tag}.1", Query: "q"})
	if !v.match(want, render(&pgproto3.Parse{Name: "pgfence.s.abc123.7.1", Query: "q"})) || v["tag"] != "abc123.7" {
		t.Fatalf("first match: %v", v)
	}
	// Bound: the same name matches, another does not.
	again := render(&pgproto3.Bind{PreparedStatement: "pgfence.s.{tag}.1"})
	if !v.match(again, render(&pgproto3.Bind{PreparedStatement: "pgfence.s.abc123.7.1"})) {
		t.Fatal("the bound tag does not match itself")
	}
	if v.match(again, render(&pgproto3.Bind{PreparedStatement: "pgfence.s.abc123.8.1"})) {
		t.Fatal("the bound tag matched another")
	}
	// Placeholders are for names only: elsewhere braces are themselves.
	q := render(&pgproto3.Query{String: "SELECT '{tag}'"})
	if v.match(q, render(&pgproto3.Query{String: "SELECT 'abc123.7'"})) || !v.match(q, render(&pgproto3.Query{String: "SELECT '{tag}'"})) {
		t.Fatal("a placeholder in a query text")
	}
	// A message that does not match binds nothing.
	v2 := Vars{}
	if v2.match(render(&pgproto3.Parse{Name: "{x}", Query: "a"}), render(&pgproto3.Parse{Name: "n", Query: "b"})) || len(v2) != 0 {
		t.Fatalf("a mismatch bound %v", v2)
	}
	// Empty and nil lists are the same.
	if !v.match(render(&pgproto3.Bind{}), render(&pgproto3.Bind{Parameters: [][]byte{}})) {
		t.Fatal("nil and empty parameters differ")
	}
	if v.match(render(Row("a")), render(&pgproto3.DataRow{Values: [][]byte{nil}})) {
		t.Fatal("NULL matched a value")
	}
}

// A conversation straight between a Client and a Backend, and the ways a
// script fails.
func TestPlay(t *testing.T) {
	s := Listen(t)
	c, b := Connect(t, s, s.Addr())
	Play(t, c, b,
		ClientSends(Parse("SELECT $1", 25), Bind("", "x"), Execute(""), Sync),
		BackendGets(Parse("SELECT $1", 25), Bind("", "x"), Execute(""), Sync),
		BackendQuiet(),
		BackendSends(ParseComplete, BindComplete, Row("x"), Complete("SELECT 1"), Ready(Idle)),
		ClientGets(ParseComplete, BindComplete, Row("x"), Complete("SELECT 1"), Ready(Idle)),
		ClientQuiet(),
	)

	// A message other than the one expected: the report shows both lists,
	// marks the first that differs and says where the step was made.
	msg := catch(t, c, b,
		ClientSends(Query("SELECT 2"), Query("SELECT 3")),
		BackendGets(Query("SELECT 2"), Query("SELECT 4")),
	)
	for _, want := range []string{"step 2 (proxy → backend, pgscript_test.go:", "message 2 of 2", "want:", `> Query "SELECT 4"`, "got:", `> Query "SELECT 3"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("the report lacks %q:\n%s", want, msg)
		}
	}

	// Fewer messages than expected: the report says so after Timeout.
	old := Timeout
	Timeout = 200 * time.Millisecond
	defer func() { Timeout = old }()
	msg = catch(t, c, b, BackendSends(Ready(Idle)), ClientGets(Ready(Idle), Ready(Idle)))
	if !strings.Contains(msg, "after 1 of 2 messages: nothing more arrived") {
		t.Errorf("report: %s", msg)
	}

	// Something where nothing should come.
	msg = catch(t, c, b, BackendSends(Ready(Idle)), ClientQuiet())
	if !strings.Contains(msg, "want nothing") || !strings.Contains(msg, "ReadyForQuery I") {
		t.Errorf("report: %s", msg)
	}

	// A connection that stays open where it should close, and one that
	// closes.
	if msg := catch(t, c, b, ClientClosed()); !strings.Contains(msg, "still open") {
		t.Errorf("report: %s", msg)
	}
	c.Conn().Close()
	if msg := catch(t, c, b, BackendClosed()); msg != "" {
		t.Errorf("the client's close went unseen: %s", msg)
	}
}

// The Server takes cancel requests apart from sessions.
func TestCancelRequests(t *testing.T) {
	s := Listen(t)
	_, b := Connect(t, s, s.Addr())
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req, _ := (&pgproto3.CancelRequest{ProcessID: b.PID, SecretKey: SecretKey}).Encode(nil)
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	poll.Eventually(t, Timeout, "a cancel request", func() bool {
		got = append(got, s.Cancels()...)
		return len(got) > 0
	})
	want := append(binary.BigEndian.AppendUint32(nil, b.PID), SecretKey...)
	if len(got) != 1 || !bytes.Equal(got[0], want) {
		t.Fatalf("cancel requests: %x, want %x", got, want)
	}
}
