//go:build unix

package cores

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used so far, in user and
// system mode, across its threads.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
