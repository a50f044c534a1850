package proxy

import "unsafe"

// Statement holds and reading holds (see them in the package
// documentation): what the client side waits for before the Interceptor
// sees a message. The hold's state is the Client's (Client.held and the
// like), which the Interceptor takes holds on; these are the client
// side's checks, run before each message that may wait (see
// session.clientToServer and side.hold) and ahead of the dispatcher.

// mayHold reports whether a client message of type typ may have to wait
// (see holdFor).
func mayHold(typ clientMsg) bool {
	switch typ {
	case clientMsgQuery, clientMsgParse, clientMsgBind, clientMsgDescribe, clientMsgFunctionCall:
		return true
	}
	return false
}

// holdFor returns what the client's message f must wait for before the
// Interceptor sees it, nil for nothing: for a Query or Parse, the hold a
// text before it asked for (Client.HoldNextStatement); for a Query or
// Parse sent before the server said how it reads SQL after what came
// before, and for a Bind or
// Describe that plans a prepared statement's text again (see replan), the
// server's answer, when what the Interceptor makes of the text depends on
// it (see Statement holds and Reading holds in the package
// documentation). In the middle of an extended-protocol batch, where
// Postgres answers only at a Sync or Flush and reports no setting, it asks
// the server for its answers and the settings. The message stays unread:
// the caller waits and asks again, until holdFor returns nil. local says
// the channel is the pipeline's own (see pipeline.whenDrained), which the
// server side closes.
func (s *session) holdFor(f *clientFrame) (ch <-chan struct{}, local bool, err error) {
	c, typ, n := s.c, f.typ, f.n
	if typ == clientMsgFunctionCall {
		// A FunctionCall runs a function the Interceptor never sees: it
		// waits for a hold as a statement does (the first read of its
		// database's catalog, say), and for nothing else. (In the middle
		// of a batch, where Postgres would not answer, it does not.)
		if !c.held || c.settled || c.midBatch {
			return nil, false, nil
		}
		c.settled = true
		return s.waitFor(true)
	}
	statement := typ == clientMsgQuery || typ == clientMsgParse
	switch {
	case c.settled:
		return nil, false, nil
	case c.probeLater:
		// The block had failed, or may have: a probe fails in a failed
		// block, where the held text may be the ROLLBACK that ends it. If
		// it still has failed, nothing ran since the ReadyForQuery that
		// said so, which reported the settings.
		c.probeLater = false
		if !s.failed.Load() || s.ranSinceReady.Load() {
			if err := s.probeReading(); err != nil {
				return nil, false, err
			}
		}
		c.settled = true
		return s.waitFor(statement)
	case !statement || !c.held:
		if !c.midBatch && s.pipe.head() == nil {
			return nil, false, nil // every reply is in, ReadyForQuery last
		}
		text, ok := "", true
		if statement {
			text, ok = peekText(s.cr, typ, n)
		} else if text, ok = s.book.replanText(s.cr, f, s.srv.cfg.Interceptor.Generation()); !ok {
			return nil, false, nil
		}
		if ok && !s.srv.cfg.Interceptor.DependsOnReading(c, text) {
			return nil, false, nil
		}
	}
	if !c.midBatch {
		c.settled = true
		return s.waitFor(statement)
	}
	if statement {
		// A hold's catalog read here may not see what the batch's
		// implicit transaction has yet to commit: it runs again after the
		// batch's Sync.
		c.afterSync = append(c.afterSync, c.holdStarts...)
	}
	if s.blockMayHaveFailed() {
		// Learn first whether it has, then probe (above).
		c.probeLater = true
		if _, err := s.sw.Write(flushMessage); err != nil {
			return nil, false, err
		}
		return s.pipe.whenDrained(), true, nil
	}
	if err := s.probeReading(); err != nil {
		return nil, false, err
	}
	c.settled = true
	return s.waitFor(statement)
}

// waitFor is what a settled message waits for: a Query or Parse takes the
// client's hold (see Client.takeHold); anything else waits for the
// server's answers only, and leaves the hold to the next Query or Parse.
func (s *session) waitFor(statement bool) (ch <-chan struct{}, local bool, err error) {
	if !statement {
		return s.pipe.whenDrained(), true, nil
	}
	local = len(s.c.holdStarts) == 0 && len(s.c.holdAgain) == 0
	return s.c.takeHold(), local, nil
}

// probeReading runs the Interceptor's reading probe, if it has one, and
// has Postgres send what it has: in the batch, after all the batch sent
// before it, so it sees what that did to the settings.
func (s *session) probeReading() error {
	if p := s.srv.cfg.Interceptor.ReadingProbe(); p != nil && !s.c.Replication {
		if err := s.injectProbe(p); err != nil {
			return err
		}
	}
	_, err := s.sw.Write(flushMessage)
	return err
}

// flushMessage is a Flush.
var flushMessage = []byte{byte(clientMsgFlush), 0, 0, 0, 4}

// peekText returns the SQL text of the Query or Parse (typ, n bytes) next
// in cr, without reading it; ok is false when cr cannot hold all of it or
// it is malformed (the handler says so).
func peekText(cr msgReader, typ clientMsg, n int) (text string, ok bool) {
	b, err := cr.Peek(5 + n)
	if err != nil {
		return "", false
	}
	b = b[5:]
	if typ == clientMsgParse {
		if _, b, err = cstring(b); err != nil {
			return "", false
		}
	}
	t, _, err := cstring(b)
	if err != nil {
		return "", false
	}
	return unsafe.String(unsafe.SliceData(t), len(t)), true
}
