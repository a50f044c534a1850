package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// listenUnix listens on dir/.s.PGSQL.<port of tcp>, as Postgres names its
// socket, so that libpq, pgx and psql reach it with host=dir and the
// port; nil when dir is "". A socket file left by a pgfence that did not
// exit cleanly is replaced; any other file there is an error.
func listenUnix(dir string, tcp net.Addr) (net.Listener, error) {
	if dir == "" {
		return nil, nil
	}
	a, ok := tcp.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("--unix-socket-dir: no port in --listen %s", tcp)
	}
	path := filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(a.Port))
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--unix-socket-dir: %s exists and is not a socket", path)
		}
		// A live server answers there: do not take its socket.
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("--unix-socket-dir: %s: another server listens there", path)
		}
		os.Remove(path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("--unix-socket-dir: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--unix-socket-dir: %w", err)
	}
	// Who may connect is the directory's permissions' business, as for
	// Postgres's own socket.
	if err := os.Chmod(path, 0o777); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--unix-socket-dir: %w", err)
	}
	return ln, nil
}
