package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

func FuzzHeader(f *testing.F) {
	for _, s := range [][]byte{{'Q', 0, 0, 0, 4}, {'Q', 0, 0, 0, 3}, {'Q', 0x7f, 0xff, 0xff, 0xff}, {'X'}, {}} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		typ, n, err := header(r, 1<<16)
		if err != nil {
			return
		}
		if n < 0 || n > 1<<16 {
			t.Fatalf("header accepted length %d", n)
		}
		var buf []byte
		if b, err := body(r, n, &buf); err == nil && len(b) != n {
			t.Fatalf("message %q: body of %d bytes, want %d", typ, len(b), n)
		}
	})
}

// FuzzClientBytes feeds arbitrary bytes to a session from startup on: the
// proxy must never panic or hang, whatever a client sends. (Correctness of
// the protocol is shown against a real Postgres in proxy_test.go; this only
// needs a peer that accepts bytes.)
func FuzzClientBytes(f *testing.F) {
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	srv, err := New(Config{Upstream: sink.Addr().String(), Interceptor: NopInterceptor{}, StartupTimeout: 2 * time.Second, MaxMessageSize: 1 << 16})
	if err != nil {
		f.Fatal(err)
	}
	startup, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "u", "database": "d"}}).Encode(nil)
	query, _ := (&pgproto3.Query{String: "SELECT 1"}).Encode(nil)
	parse, _ := (&pgproto3.Parse{Name: "s", Query: "SELECT $1"}).Encode(nil)
	bind, _ := (&pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "s"}).Encode(nil)
	exec, _ := (&pgproto3.Execute{Portal: "p"}).Encode(nil)
	ssl := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), codeSSLRequest)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, s := range [][]byte{
		startup,
		cat(ssl, startup, query),
		cat(startup, parse, bind, exec, []byte{'S', 0, 0, 0, 4}),
		cat(startup, []byte{'Q', 0, 0, 0, 3}),
		cat(startup, []byte{'Q', 0x7f, 0xff, 0xff, 0xff}),
		cat(startup, []byte{'B', 0, 0, 0, 6, 'p', 0}),
		{0, 0, 0, 8, 0, 2, 0, 0},
		{0xff, 0xff, 0xff, 0xff},
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		client, conn := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.handle(conn)
			conn.Close()
		}()
		go io.Copy(io.Discard, client)
		client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		client.Write(data)
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("session did not end after the client closed")
		}
	})
}
