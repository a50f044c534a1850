package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/netfault"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
)

// Both of pgfence's peers at random speeds: a relay in front of pgfence
// and one between it and Postgres sleep a random while before each chunk
// they forward, changing every few milliseconds (or the client reads at a
// pace of its own, straight to a pgfence straight to Postgres, where the
// sockets fill), while four sessions run
// random mixes of large pipelines, COPY both ways with a NOTICE per row,
// results larger than any buffer, and LISTEN/NOTIFY. Every reply must
// arrive whole and in order: backpressure must never make pgfence stop
// reading one side while the other waits on it.
func TestRandomSpeeds(t *testing.T) {
	pgtest.Need(t)
	up, err := netfault.NewRelay(pgtest.Server().Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	p := pgtest.StartRelay(t, func(pc *proxy.Config) {
		pc.Upstream, pc.UpstreamTLS = up.Addr(), nil
	})
	// Half the sessions reach that pgfence through a relay at random
	// speeds; the others reach one straight in front of Postgres
	// directly, and read their replies at random speeds.
	direct := pgtest.StartRelay(t)
	down, err := netfault.NewRelay(p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { down.Close() })

	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS speed_copy; CREATE TABLE speed_copy (id int, s text);
		CREATE OR REPLACE FUNCTION speed_noisy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'row %', NEW.id; RETURN NEW; END $$;
		CREATE TRIGGER noisy BEFORE INSERT ON speed_copy FOR EACH ROW EXECUTE FUNCTION speed_noisy()`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS speed_copy; DROP FUNCTION IF EXISTS speed_noisy()")
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the speeds
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		delays := []time.Duration{0, 0, 100 * time.Microsecond, time.Millisecond, 3 * time.Millisecond}
		for {
			select {
			case <-stop:
				up.SetDelay(0)
				down.SetDelay(0)
				return
			case <-time.After(time.Duration(5+rng.IntN(20)) * time.Millisecond):
			}
			up.SetDelay(delays[rng.IntN(len(delays))])
			down.SetDelay(delays[rng.IntN(len(delays))])
		}
	}()

	const sessions, steps = 4, 12
	errs := make(chan error, sessions)
	for k := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := direct
			if k%2 == 1 {
				target = &pgtest.Proxy{Addr: down.Addr()}
			}
			errs <- speedSession(ctx, target, k, steps)
		}()
	}
	for range sessions {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}

// speedSession runs steps random workloads on a session of its own.
func speedSession(ctx context.Context, p *pgtest.Proxy, k, steps int) error {
	cfg, err := pgconn.ParseConfig(p.URL("application_name=speed"))
	if err != nil {
		return err
	}
	notes := make(chan string, 100)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { notes <- n.Payload }
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	rng := rand.New(rand.NewPCG(uint64(k), 7))
	for step := range steps {
		what := rng.IntN(4)
		if err := speedStep(ctx, c, k, step, what, rng, notes); err != nil {
			return fmt.Errorf("session %d, step %d (%d): %w", k, step, what, err)
		}
	}
	return nil
}

func speedStep(ctx context.Context, c *pgconn.PgConn, k, step, what int, rng *rand.Rand, notes <-chan string) error {
	switch what {
	case 0: // a large pipeline, written before any reply is read
		n := 20000 + rng.IntN(80000)
		pl := c.StartPipeline(ctx)
		for i := range n {
			pl.SendQueryParams("select $1::text", [][]byte{[]byte(fmt.Sprint(i))}, nil, nil, nil)
		}
		if err := pl.Sync(); err != nil {
			return err
		}
		for i := range n {
			res, err := pl.GetResults()
			if err != nil {
				return err
			}
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				return fmt.Errorf("pipeline result %d of %d: %T", i, n, res)
			}
			if i%5000 == 4999 && rng.IntN(2) == 0 {
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // a reader at its own pace
			}
			r := rr.Read()
			if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != fmt.Sprint(i) {
				return fmt.Errorf("pipeline result %d of %d: %v %v", i, n, r.Rows, r.Err)
			}
		}
		if _, err := pl.GetResults(); err != nil {
			return err
		}
		return pl.Close()
	case 1: // COPY in, a NOTICE per row, then the same rows out
		rows := 200 + rng.IntN(800)
		var b strings.Builder
		for i := range rows {
			fmt.Fprintf(&b, "%d\t%s\n", k*1000000+step*10000+i, strings.Repeat("z", 2000))
		}
		tag, err := c.CopyFrom(ctx, strings.NewReader(b.String()), "COPY speed_copy FROM STDIN")
		if err != nil || tag.RowsAffected() != int64(rows) {
			return fmt.Errorf("COPY FROM %d rows: %v %v", rows, tag, err)
		}
		var out bytes.Buffer
		lo := k*1000000 + step*10000
		_, err = c.CopyTo(ctx, &out, fmt.Sprintf("COPY (SELECT id, s FROM speed_copy WHERE id BETWEEN %d AND %d ORDER BY id) TO STDOUT", lo, lo+9999))
		if err != nil || out.String() != b.String() {
			return fmt.Errorf("COPY TO: %d bytes back of %d, %v", out.Len(), b.Len(), err)
		}
	case 2: // a result larger than any buffer
		n := 1000 + rng.IntN(5000)
		rr := c.ExecParams(ctx, fmt.Sprintf("SELECT g, repeat('w', 3000) FROM generate_series(1, %d) g", n), nil, nil, nil, nil)
		got := 0
		for rr.NextRow() {
			got++
		}
		if _, err := rr.Close(); err != nil || got != n {
			return fmt.Errorf("big result: %d rows of %d, %v", got, n, err)
		}
	case 3: // a notification to itself, between statements
		ch := fmt.Sprintf("speed_%d", k)
		res, err := c.Exec(ctx, fmt.Sprintf("LISTEN %s; SELECT pg_notify('%s', '%d')", ch, ch, step)).ReadAll()
		if err != nil || len(res) != 2 {
			return fmt.Errorf("LISTEN/NOTIFY: %v", err)
		}
		if _, err := c.Exec(ctx, "UNLISTEN "+ch).ReadAll(); err != nil {
			return err
		}
		select {
		case got := <-notes:
			if got != fmt.Sprint(step) {
				return fmt.Errorf("notification %q, want %d", got, step)
			}
		default:
			return fmt.Errorf("the notification to itself did not arrive")
		}
	}
	return nil
}
