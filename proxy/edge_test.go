package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A client that writes a very large pipelined batch before it reads any
// reply (pgconn reads what arrives meanwhile into memory, as Postgres's
// own clients do) gets every reply: pgfence never stops reading one side
// while the other waits on it.
func TestHugePipeline(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 100000
	pl := c.PgConn().StartPipeline(ctx)
	for i := range n {
		pl.SendQueryParams("select $1::text", [][]byte{[]byte(fmt.Sprint(i))}, nil, nil, nil)
	}
	if err := pl.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		res, err := pl.GetResults()
		if err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
		rr, ok := res.(*pgconn.ResultReader)
		if !ok {
			t.Fatalf("result %d: %T", i, res)
		}
		if _, err := rr.Close(); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
	}
	if res, err := pl.GetResults(); err != nil {
		t.Fatal(err)
	} else if _, ok := res.(*pgconn.PipelineSync); !ok {
		t.Fatalf("after the results: %T, want the Sync", res)
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
}

// A NoticeResponse in the middle of COPY FROM STDIN reaches the client,
// and the COPY completes.
func TestNoticeInsideCopyIn(t *testing.T) {
	p := pgtest.StartProxy(t, nil)
	c := p.Connect(t)
	pgtest.Exec(t, c, `DROP TABLE IF EXISTS copy_notice; CREATE TABLE copy_notice (id int, s text);
		CREATE FUNCTION pg_temp.noisy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'row %', NEW.id; RETURN NEW; END $$;
		CREATE TRIGGER noisy BEFORE INSERT ON copy_notice FOR EACH ROW EXECUTE FUNCTION pg_temp.noisy()`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS copy_notice") })
	var b strings.Builder
	big := strings.Repeat("x", 10000)
	for i := range 1000 {
		fmt.Fprintf(&b, "%d\t%s\n", i, big)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader(b.String()), "COPY copy_notice FROM STDIN")
	if err != nil || tag.RowsAffected() != 1000 {
		t.Fatalf("COPY FROM with a NOTICE per row: %v %v", tag, err)
	}
}
