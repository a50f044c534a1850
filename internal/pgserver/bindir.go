package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// EnvBinDir names the environment variable that, when set, points at the
// directory holding the Postgres server binaries (initdb, postgres).
const EnvBinDir = "PGFENCE_PG_BINDIR"

// installHint is appended to every "Postgres not found" error so the user
// knows exactly what to do.
const installHint = "install the Postgres server binaries (Debian/Ubuntu: `apt-get install postgresql`; " +
	"or run scripts/ensure-postgres.sh), or set " + EnvBinDir + " to a directory containing initdb and postgres"

// FindBinDir locates a directory containing the initdb and postgres
// binaries. The search order is:
//
//  1. $PGFENCE_PG_BINDIR (an error if set but unusable),
//  2. the directory of initdb found on $PATH, with symlinks resolved
//     (Debian puts wrappers/symlinks in /usr/bin or /usr/local/bin),
//  3. the newest /usr/lib/postgresql/<version>/bin.
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if err := checkBinDir(dir); err != nil {
			return "", fmt.Errorf("pgserver: %s=%q is not usable: %v; %s", EnvBinDir, dir, err, installHint)
		}
		return dir, nil
	}

	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			if abs, err := filepath.Abs(real); err == nil {
				real = abs
			}
			dir := filepath.Dir(real)
			if checkBinDir(dir) == nil {
				return dir, nil
			}
		}
	}

	for _, dir := range debianBinDirs() {
		if checkBinDir(dir) == nil {
			return dir, nil
		}
	}

	return "", errors.New("pgserver: Postgres server binaries (initdb, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; " + installHint)
}

// checkBinDir reports whether dir holds executable initdb and postgres.
func checkBinDir(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", p)
		}
	}
	return nil
}

// debianBinDirs returns /usr/lib/postgresql/*/bin, newest version first.
func debianBinDirs() []string {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(p string) []int {
		v := filepath.Base(filepath.Dir(p))
		var out []int
		for _, part := range strings.Split(v, ".") {
			n, err := strconv.Atoi(part)
			if err != nil {
				n = -1
			}
			out = append(out, n)
		}
		return out
	}
	sort.SliceStable(matches, func(i, j int) bool {
		a, b := version(matches[i]), version(matches[j])
		for k := 0; k < len(a) && k < len(b); k++ {
			if a[k] != b[k] {
				return a[k] > b[k]
			}
		}
		return len(a) > len(b)
	})
	return matches
}
