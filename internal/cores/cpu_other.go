//go:build !unix

package cores

import "time"

// processCPU cannot be read here: -1, and the Governor leaves GOMAXPROCS
// alone.
func processCPU() time.Duration { return -1 }
