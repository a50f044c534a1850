package proxy_test

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Messages larger than the event loop's 16 KiB buffer, each way: the ones
// it must hold whole (a Query, a Parse), the ones it streams (a Bind, a
// DataRow, CopyData), and a fenced write with a large value.
func TestLargeMessages(t *testing.T) {
	p := pgtest.StartProxy(t, []string{"big_guarded"})
	c := p.Connect(t, "options=-c fence.token=7")
	pgtest.Exec(t, c, "DROP TABLE IF EXISTS big_guarded; CREATE TABLE big_guarded (id int PRIMARY KEY, v text, fence_epoch bigint)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS big_guarded, big_copy") })

	for _, size := range []int{16<<10 - 6, 16 << 10, 16<<10 + 1, 300 << 10, 5 << 20} {
		lit := strings.Repeat("x", size)
		var n int
		// Simple protocol: the Query carries the literal.
		if err := c.QueryRow(ctx, "SELECT length('"+lit+"')", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil || n != size {
			t.Fatalf("Query of %d bytes: %d, %v", size, n, err)
		}
		// Extended: the Bind carries it; the result row carries it back.
		var back string
		if err := c.QueryRow(ctx, "SELECT $1::text", lit).Scan(&back); err != nil || back != lit {
			t.Fatalf("Bind and DataRow of %d bytes: %d bytes back, %v", size, len(back), err)
		}
		// A fenced write of it, then a stale one.
		if tag := pgtest.Exec(t, c, "INSERT INTO big_guarded (id, v) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET v = excluded.v", size, lit); tag != "INSERT 0 1" {
			t.Fatalf("fenced upsert of %d bytes: %s", size, tag)
		}
	}
	stale := p.Connect(t, "options=-c fence.token=6")
	if tag := pgtest.Exec(t, stale, "UPDATE big_guarded SET v = $1", strings.Repeat("y", 1<<20)); tag != "UPDATE 0" {
		t.Fatalf("stale write of 1 MiB: %s", tag)
	}
	var sum int64
	if err := c.QueryRow(ctx, "SELECT sum(length(v)) FROM big_guarded WHERE v NOT LIKE 'y%'").Scan(&sum); err != nil || sum != 16<<10-6+16<<10+16<<10+1+300<<10+5<<20 {
		t.Fatalf("rows after the stale write: %d bytes, %v", sum, err)
	}

	// COPY of 40 MiB in, and out again.
	pgtest.Exec(t, c, "CREATE TABLE big_copy (id int, s text)")
	var in bytes.Buffer
	row := strings.Repeat("z", 4000)
	for i := range 10000 {
		fmt.Fprintf(&in, "%d\t%s\n", i, row)
	}
	want := in.Bytes()
	tag, err := c.PgConn().CopyFrom(ctx, bytes.NewReader(want), "COPY big_copy FROM STDIN")
	if err != nil || tag.RowsAffected() != 10000 {
		t.Fatalf("COPY FROM of %d bytes: %v %v", len(want), tag, err)
	}
	var out bytes.Buffer
	if _, err := c.PgConn().CopyTo(ctx, &out, "COPY (SELECT * FROM big_copy ORDER BY id) TO STDOUT"); err != nil || !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("COPY TO: %d bytes back of %d, %v", out.Len(), len(want), err)
	}
}

// A client that reads slowly holds back Postgres, not the proxy's memory:
// the loop stops reading a server whose client is not taking what it has.
func TestSlowReader(t *testing.T) {
	p := pgtest.StartRelay(t)
	conn, fe := pgtest.RawSession(t, p.Addr)
	const rows, width = 20000, 10000 // about 200 MB of DataRows
	fe.Send(&pgproto3.Query{String: fmt.Sprintf("SELECT repeat('r', %d) FROM generate_series(1, %d)", width, rows)})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var peak uint64
	sample := func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
	}
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	got := 0
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("after %d rows: %v", got, err)
		}
		if _, ok := msg.(*pgproto3.DataRow); ok {
			if got++; got%500 == 0 {
				sample()
				time.Sleep(20 * time.Millisecond) // a slow reader
			}
			continue
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if got != rows {
		t.Fatalf("got %d rows, want %d", got, rows)
	}
	// Socket buffers hold a few MB; the proxy itself should not hold a
	// meaningful part of the 200 MB.
	if grew := int64(peak) - int64(base.HeapInuse); grew > 32<<20 {
		t.Fatalf("proxy heap grew by %d MiB while relaying to a slow reader", grew>>20)
	}
}

// Many sessions at once, each running a pipeline of statements of varied
// sizes, get their own answers and nobody else's.
func TestManySessionsInterleaved(t *testing.T) {
	p := pgtest.StartRelay(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pgx.Connect(ctx, p.URL())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(ctx)
			for j := range 50 {
				want := fmt.Sprintf("%d-%d-%s", i, j, strings.Repeat("p", (i*j*97)%40000))
				b := &pgx.Batch{}
				b.Queue("SELECT $1::text", want)
				b.Queue("SELECT length($1::text)", want)
				br := c.SendBatch(ctx, b)
				var got string
				var n int
				err1 := br.QueryRow().Scan(&got)
				err2 := br.QueryRow().Scan(&n)
				if err := br.Close(); err1 != nil || err2 != nil || err != nil || got != want || n != len(want) {
					errs <- fmt.Errorf("session %d, round %d: %d/%d bytes back, %v %v %v", i, j, len(got), n, err1, err2, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
