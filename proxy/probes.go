package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"
)

// probeState is what a session keeps of its probes (see Plan.Probes).
//
// ready says, by probe, whether the session's backend has the probe's
// statement. The map is the client side's, which prepares a probe's
// statement ahead of its run while its flag is false; the flags are set by
// the server side once Postgres confirms the prepare, and cleared by
// either side when the statement may be gone (the probe failed, or see
// forgetState).
//
// row and rowBuf hold the last probe row captured, the server side's: a
// probe's row is handed to its ProbeFunc before the next one arrives, so
// one pair of buffers serves them all.
type probeState struct {
	ready  map[*Probe]*atomic.Bool
	row    [][]byte
	rowBuf []byte
}

// readyFlag returns p's flag in ready, made the first time p runs.
func (ps *probeState) readyFlag(p *Probe) *atomic.Bool {
	if ps.ready == nil {
		ps.ready = make(map[*Probe]*atomic.Bool)
	}
	ready := ps.ready[p]
	if ready == nil {
		ready = new(atomic.Bool)
		ps.ready[p] = ready
	}
	return ready
}

// forget makes every probe prepare its statement again before its next
// run.
func (ps *probeState) forget() {
	for _, ready := range ps.ready {
		ready.Store(false)
	}
}

// capture decodes b, a probe's DataRow, into the state's buffers and
// returns its values, valid until the next capture.
func (ps *probeState) capture(b []byte) ([][]byte, error) {
	ps.rowBuf = append(ps.rowBuf[:0], b...)
	row, err := decodeRow(ps.rowBuf, ps.row[:0])
	if err != nil {
		return nil, err
	}
	ps.row = row
	return row, nil
}

// inject runs p through l, preparing its statement first unless the
// backend is known to have it and nothing since may have deallocated it
// (lost, see forgetState: Postgres may have confirmed the prepare after
// the text that did was planned). pooled says a transaction pooler is
// behind the proxy: the statement is prepared in each transaction, and
// closed once bound.
func (ps *probeState) inject(l *link, p *Probe, lost, pooled bool) error {
	ready := ps.readyFlag(p)
	w := l.pipe.get(waitProbe)
	w.probe, w.want, w.ready = p, probeRunReplies, ready
	if !ready.Load() || lost || pooled {
		w.want += probePrepareReplies
		if _, err := l.sw.Write(p.prepare); err != nil {
			return err
		}
	}
	if n := l.pipe.loose; n > 0 {
		// After the client's Binds and Closes that have not been
		// answered yet (none right after an Execute): their replies come
		// first, and are the client's.
		pw := l.pipe.get(waitPass)
		pw.want = n
		l.pipe.push(pw)
	}
	l.pipe.push(w)
	if pooled {
		// Closed once bound, so that it does not outlive the transaction.
		w.want++
		l.out = append(append(append(l.out[:0], p.run[:p.bindLen]...), p.closeStmt...), p.run[p.bindLen:]...)
		_, err := l.sw.Write(l.out)
		return err
	}
	_, err := l.sw.Write(p.run)
	return err
}

// onReply handles a reply (typ, n bytes, read through f) to an injected
// extended-protocol probe that w, at the head of l's pipeline, waits for;
// c is the session's client.
func (ps *probeState) onReply(f *fromServer, l *link, c *Client, w *wait, typ serverMsg, n int) error {
	switch typ {
	case serverMsgParseComplete: // the backend has the statement now
		w.ready.Store(true)
	case serverMsgBindComplete, serverMsgCommandComplete, serverMsgCloseComplete:
	case serverMsgDataRow:
		if err := ps.captureRow(f, w, n); err != nil {
			return err
		}
		w.seen++
		return nil
	case serverMsgErrorResponse:
		f.via.warn("probe failed; the client's transaction is aborted")
		w.ready.Store(false) // prepare it again next time, whatever went wrong
		return f.via.serverError(w, n)
	default:
		return f.via.reply(w, typ, n)
	}
	w.seen++
	if err := f.skip(n); err != nil {
		return err
	}
	if w.seen == w.want {
		p, row := w.probe, w.row
		l.pipe.pop() // recycles w
		return ps.probed(f, c, p, row)
	}
	return nil
}

// inProbe reports whether the statement now replying is a probe.
func (w *wait) inProbe() bool {
	return len(w.probes) > 0 && w.probes[0].Index == w.stmt
}

// onQueryReply handles a reply (typ, n bytes, read through f) to a probe
// statement inside a simple Query that w waits for; c is the session's
// client.
func (ps *probeState) onQueryReply(f *fromServer, c *Client, w *wait, typ serverMsg, n int) error {
	switch typ {
	case serverMsgRowDescription:
		return f.skip(n)
	case serverMsgDataRow:
		return ps.captureRow(f, w, n)
	case serverMsgCommandComplete:
		p, row := w.probes[0].Probe, w.row
		w.probes = w.probes[1:]
		w.stmt++
		w.row = nil
		if err := f.skip(n); err != nil {
			return err
		}
		return ps.probed(f, c, p, row)
	default:
		return f.via.reply(w, typ, n)
	}
}

// probed hands a probe's row to its ProbeFunc, for c, and relays the
// notice it returns, if any.
func (ps *probeState) probed(f *fromServer, c *Client, p *Probe, row [][]byte) error {
	return f.tell(p.done(c, row))
}

// tell sends the client n, a notice of the Interceptor's (nil: none).
func (f *fromServer) tell(n *pgproto3.NoticeResponse) error {
	if n == nil {
		return nil
	}
	b, err := n.Encode(nil)
	if err != nil {
		return err
	}
	_, err = f.cw.Write(b)
	return err
}

// captureRow reads a probe's DataRow (n bytes) through f and keeps it for
// its ProbeFunc, in w and the state's buffers.
func (ps *probeState) captureRow(f *fromServer, w *wait, n int) error {
	b, err := f.body(n)
	if err != nil {
		return err
	}
	row, err := ps.capture(b)
	if err != nil {
		return err
	}
	w.row = row
	return nil
}

// decodeRow splits a DataRow's body into its values (nil for NULL),
// appended to row; they share b.
func decodeRow(b []byte, row [][]byte) ([][]byte, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("server sent a malformed DataRow: %d bytes", len(b))
	}
	cols := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	for range cols {
		if len(b) < 4 {
			return nil, errors.New("server sent a malformed DataRow: a column is cut short")
		}
		l := int(int32(binary.BigEndian.Uint32(b)))
		b = b[4:]
		switch {
		case l < 0:
			row = append(row, nil)
		case l > len(b):
			return nil, errors.New("server sent a malformed DataRow: a value is cut short")
		default:
			row = append(row, b[:l:l])
			b = b[l:]
		}
	}
	return row, nil
}
