package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
)

// Statement names: see the package documentation.

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
