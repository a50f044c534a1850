package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
)

// SQLSTATEs the proxy itself raises.
const (
	codeProtocolViolation    = "08P01"
	codeConnectionFailure    = "08006"
	codeCannotConnect        = "08001"
	codeTooManyConnections   = "53300"
	codeRejected             = "08004" // sqlserver_rejected_establishment_of_sqlconnection
	codeReadOnly             = "25006" // read_only_sql_transaction
	codeAdminShutdown        = "57P01"
	codeInvalidAuthorization = "28000"
	codeUndefinedStatement   = "26000" // invalid_sql_statement_name: "prepared statement ... does not exist"
)

// clientError ends a session because of what the client sent; the client
// is told why (code defaults to protocol_violation).
type clientError struct {
	err        error
	code, hint string
}

func (e *clientError) Error() string { return e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// errDrained ends a session that became idle while the proxy drains.
var errDrained = errors.New("pgfence is shutting down")

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// framingError makes a malformed client message an error the client is
// told about before its session ends.
func (s *session) framingError(err error) error {
	switch {
	case errors.Is(err, errTooLarge):
		return &clientError{err: err, code: codeProtocolViolation, hint: s.srv.cfg.Hints.MessageTooLarge}
	case errors.Is(err, ErrMalformed):
		return &clientError{err: err}
	}
	return err
}

// serverError forwards an ErrorResponse (or the Interceptor's replacement)
// and notes what the server will skip because of it.
func (s *session) serverError(w *wait, n int) error {
	s.sets.onServerError()
	b, e, err := s.readError(n)
	if err != nil {
		return err
	}
	if !s.started {
		s.srv.upstreamFailed(&upstreamError{startupFailure(e.Code), errors.New(e.Message)})
	}
	moved := false
	if e.Position != 0 && w != nil { // before skipToSync recycles w
		// A position in the text Postgres got, which may not be the
		// client's: point into the client's instead.
		if p := w.position(s.c, e.Position); p != e.Position {
			e.Position, moved = p, true
		}
	}
	if w != nil && len(w.ends) > 0 {
		if n, where, ok := boundParamContext(e.Where); ok {
			// An error reading a value the proxy bound in place of the
			// client's literal: say it as Postgres says it of a literal,
			// at the literal and with no word of a parameter.
			e.Where, moved = where, true
			if e.Position == 0 && w.origin != nil {
				e.Position = int32(w.origin.Param(s.c, n, w.bound()))
			}
		}
	}
	if e.Severity == "FATAL" || e.Severity == "PANIC" {
		s.fatal = true
	}
	s.forget.onServerError(e.Code)
	if e.Code == codeInvalidAuthorization && strings.Contains(e.Message, "channel binding negotiation") {
		// The client supports channel binding and Postgres, over TLS,
		// offered it to pgfence: a mismatch no client setting but one can
		// fix. Say which.
		e.Message, e.Hint = "pgfence: "+channelBindingHelp, channelBindingHint
		s.skipAfterError(w)
		out, err := e.Encode(s.out[:0:0])
		if err != nil {
			return err
		}
		_, err = s.cw.Write(out)
		return err
	}
	// The Interceptor hears of the error before the pipeline lets what the
	// error skips go (a held statement among it): on the goroutine relay the
	// client side would otherwise plan that statement before it.
	r := s.srv.cfg.Interceptor.Error(s.c, &e)
	s.skipAfterError(w)
	if r == nil && moved {
		r = &e
	}
	if r != nil {
		out, err := r.Encode(s.out[:0:0])
		if err != nil {
			return err
		}
		_, err = s.cw.Write(out)
		return err
	}
	return writeMessage(s.cw, serverMsgErrorResponse, b)
}

// skipAfterError drops the waits for what Postgres skips after an error
// that w awaited (nil: a Bind's, Describe's or Close's, or a FATAL one).
func (s *session) skipAfterError(w *wait) {
	if w == nil {
		// Postgres skips what follows up to a Sync. What the proxy sends
		// before it (a reading probe, see holdFor) gets no reply: waits
		// for it must not be kept.
		s.pipe.skipToSync()
		return
	}
	switch w.kind {
	case waitQuery:
		// The rest of the query string is not run. (Written only when set:
		// queryWait, which has none, is shared by every session.)
		if w.probes != nil {
			w.probes = nil
		}
	case waitExecute, waitProbe, waitSwallow, waitParse, waitPass:
		s.pipe.skipToSync()
	}
}

// boundParamContext returns where without its last line if that is the
// context Postgres gives an error reading the value of parameter n of the
// unnamed portal ("unnamed portal parameter $2", with " = 'value'" when
// log_parameter_max_length_on_error allows).
func boundParamContext(where string) (n int, rest string, ok bool) {
	i := strings.LastIndexByte(where, '\n') + 1
	line, found := strings.CutPrefix(where[i:], "unnamed portal parameter $")
	if !found {
		return 0, "", false
	}
	digits, _, _ := strings.Cut(line, " = ")
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 {
		return 0, "", false
	}
	return n, strings.TrimSuffix(where[:i], "\n"), true
}

// end tells the client why the session ends and logs it (see relay).
func (s *session) end(level slog.Level, log, code, msg, hint string, args ...any) {
	writeFatal(s.cw, code, msg, hint)
	s.fatal = true
	s.log.Log(context.Background(), level, log, args...)
}

// warn logs msg with args for the session's client (see relay); s.log
// names the client already.
func (s *session) warn(msg string, args ...any) {
	s.log.Warn(msg, args...)
}

// sendFatal tells the client why its session ends. Only called once the
// server-to-client goroutine has stopped writing.
func (s *session) sendFatal(code, msg, hint string) {
	writeFatal(s.cw, code, msg, hint)
	s.cw.Flush()
}

func writeFatal(w io.Writer, code, msg, hint string) {
	writeError(w, "FATAL", code, msg, hint)
}

func writeError(w io.Writer, severity, code, msg, hint string) {
	e := pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: code, Message: "pgfence: " + msg, Hint: hint}
	b, _ := e.Encode(nil)
	w.Write(b)
}
