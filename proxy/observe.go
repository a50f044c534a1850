package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// UpstreamFailure is why a session could not be connected to Postgres.
type UpstreamFailure string

const (
	UpstreamRefused  UpstreamFailure = "refused"  // nothing listens at the address
	UpstreamTimeout  UpstreamFailure = "timeout"  // no answer within DialTimeout
	UpstreamNetwork  UpstreamFailure = "network"  // any other failure to connect
	UpstreamTLS      UpstreamFailure = "tls"      // TLS refused or its handshake failed
	UpstreamAuth     UpstreamFailure = "auth"     // Postgres refused the credentials (SQLSTATE class 28)
	UpstreamRejected UpstreamFailure = "rejected" // Postgres refused the session otherwise: too many connections, starting up, no such database
)

// UpstreamFailures lists every UpstreamFailure, for series that start at 0.
var UpstreamFailures = []UpstreamFailure{UpstreamRefused, UpstreamTimeout, UpstreamNetwork, UpstreamTLS, UpstreamAuth, UpstreamRejected}

// upstreamError is a failure to connect to Postgres, with its cause.
type upstreamError struct {
	cause UpstreamFailure
	err   error
}

func (e *upstreamError) Error() string { return e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// dialFailure classifies an error from connecting to Postgres.
func dialFailure(err error) *upstreamError {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, os.ErrNotExist):
		return &upstreamError{UpstreamRefused, err}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return &upstreamError{UpstreamTimeout, err}
	}
	return &upstreamError{UpstreamNetwork, err}
}

// tlsFailure marks err as a TLS failure, unless it is a timeout.
func tlsFailure(err error) *upstreamError {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return &upstreamError{UpstreamTimeout, err}
	}
	return &upstreamError{UpstreamTLS, err}
}

// startupFailure classifies an ErrorResponse Postgres sent before the
// session's first ReadyForQuery.
func startupFailure(code string) UpstreamFailure {
	if len(code) == 5 && code[:2] == "28" {
		return UpstreamAuth
	}
	return UpstreamRejected
}

// upstreamFailed tells Config.UpstreamFailed, if set.
func (s *Server) upstreamFailed(err error) {
	var ue *upstreamError
	if f := s.cfg.UpstreamFailed; f != nil && errors.As(err, &ue) {
		f(ue.cause)
	}
}

// roundTrip is the time the event loop has spent handling the bytes of a
// session's current round trip, both ways: from reading them to writing
// them on. Only the loop's goroutine touches it.
type roundTrip struct {
	held  time.Duration
	ended bool // a ReadyForQuery went to the client
}

// add counts one handling of x's bytes, which began at start, and reports
// the round trip's total once its ReadyForQuery has been written on.
func (rt *roundTrip) add(c *Client, start time.Time, report func(*Client, time.Duration)) {
	rt.held += time.Since(start)
	if rt.ended {
		report(c, rt.held)
		*rt = roundTrip{}
	}
}
