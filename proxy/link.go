package proxy

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"
)

// link is the client side's way to the session's server connection, which
// the parts of a session share (see Parts of a session in the package
// documentation): the writer to the server, the pipeline that matches the
// server's replies to what was sent, the buffer the proxy builds its own
// messages in, and what the last ReadyForQuery said of the transaction
// block. A part sends the server nothing but through it, and learns of the
// block nothing but from it.
type link struct {
	// sw is the writer to the server: bufio over the connection when
	// goroutines relay, the event loop's buffer when it does, or while
	// deferred settings are held, where what goes to the server waits (see
	// applyState.held).
	sw msgWriter
	// pipe matches the server's replies to what the client side sent.
	pipe pipeline
	// out holds the messages the proxy builds for the server: the client
	// side's (and the server side's too on the event loop, see applyState.retryHeld).
	out []byte
	// failed is true while the last ReadyForQuery said the transaction
	// block failed; written by the server side.
	failed atomic.Bool
}

// blockMayHaveFailed reports whether the transaction block may have
// failed by the time Postgres reads what the client sends now: the last
// ReadyForQuery said so, or the client is ahead of the replies. The proxy
// then sends no Parse of a name of its own: Postgres 15 (15.18 here)
// crashes, every session with it, on a named Parse refused in a block
// that an error such as DISCARD ALL's or a missing savepoint's failed,
// followed by an Execute of the unnamed portal that failed statement
// left, where the client's unnamed Parse in its place does not (see
// README).
func (l *link) blockMayHaveFailed() bool {
	return l.failed.Load() || l.pipe.awaitsReady()
}

// failedNow reports whether the transaction block is known to have failed
// when Postgres reads what the client sends now: the last ReadyForQuery
// said so, and the client sent nothing since that ends with another.
func (l *link) failedNow() bool {
	return l.failed.Load() && !l.pipe.awaitsReady()
}

// parseAs sends a Parse of sql named name, answered by w.
func (l *link) parseAs(name, sql string, params []byte, w *wait) error {
	l.pipe.push(w)
	l.out = append(append(l.out[:0], byte(clientMsgParse), 0, 0, 0, 0), name...)
	l.out = append(append(append(l.out, 0), sql...), 0)
	l.out = append(l.out, params...)
	binary.BigEndian.PutUint32(l.out[1:5], uint32(len(l.out)-1))
	_, err := l.sw.Write(l.out)
	return err
}

// pushSwallow pushes w, a waitSwallow for messages the proxy sends in the
// middle of the client's, after a waitPass for the replies to the client's
// Binds and Closes before them.
func (l *link) pushSwallow(w *wait) {
	if n := l.pipe.loose; n > 0 {
		pw := l.pipe.get(waitPass)
		pw.want = n
		l.pipe.push(pw)
	}
	l.pipe.push(w)
}

// closeQuietly sends the Close message m, keeping its reply from the
// client; done, if not nil, notes when Postgres answers it.
func (l *link) closeQuietly(m []byte, done *serverStmt) error {
	w := l.pipe.get(waitSwallow)
	w.want, w.reuse = 1, done // CloseComplete
	l.pushSwallow(w)
	_, err := l.sw.Write(m)
	return err
}

// fromServer is the server side's way from the server's connection to the
// client's, which the parts' reply handlers share as the client side's
// share link: the reader of the server's messages, the buffer one is read
// into, and the writer to the client.
type fromServer struct {
	sr   msgReader
	cw   msgWriter
	sbuf []byte
	// via is the session, for what only the session does with a reply.
	via relay
}

// relay is what the parts' reply handlers leave to the session: they read
// the server's message and decide, the session relays it the usual way,
// reports an error, or ends.
type relay interface {
	// reply relays a server message (n bytes) that w awaits as the
	// session relays any (see session.reply).
	reply(w *wait, typ serverMsg, n int) error
	// serverError relays an ErrorResponse (n bytes) that w awaits, and
	// drops the waits for what Postgres skips after it.
	serverError(w *wait, n int) error
	// end tells the client why the session ends, with a FATAL error
	// (code, msg, hint), and logs msg with args at level: the session
	// ends once the handler returns its error.
	end(level slog.Level, log, code, msg, hint string, args ...any)
	// warn logs msg with args for the session's client.
	warn(msg string, args ...any)
}

// body reads the server's message (n bytes) into the buffer.
func (f *fromServer) body(n int) ([]byte, error) { return body(f.sr, n, &f.sbuf) }

// skip drops the server's message (n bytes).
func (f *fromServer) skip(n int) error { return skip(f.sr, n) }

// readError consumes the server's ErrorResponse of n bytes and returns
// its body (in the buffer) and what it says.
func (f *fromServer) readError(n int) ([]byte, pgproto3.ErrorResponse, error) {
	var e pgproto3.ErrorResponse
	b, err := f.body(n)
	if err != nil {
		return nil, e, err
	}
	if err := e.Decode(b); err != nil {
		return nil, e, fmt.Errorf("server sent a malformed ErrorResponse: %w", err)
	}
	return b, e, nil
}
