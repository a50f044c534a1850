package proxy

import (
	"fmt"
)

// A Query or Parse is read whole, planned by the Interceptor, seen by each
// part of the session in turn (see session.query and session.parse), and
// then sent as its plan says: these are the reading and the sending.

// readQuery reads the client's Query (n bytes) from cr, returning the
// message m and its text, which share cr's buffer or buf (see message).
func readQuery(cr msgReader, buf *[]byte, n int) (m, text []byte, err error) {
	if m, err = message(cr, n, buf); err != nil {
		return nil, nil, err
	}
	if text, _, err = cstring(m[5:]); err != nil {
		return nil, nil, &clientError{err: fmt.Errorf("a Query message: %w", err)}
	}
	return m, text, nil
}

// readParse reads the client's Parse (n bytes) from cr, returning the
// message m, the statement's name, its text and its parameter-type
// section, all sharing cr's buffer or buf (see message).
func readParse(cr msgReader, buf *[]byte, n int) (m, name, text, params []byte, err error) {
	if m, err = message(cr, n, buf); err != nil {
		return nil, nil, nil, nil, err
	}
	name, rest, err := cstring(m[5:])
	if err != nil {
		return nil, nil, nil, nil, &clientError{err: fmt.Errorf("a Parse message: %w", err)}
	}
	if text, params, err = cstring(rest); err != nil {
		return nil, nil, nil, nil, &clientError{err: fmt.Errorf("a Parse message: %w", err)}
	}
	return m, name, text, params, nil
}

// sendQuery sends the client's Query m as plan says: the message itself
// for no SQL, else one of plan.SQL. changes says a text in the unit of
// work it ends may have changed a setting (see wait.changes).
func (l *link) sendQuery(m []byte, plan *Plan, changes bool) error {
	if len(plan.Probes) > 0 || plan.SQL != "" && plan.Origin != nil || changes {
		w := l.pipe.get(waitQuery)
		w.probes, w.origin, w.changes = plan.Probes, plan.Origin, changes
		l.pipe.push(w)
	} else {
		l.pipe.push(queryWait)
	}
	if plan.SQL == "" {
		_, err := l.sw.Write(m)
		return err
	}
	l.out = append(append(l.out[:0], plan.SQL...), 0)
	return writeMessage(l.sw, clientMsgQuery, l.out)
}

// sendParse sends the client's Parse m of name, with the parameter-type
// section params, as plan says, answered by w: the message itself for no
// SQL, else a Parse of plan.SQL.
func (l *link) sendParse(m, name, params []byte, plan *Plan, w *wait) error {
	l.pipe.push(w)
	if plan.SQL == "" {
		_, err := l.sw.Write(m)
		return err
	}
	l.out = append(l.out[:0], name...)
	l.out = append(l.out, 0)
	l.out = append(l.out, plan.SQL...)
	l.out = append(l.out, 0)
	l.out = append(l.out, params...)
	return writeMessage(l.sw, clientMsgParse, l.out)
}

// syncMessage is a Sync.
var syncMessage = []byte{byte(clientMsgSync), 0, 0, 0, 4}
