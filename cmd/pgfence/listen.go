package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// listen listens where --listen says: host:port, or, for an absolute
// path, a Unix socket there (name it as Postgres would, .../.s.PGSQL.<port>,
// for clients to reach it with host=<its directory> and that port).
func listen(addr string) (net.Listener, error) {
	if strings.HasPrefix(addr, "/") {
		return listenSocket("--listen", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	return ln, nil
}

// listenUnix listens on dir/.s.PGSQL.<port of tcp>, as Postgres names its
// socket, so that libpq, pgx and psql reach it with host=dir and the
// port; nil when dir is "" or --listen is itself a socket.
func listenUnix(dir string, tcp net.Addr) (net.Listener, error) {
	if dir == "" {
		return nil, nil
	}
	a, ok := tcp.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("--unix-socket-dir: --listen %s is no TCP address: use one or the other", tcp)
	}
	return listenSocket("--unix-socket-dir", filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(a.Port)))
}

// listenSocket listens on a Unix socket at path. A socket file left by a
// pgfence that did not exit cleanly is replaced; any other file there is
// an error. flag names the setting in errors.
func listenSocket(flag, path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s: %s exists and is not a socket", flag, path)
		}
		// A live server answers there: do not take its socket.
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: %s: another server listens there", flag, path)
		}
		os.Remove(path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	// Who may connect is the directory's permissions' business, as for
	// Postgres's own socket.
	if err := os.Chmod(path, 0o777); err != nil {
		ln.Close()
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return ln, nil
}
