package proxy

import (
	"bytes"
	"encoding/binary"
)

// The client's Bind, Execute, Close and Describe, decoded in place, as
// pgproto3's backend decodes them: each decoder splits a body into fields
// that are slices of it, so decoding copies and allocates nothing, and the
// fields are valid as long as the body (for a peek, until the next read
// from the reader). A handler decodes a message once, and only when what
// it tracks needs a field: a message forwarded untouched is not decoded.
//
// A body may be only the first peekLimit bytes of a long message (see
// session.peek). The decoders find the names the proxy tracks and are
// lenient about what follows them, as the handlers always were: the exact
// checks are the methods that say so (exact), used where the proxy
// answers or rewrites a message rather than forwarding it. Postgres
// checks the rest and refuses a malformed message.

// peekLimit is how much of a Bind, Execute or Close the proxy looks at to find
// the statement and portal names before forwarding the bytes untouched.
const peekLimit = 1024

// bindMsg is a Bind.
type bindMsg struct {
	portal []byte // the destination portal ("" the unnamed one)
	stmt   []byte // the prepared statement it binds ("" the unnamed one)
	// rest is what follows the names: parameter formats, values and result
	// formats, as far as the body goes.
	rest []byte
}

// decodeBind decodes the names at the front of b, a Bind's body or its
// first bytes. ok is false unless both are whole in b; m then has the
// portal's name if that is (Postgres limits names to 63 bytes, so it
// refuses a Bind whose names are longer than peekLimit).
func decodeBind(b []byte) (m bindMsg, ok bool) {
	portal, rest, err := cstring(b)
	if err != nil {
		return bindMsg{}, false
	}
	m.portal = portal
	if m.stmt, m.rest, err = cstring(rest); err != nil {
		return m, false
	}
	return m, true
}

// noParams reports whether the Bind, its body whole, binds no parameter
// values.
func (m bindMsg) noParams() bool {
	b := m.rest
	if len(b) < 2 {
		return false
	}
	k := 2 + 2*int(binary.BigEndian.Uint16(b))
	return len(b) >= k+2 && binary.BigEndian.Uint16(b[k:]) == 0
}

// executeMsg is an Execute.
type executeMsg struct {
	portal []byte // the portal it runs
	rest   []byte // what follows the name: the row limit, 4 bytes
}

// decodeExecute decodes an Execute's body b (or its first bytes); ok is
// false unless the portal's name is whole in b.
func decodeExecute(b []byte) (m executeMsg, ok bool) {
	portal, rest, err := cstring(b)
	if err != nil {
		return executeMsg{}, false
	}
	return executeMsg{portal: portal, rest: rest}, true
}

// exact reports whether the body held the portal's name, the row limit
// and nothing else.
func (m executeMsg) exact() bool { return len(m.rest) == 4 }

// runs reports whether the Execute runs the portal named portal.
func (m executeMsg) runs(portal []byte) bool { return bytes.Equal(m.portal, portal) }

// describeMsg is a Describe.
type describeMsg struct {
	target target // a statement's description, or a portal's
	name   []byte // the statement's or portal's name
	rest   []byte // what follows the name: nothing, in a well-formed one
}

// decodeDescribe decodes a Describe's body b (or its first bytes); ok is
// false unless the target and the name are whole in b.
func decodeDescribe(b []byte) (m describeMsg, ok bool) {
	t, name, rest, ok := decodeTargeted(b)
	return describeMsg{t, name, rest}, ok
}

// exact reports whether the body held the target and name and nothing
// else.
func (m describeMsg) exact() bool { return len(m.rest) == 0 }

// unnamed reports whether the Describe is of the unnamed statement or
// portal, as t says.
func (m describeMsg) unnamed(t target) bool { return m.target == t && len(m.name) == 0 }

// closeMsg is a Close.
type closeMsg struct {
	target target // a statement, or a portal
	name   []byte // the statement's or portal's name
	rest   []byte // what follows the name: nothing, in a well-formed one
}

// decodeClose decodes a Close's body b (or its first bytes); ok is false
// unless the target and the name are whole in b.
func decodeClose(b []byte) (m closeMsg, ok bool) {
	t, name, rest, ok := decodeTargeted(b)
	return closeMsg{t, name, rest}, ok
}

// exact reports whether the body held the target and name and nothing
// else: Postgres refuses a Close with more, and keeps what it named.
func (m closeMsg) exact() bool { return len(m.rest) == 0 }

// decodeTargeted decodes the body of a Describe or Close: a target and a
// name.
func decodeTargeted(b []byte) (t target, name, rest []byte, ok bool) {
	if len(b) < 2 {
		return 0, nil, nil, false
	}
	name, rest, err := cstring(b[1:])
	if err != nil {
		return 0, nil, nil, false
	}
	return target(b[0]), name, rest, true
}

// clientFrame is the client message being handled: its header, and for a
// Bind its names, decoded at most once however many parts look at them
// (the hold check, the answered SET, the deferred settings, the handler)
// and only when one does. It is made anew for each message, and whenever
// a message held back is taken up again: what it decoded points into the
// reader's buffer, valid until the next read from it.
type clientFrame struct {
	typ clientMsg
	n   int
	// bind is a Bind's names (see decodeBind) once decoded, describe a
	// Describe's; ok says they were whole.
	bind        bindMsg
	describe    describeMsg
	ok, decoded bool
}

// decodedBind returns the Bind's names (ok: whole, see decodeBind),
// decoding them from the front of cr the first time it is asked.
func (f *clientFrame) decodedBind(cr msgReader) (m bindMsg, ok bool, err error) {
	if !f.decoded {
		b, err := cr.Peek(5 + min(f.n, peekLimit))
		if err != nil {
			return bindMsg{}, false, err
		}
		f.bind, f.ok = decodeBind(b[5:])
		f.decoded = true
	}
	return f.bind, f.ok, nil
}

// decodedDescribe returns the Describe's target and name (ok: whole, see
// decodeDescribe), decoding them from the front of cr the first time it
// is asked.
func (f *clientFrame) decodedDescribe(cr msgReader) (m describeMsg, ok bool, err error) {
	if !f.decoded {
		b, err := peekBody(cr, f.n)
		if err != nil {
			return describeMsg{}, false, err
		}
		f.describe, f.ok = decodeDescribe(b)
		f.decoded = true
	}
	return f.describe, f.ok, nil
}
