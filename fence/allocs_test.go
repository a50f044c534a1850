package fence_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// TestRelayAllocations checks that, once a session is warm, the event loop
// relays fenced writes and plain reads without allocating: the issue's "no
// per-message allocations on the hot path", measured through the real proxy
// and Postgres. The client writes pre-encoded batches and reads the replies
// into a fixed buffer, so that the process's allocation count is the
// proxy's.
func TestRelayAllocations(t *testing.T) {
	if os.Getenv("PGFENCE_TEST_RELAY") == "goroutines" {
		t.Skip("the goroutine relay allocates a pipeline entry per probe; the claim is the event loop's")
	}
	t.Run("probes", func(t *testing.T) { relayAllocations(t) })
	// Where the backstop's helpers are in place, the writes right after a
	// SET pgfence answered go without their probe (see fence/quiet.go).
	t.Run("helpers", func(t *testing.T) {
		p := relayAllocations(t, staleNotices(t))
		if got := p.Counter(t, "pgfence_probes_left_out_total"); got == 0 {
			t.Error("no probe was left out: the measure is not of that path")
		}
	})
}

func relayAllocations(t *testing.T, edit ...func(*proxy.Config, *fence.Config)) *pgtest.Proxy {
	tbl := table(t, [3]any{1, "v", 5})
	p := pgtest.StartProxy(t, []string{tbl}, edit...)
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '10'")
	conn := c.PgConn().Conn()
	buf := make([]byte, 8192)

	write := "UPDATE " + tbl + " SET val = $1 WHERE id = 1"
	var batch []byte
	enc := func(msgs ...pgproto3.FrontendMessage) {
		for _, m := range msgs {
			var err error
			if batch, err = m.Encode(batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A named statement, prepared before measuring.
	enc(&pgproto3.Parse{Name: "w", Query: write}, &pgproto3.Sync{})
	roundTrip(t, conn, buf, batch, 1)
	batch = batch[:0]

	// pgx's exec mode: the unnamed statement, parsed anew each time and
	// alternating between two texts.
	enc(&pgproto3.Parse{Query: "SELECT $1::int"},
		&pgproto3.Bind{Parameters: [][]byte{[]byte("1")}}, &pgproto3.Execute{},
		&pgproto3.Parse{Query: write},
		&pgproto3.Bind{Parameters: [][]byte{[]byte("x")}}, &pgproto3.Execute{},
		&pgproto3.Sync{})
	// A named statement's Bind and Execute, which pgfence follows with its
	// probe.
	enc(&pgproto3.Bind{PreparedStatement: "w", Parameters: [][]byte{[]byte("y")}}, &pgproto3.Execute{}, &pgproto3.Sync{})
	// The same simple-protocol write each time, run as a bound statement,
	// and a plain read.
	enc(&pgproto3.Query{String: "UPDATE " + tbl + " SET val = 'z' WHERE id = 1"}, &pgproto3.Query{String: "SELECT 1"})
	const replies = 4 // ReadyForQuery per round

	// Then the token set and a write, each alone, as a pooled client sends
	// them per transaction: pgfence answers the SET itself and sets the
	// token ahead of the write (see proxy.Config.ForwardSettings), in both
	// protocols. The Bind right after the bound write closes the unnamed
	// portal that write left first (see stmtBook.portalGone).
	units := [][]byte{
		message(t, &pgproto3.Query{String: "SET fence.token = '10'"}),
		message(t, &pgproto3.Query{String: "UPDATE " + tbl + " SET val = 'z' WHERE id = 1"}),
		message(t, &pgproto3.Bind{PreparedStatement: "s"}, &pgproto3.Execute{}, &pgproto3.Sync{}),
		message(t, &pgproto3.Bind{PreparedStatement: "w", Parameters: [][]byte{[]byte("z")}}, &pgproto3.Execute{}, &pgproto3.Sync{}),
		// The same with the unnamed statement, as pgbench -M extended
		// sends them.
		message(t, &pgproto3.Parse{Query: "SET fence.token = '10'"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{}, &pgproto3.Sync{}),
		message(t, &pgproto3.Parse{Query: write}, &pgproto3.Bind{Parameters: [][]byte{[]byte("z")}}, &pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{}, &pgproto3.Sync{}),
		// And in a transaction block, the token set with SET LOCAL, which
		// pgfence answers there too, in both protocols.
		message(t, &pgproto3.Query{String: "BEGIN"}),
		message(t, &pgproto3.Query{String: "SET LOCAL fence.token = '10'"}),
		message(t, &pgproto3.Query{String: "UPDATE " + tbl + " SET val = 'z' WHERE id = 1"}),
		message(t, &pgproto3.Parse{Query: "SET LOCAL fence.token = '10'"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{}, &pgproto3.Sync{}),
		message(t, &pgproto3.Parse{Query: write}, &pgproto3.Bind{Parameters: [][]byte{[]byte("z")}}, &pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{}, &pgproto3.Sync{}),
		message(t, &pgproto3.Query{String: "COMMIT"}),
	}
	roundTrip(t, conn, buf, message(t, &pgproto3.Parse{Name: "s", Query: "SET fence.token = '10'"}, &pgproto3.Sync{}), 1)
	round := func() {
		roundTrip(t, conn, buf, batch, replies)
		for _, u := range units {
			roundTrip(t, conn, buf, u, 1)
		}
	}

	for range 50 { // warm up: caches, buffers, reused statements
		round()
	}
	const rounds = 300
	if pgtest.TLS() {
		// crypto/tls allocates a small reader each time it reads a socket
		// (Conn.readFromUntil), in the client as in pgfence, so the count
		// is the process's no more: what must allocate nothing is
		// pgfence's own code, told by where each allocation was made.
		n, where := pgfenceAllocs(func() {
			for range rounds {
				round()
			}
		})
		if n > rounds/20 {
			t.Errorf("pgfence's code made %d allocations over %d rounds on TLS, want none; at:\n%s", n, rounds, strings.Join(where, "\n"))
		}
	} else {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range rounds {
			round()
		}
		runtime.ReadMemStats(&after)
		// Allow a few for whatever else the process does meanwhile; one per
		// round would be 300.
		n := after.Mallocs - before.Mallocs
		t.Logf("%d allocations over %d rounds", n, rounds)
		if n > rounds/20 {
			t.Errorf("%d allocations over %d rounds (%.2f per round of 8 fenced writes, 2 reads and 5 SETs), want none",
				n, rounds, float64(n)/rounds)
		}
	}
	if val, epoch := row(t, tbl, 1); val != "z" || epoch != 10 {
		t.Fatalf("row is %q at epoch %d, want z at 10", val, epoch)
	}
	return p
}

// pgfenceAllocs runs f with every allocation profiled, and counts those
// made by pgfence's own code (the first frame below the runtime's is
// pgfence's); where names the place of each.
func pgfenceAllocs(f func()) (n int64, where []string) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	before := memProfile()
	f()
	for key, rec := range memProfile() {
		d := rec.AllocObjects - before[key].AllocObjects
		if d <= 0 {
			continue
		}
		frames := runtime.CallersFrames(rec.Stack())
		for {
			fr, more := frames.Next()
			if fn := fr.Function; !strings.HasPrefix(fn, "runtime.") {
				if strings.HasPrefix(fn, "github.com/pgfence/pgfence/") && !strings.Contains(fn, "test") {
					n += d
					where = append(where, fmt.Sprintf("%d at %s (%s:%d)", d, fn, fr.File, fr.Line))
				}
				break
			}
			if !more {
				break
			}
		}
	}
	return n, where
}

// memProfile is the allocation profile by stack, as of now.
func memProfile() map[[32]uintptr]runtime.MemProfileRecord {
	// The profile is as of the last completed collection but one.
	runtime.GC()
	runtime.GC()
	recs := make([]runtime.MemProfileRecord, 1024)
	for {
		n, ok := runtime.MemProfile(recs, true)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+1024)
	}
	m := make(map[[32]uintptr]runtime.MemProfileRecord, len(recs))
	for _, r := range recs {
		m[r.Stack0] = r
	}
	return m
}

// message encodes msgs one after another.
func message(t *testing.T, msgs ...pgproto3.FrontendMessage) []byte {
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// roundTrip writes batch and reads replies up to its ready-th ReadyForQuery
// into buf, failing on an ErrorResponse. It allocates nothing while all goes
// well.
func roundTrip(t *testing.T, conn net.Conn, buf, batch []byte, ready int) {
	if _, err := conn.Write(batch); err != nil {
		t.Fatal(err)
	}
	have, off := 0, 0
	for ready > 0 {
		if have-off < 5 || have-off < 1+int(binary.BigEndian.Uint32(buf[off+1:off+5])) {
			have = copy(buf, buf[off:have])
			off = 0
			n, err := conn.Read(buf[have:])
			if err != nil {
				t.Fatal(err)
			}
			have += n
			continue
		}
		typ, n := buf[off], 1+int(binary.BigEndian.Uint32(buf[off+1:off+5]))
		switch typ {
		case 'E':
			var e pgproto3.ErrorResponse
			_ = e.Decode(buf[off+5 : off+n])
			t.Fatalf("server error: %s (%s)", e.Message, e.Code)
		case 'Z':
			ready--
		}
		off += n
	}
	if off != have {
		t.Fatalf("%d bytes after the last ReadyForQuery", have-off)
	}
}
