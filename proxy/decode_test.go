package proxy

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// bodyOf encodes m and returns its body, the bytes after the header.
func bodyOf(t *testing.T, m pgproto3.FrontendMessage) []byte {
	t.Helper()
	b, err := m.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b[5:]
}

func TestDecodeBind(t *testing.T) {
	for _, c := range []struct {
		name           string
		body           []byte
		ok             bool
		portal, stmt   string
		noParams       bool
		portalOnFailed bool // m.portal is set although ok is false
	}{
		{name: "unnamed", body: bodyOf(t, &pgproto3.Bind{}), ok: true, noParams: true},
		{name: "named", body: bodyOf(t, &pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "s1"}), ok: true, portal: "p", stmt: "s1", noParams: true},
		{name: "values", body: bodyOf(t, &pgproto3.Bind{PreparedStatement: "s", Parameters: [][]byte{[]byte("1")}}), ok: true, stmt: "s"},
		{name: "formats, no values", body: bodyOf(t, &pgproto3.Bind{ParameterFormatCodes: []int16{1}, ResultFormatCodes: []int16{1}}), ok: true, noParams: true},
		{name: "statement cut off", body: []byte("p\x00s1"), portal: "p", portalOnFailed: true},
		{name: "portal cut off", body: []byte("p")},
		{name: "empty", body: nil},
		{name: "names only", body: []byte("\x00s\x00"), ok: true, stmt: "s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, ok := decodeBind(c.body)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if ok || c.portalOnFailed {
				if string(m.portal) != c.portal {
					t.Errorf("portal = %q, want %q", m.portal, c.portal)
				}
			}
			if !ok {
				return
			}
			if string(m.stmt) != c.stmt {
				t.Errorf("statement = %q, want %q", m.stmt, c.stmt)
			}
			if m.noParams() != c.noParams {
				t.Errorf("noParams = %v, want %v", m.noParams(), c.noParams)
			}
		})
	}
}

func TestDecodeExecute(t *testing.T) {
	for _, c := range []struct {
		name      string
		body      []byte
		ok, exact bool
		portal    string
	}{
		{name: "unnamed", body: bodyOf(t, &pgproto3.Execute{}), ok: true, exact: true},
		{name: "named, row limit", body: bodyOf(t, &pgproto3.Execute{Portal: "p", MaxRows: 10}), ok: true, exact: true, portal: "p"},
		{name: "no row limit", body: []byte("p\x00"), ok: true, portal: "p"},
		{name: "bytes after", body: []byte("p\x00\x00\x00\x00\x00\x00"), ok: true, portal: "p"},
		{name: "cut off", body: []byte("p")},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, ok := decodeExecute(c.body)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if string(m.portal) != c.portal || !m.runs([]byte(c.portal)) || m.runs([]byte(c.portal+"x")) {
				t.Errorf("portal = %q, want %q", m.portal, c.portal)
			}
			if m.exact() != c.exact {
				t.Errorf("exact = %v, want %v", m.exact(), c.exact)
			}
		})
	}
}

func TestDecodeDescribeClose(t *testing.T) {
	for _, c := range []struct {
		name      string
		body      []byte
		ok, exact bool
		target    target
		obj       string
	}{
		{name: "unnamed statement", body: bodyOf(t, &pgproto3.Describe{ObjectType: 'S'}), ok: true, exact: true, target: targetStatement},
		{name: "named portal", body: bodyOf(t, &pgproto3.Describe{ObjectType: 'P', Name: "p"}), ok: true, exact: true, target: targetPortal, obj: "p"},
		{name: "bytes after", body: []byte("Ss\x00x"), ok: true, target: targetStatement, obj: "s"},
		{name: "name cut off", body: []byte("Ss")},
		{name: "target only", body: []byte("S")},
		{name: "empty", body: nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, ok := decodeDescribe(c.body)
			cl, clOK := decodeClose(c.body)
			if ok != c.ok || clOK != c.ok {
				t.Fatalf("ok = %v (Describe), %v (Close), want %v", ok, clOK, c.ok)
			}
			if !ok {
				return
			}
			if d.target != c.target || string(d.name) != c.obj || cl.target != c.target || string(cl.name) != c.obj {
				t.Errorf("Describe %q %q, Close %q %q, want %q %q", d.target, d.name, cl.target, cl.name, c.target, c.obj)
			}
			if d.exact() != c.exact || cl.exact() != c.exact {
				t.Errorf("exact = %v (Describe), %v (Close), want %v", d.exact(), cl.exact(), c.exact)
			}
			if want := c.obj == ""; d.unnamed(c.target) != want || d.unnamed(c.target^targetStatement^targetPortal) {
				t.Errorf("unnamed(%q) = %v, want %v", c.target, d.unnamed(c.target), want)
			}
		})
	}
}

// TestDecodeAllocations: the decoders are flyweights over the body.
func TestDecodeAllocations(t *testing.T) {
	bind := bodyOf(t, &pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "s", Parameters: [][]byte{[]byte("1")}})
	exec := bodyOf(t, &pgproto3.Execute{Portal: "p"})
	desc := bodyOf(t, &pgproto3.Describe{ObjectType: 'P', Name: "p"})
	var sink int
	n := testing.AllocsPerRun(100, func() {
		b, _ := decodeBind(bind)
		e, _ := decodeExecute(exec)
		d, _ := decodeDescribe(desc)
		c, _ := decodeClose(desc)
		if b.noParams() && e.exact() && d.exact() {
			sink++
		}
		sink += len(b.stmt) + len(e.portal) + len(d.name) + len(c.name)
	})
	if n != 0 {
		t.Errorf("decoding allocates %v times, want 0", n)
	}
	_ = sink
}

// peekCounter counts the Peeks of the reader it wraps.
type peekCounter struct {
	msgReader
	peeks int
}

func (p *peekCounter) Peek(n int) ([]byte, error) {
	p.peeks++
	return p.msgReader.Peek(n)
}

// A Describe is decoded once for the hold check (stmtBook.replanText) and
// the book's handler (onDescribe), which both look at it.
func TestDescribeDecodedOnce(t *testing.T) {
	msg, err := (&pgproto3.Describe{ObjectType: 'S'}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	cr := &peekCounter{msgReader: bufio.NewReader(bytes.NewReader(msg))}
	f := clientFrame{typ: clientMsgDescribe, n: len(msg) - 5}
	b := stmtBook{stmts: map[string]*prepared{"": {text: "select 1", gen: 1}}}
	if text, ok := b.replanText(cr, &f, 2); !ok || text != "select 1" {
		t.Fatalf("replanText = %q, %v; want the unnamed statement's text, planned under an older generation", text, ok)
	}
	m, ok, err := f.decodedDescribe(cr)
	if err != nil || !ok || !m.unnamed(targetStatement) {
		t.Fatalf("decodedDescribe = %+v, %v, %v; want the unnamed statement", m, ok, err)
	}
	if cr.peeks != 1 {
		t.Errorf("the Describe was read %d times; want once", cr.peeks)
	}
}
