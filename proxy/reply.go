package proxy

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
)

// reply handles a server message the usual way: it notes what the message
// answers (w is the wait at the head of the pipeline, nil if none) and,
// unless it answers the proxy's own Sync after deferred settings, relays
// it to the client.
func (s *session) reply(w *wait, typ serverMsg, n int) error {
	switch typ {
	case serverMsgParseComplete:
		if w != nil && w.kind == waitParse {
			if w.reuse != nil {
				w.reuse.state.Store(stmtReady)
			}
			if w.mark != nil {
				w.mark.done.Store(w.seq)
			}
			s.pipe.pop()
		}
	case serverMsgCommandComplete, serverMsgEmptyQuery, serverMsgPortalSuspended:
		if !s.ranSinceReady.Load() { // a load is cheaper than a store
			s.ranSinceReady.Store(true)
		}
		if w != nil {
			switch w.kind {
			case waitExecute:
				if w.quiet != nil {
					if err := s.quietDone(w); err != nil {
						return err
					}
				}
				s.pipe.pop()
			case waitQuery:
				if w.probes != nil {
					w.stmt++
				}
			}
		}
	case serverMsgReadyForQuery:
		var status txStatus // 0: unknown
		if b, err := s.sr.Peek(6); err == nil && n == 1 {
			status = txStatus(b[5])
		}
		if done, err := s.ready(w, n, status); done || err != nil {
			return err
		}
	case serverMsgErrorResponse:
		if w != nil && w.held {
			return s.apply.setFailed(&s.fromServer, &s.sets, n) // committing the settings failed
		}
		return s.serverError(w, n)
	case serverMsgParameterStatus:
		return s.parameterStatus(n)
	case serverMsgNoticeResponse:
		return s.serverNotice(w, n)
	case serverMsgBackendKeyData:
		s.auth.onKeyData(s.sr, n)
	case serverMsgAuthentication:
		s.auth.onAuthentication(s.sr, n)
	}
	return forward(s.cw, s.sr, n)
}

// swallowReply keeps the replies to messages the proxy sent on its own
// (a re-prepare, or the Parse and Bind of a bound Query) from the client.
func (s *session) swallowReply(w *wait, typ serverMsg, n int) error {
	switch typ {
	case serverMsgParseComplete:
		if w.reuse != nil {
			w.reuse.state.Store(stmtReady)
			w.reuse = nil // an error now is the Bind's: the statement stays
		}
	case serverMsgBindComplete, serverMsgCloseComplete:
	default:
		return s.reply(w, typ, n)
	}
	if w.seen++; w.seen == w.want {
		if w.reuse != nil { // a Close's (a Parse's is noted above)
			w.reuse.state.Store(stmtReady)
		}
		s.pipe.pop()
	}
	return skip(s.sr, n)
}

// serverNotice forwards a NoticeResponse unless the Interceptor keeps it
// from the client, or it is the account of a stale row of the write w
// watches (see Quiet), which is noted.
func (s *session) serverNotice(w *wait, n int) error {
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return err
	}
	var nr pgproto3.NoticeResponse
	if err := nr.Decode(b); err != nil {
		return fmt.Errorf("server sent a malformed NoticeResponse: %w", err)
	}
	if w != nil && w.quiet != nil {
		if note, ok := w.quiet.quiet.Notice(s.c, &nr); ok {
			w.notes = append(w.notes, note)
			return nil
		}
	}
	if !s.srv.cfg.Interceptor.Notice(s.c, &nr) {
		return nil
	}
	return writeMessage(s.cw, serverMsgNoticeResponse, b)
}

func (s *session) parameterStatus(n int) error {
	b, err := body(s.sr, n, &s.sbuf)
	if err != nil {
		return err
	}
	if name, rest, err := cstring(b); err == nil {
		if v, _, err := cstring(rest); err == nil {
			if s.srv.cfg.RequirePrimary && string(name) == "in_hot_standby" && string(v) == "on" {
				return s.standby()
			}
			s.c.serverParam(string(name), string(v))
		}
	}
	return writeMessage(s.cw, serverMsgParameterStatus, b)
}

// standby ends a session whose server is a standby (see
// Config.RequirePrimary).
func (s *session) standby() error {
	writeFatal(s.cw, codeReadOnly, fmt.Sprintf("the server at %s is a standby (in_hot_standby = on), and pgfence was asked for a writable primary (target_session_attrs=read-write)", s.upstream),
		"the primary has moved (a failover); reconnect, and pgfence connects you to the new primary once it has found it")
	s.fatal = true
	s.log.Warn("session ended: its server is a standby", "upstream", s.upstream)
	return errors.New("the server is a standby")
}
