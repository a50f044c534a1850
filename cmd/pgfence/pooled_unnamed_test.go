package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgbouncer"
)

// Behind a transaction pooler, a Bind of the unnamed statement that the
// client parsed in an earlier transaction fails with 26000, as on a server
// connection of its own once the statement is gone: the transaction may
// run on a server connection where the unnamed statement is another
// client's (red team 6a: client B's Bind ran client A's UPDATE with B's
// parameters). In one server connection for both, B parses a SELECT,
// A parses and runs an UPDATE of the guarded table, then B binds its
// unnamed statement again without a Parse: the Bind fails, A's UPDATE does
// not run again, and B's next Parse and Bind in one transaction work.
func TestServePooledUnnamedStatementOfEarlierTransaction(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE accounts (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO accounts VALUES (1, 'a', 0)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := s.bouncerWith(pgbouncer.Options{PoolMode: "transaction", PoolSize: 1})
	inst := s.serve(serveOptions{upstream: "postgres://postgres@" + b.Addr() + "/postgres?sslmode=disable",
		upstreamPooling: poolingTransaction, backstop: "off", policyOptions: policyOptions{guards: []string{"accounts"}}})
	connect := func(tok string) *pgconn.PgConn {
		c, err := pgconn.Connect(ctx, "postgres://postgres@"+inst.Addr()+"/postgres?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		if _, err := c.Exec(ctx, "SET fence.token = '"+tok+"'").ReadAll(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// run sends msgs and a Sync, and returns the codes of the errors and
	// the command tags up to ReadyForQuery.
	run := func(c *pgconn.PgConn, msgs ...pgproto3.FrontendMessage) (codes, tags []string) {
		fe := c.Frontend()
		for _, m := range msgs {
			fe.Send(m)
		}
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch m := msg.(type) {
			case *pgproto3.ErrorResponse:
				codes = append(codes, m.Code)
			case *pgproto3.CommandComplete:
				tags = append(tags, string(m.CommandTag))
			case *pgproto3.ReadyForQuery:
				return codes, tags
			}
		}
	}
	clientB, clientA := connect("60"), connect("70")
	if codes, _ := run(clientB, &pgproto3.Parse{Query: "SELECT $1::int + $2::int"}); len(codes) > 0 {
		t.Fatalf("B's Parse: %v", codes)
	}
	if codes, tags := run(clientA, &pgproto3.Parse{Query: "UPDATE accounts SET val = $1 WHERE id = $2"},
		&pgproto3.Bind{Parameters: [][]byte{[]byte("byA"), []byte("1")}}, &pgproto3.Execute{}); len(codes) > 0 || strings.Join(tags, ",") != "UPDATE 1" {
		t.Fatalf("A's UPDATE: %v %v", codes, tags)
	}
	codes, tags := run(clientB, &pgproto3.Bind{Parameters: [][]byte{[]byte("7"), []byte("1")}}, &pgproto3.Execute{})
	if strings.Join(codes, ",") != "26000" || len(tags) > 0 {
		t.Fatalf("B's Bind of its unnamed statement from an earlier transaction: errors %v, tags %v; want 26000 and nothing run", codes, tags)
	}
	if v, e := s.epoch("accounts", 1); v != "byA" || e != 70 {
		t.Fatalf("row 1 is %q at %d, want A's write (byA at 70) alone", v, e)
	}
	codes, tags = run(clientB, &pgproto3.Parse{Query: "SELECT $1::int + $2::int"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("7"), []byte("6")}}, &pgproto3.Execute{})
	if len(codes) > 0 || strings.Join(tags, ",") != "SELECT 1" {
		t.Fatalf("B's Parse, Bind and Execute in one transaction: %v %v", codes, tags)
	}
}
