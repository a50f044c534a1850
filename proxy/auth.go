package proxy

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
)

// authState is what the session keeps of authentication and of its
// backend's key. The server side writes it as the server's messages pass;
// the client side takes sasl, and the relay's end reads cancel, so both
// are atomic.
type authState struct {
	// sasl is set between AuthenticationSASL and the client's answer.
	sasl atomic.Bool
	// cancel is the CancelRequest for this session's backend, built from
	// its BackendKeyData.
	cancel atomic.Pointer[[]byte]
}

// channelBindingHelp explains why SCRAM channel binding cannot work
// through pgfence.
const channelBindingHelp = "SCRAM channel binding cannot pass through pgfence: the client's TLS channel ends at pgfence, not at Postgres, so the binding can never match"

const channelBindingHint = "connect with channel_binding=disable (the password exchange is still SCRAM), or let pgfence reach Postgres without TLS (e.g. over loopback or a Unix socket), where Postgres does not offer channel binding"

// authSASL is AuthenticationSASL's request code.
const authSASL = 10

// onAuthentication watches the server's authentication requests (n
// bytes, next in sr) for the start of SASL, so that the client's choice
// of mechanism can be checked.
func (a *authState) onAuthentication(sr msgReader, n int) {
	if b, err := sr.Peek(9); err == nil && n >= 4 && binary.BigEndian.Uint32(b[5:9]) == authSASL {
		a.sasl.Store(true)
	}
}

// onPassword forwards to sw the client's password message (n bytes, next
// in cr), checking a SASLInitialResponse: a client choosing
// SCRAM-SHA-256-PLUS is stopped with an explanation instead of failing
// later with a bare "channel binding check failed".
func (a *authState) onPassword(sw msgWriter, cr msgReader, n int) error {
	if !a.sasl.CompareAndSwap(true, false) {
		return forward(sw, cr, n)
	}
	b, err := peekBody(cr, n)
	if err != nil {
		return err
	}
	if mech, _, err := cstring(b); err == nil && string(mech) == "SCRAM-SHA-256-PLUS" {
		return &clientError{err: errors.New(channelBindingHelp), code: codeInvalidAuthorization, hint: channelBindingHint}
	}
	return forward(sw, cr, n)
}

// onKeyData keeps the backend's key (BackendKeyData, n bytes, next in
// sr) so the proxy can cancel its query if the client goes away (the
// message itself is forwarded as is).
func (a *authState) onKeyData(sr msgReader, n int) {
	b, err := sr.Peek(5 + n)
	if err != nil || n < 8 || n > 256 {
		return
	}
	p := binary.BigEndian.AppendUint32(nil, uint32(8+n))
	p = binary.BigEndian.AppendUint32(p, codeCancelRequest)
	p = append(p, b[5:]...)
	a.cancel.Store(&p)
}
