package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
)

// The proxy's own statements on a server backend carry names no other
// session's can: a tag drawn when the process starts, and the session's
// number. Behind a transaction pooler that nobody told pgfence of (see
// Config.TransactionPooling), a backend serves many clients in turn; with
// names shared between sessions, a Bind of one session's statement could
// run another's. With these it fails with 26000, which is as far as such a
// mistake can go.

// instanceTag tells this process's statements from another pgfence's on
// the same backend.
var instanceTag = func() string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("proxy: no randomness for statement names: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}()

// sessionTag is the part of a statement name that is this session's own.
func sessionTag(id uint64) string {
	return instanceTag + "." + strconv.FormatUint(id, 36)
}
