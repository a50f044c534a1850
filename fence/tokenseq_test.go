package fence_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// FuzzTokenSetSequences sends the same sequence of SETs of the token,
// reads of it and transaction control straight to Postgres and through
// pgfence, and fails unless both answer alike, message by message and
// value by value. pgfence answers the SETs it may itself (idle, or in a
// block that has not failed) and runs them on the server later, ahead of
// the next statement; there they must mean what Postgres says they mean:
// undone with a block or a savepoint rolled back, a SET LOCAL until its
// block ends, a SET over an earlier SET LOCAL, refused in a failed block.
// No write is sent, so the tokens may go up and down. The seed corpus runs
// in every test run; go test -fuzz looks further.
func FuzzTokenSetSequences(f *testing.F) {
	pgtest.Need(f)
	p := pgtest.StartProxy(f, nil)
	addRandomSeeds(f, rand.NewPCG(3, 4), 60, 6, 30)
	// BEGIN; SET 1; SET LOCAL 2; SHOW; COMMIT; SHOW.
	f.Add([]byte{0, 16*1 + 6, 16*2 + 7, 10, 1, 10})
	// BEGIN; SET LOCAL 3; SET 4; SET LOCAL 5; COMMIT; SHOW.
	f.Add([]byte{0, 16*3 + 7, 16*4 + 6, 16*5 + 7, 1, 10})
	// SET 1; BEGIN; SAVEPOINT; SET 6 (unnamed unit); ROLLBACK TO; read;
	// SET LOCAL 7 (unnamed unit); RELEASE; COMMIT; read.
	f.Add([]byte{16*1 + 6, 0, 3, 16*6 + 8, 4, 11, 16*7 + 9, 5, 1, 11})
	// BEGIN; SET 8; 1/0; SET 9 (refused); ROLLBACK; SHOW.
	f.Add([]byte{0, 16*8 + 6, 12, 16*9 + 6, 2, 10})
	// BEGIN; SET 2 prepared and bound; SET LOCAL 3; SHOW; ROLLBACK; SHOW.
	f.Add([]byte{0, 16*2 + 13, 16*3 + 7, 10, 2, 10})
	f.Fuzz(func(t *testing.T, program []byte) {
		msgs := tokenSetSequence(program)
		pipelined := len(program) > 0 && program[0]&1 == 1
		want := runTokenSets(t, pgtest.Server().Addr(), msgs, pipelined)
		got := runTokenSets(t, p.Addr, msgs, pipelined)
		if strings.Join(want, "\n") != strings.Join(got, "\n") {
			t.Fatalf("pgfence answered otherwise than Postgres (pipelined %v)\n%s", pipelined, sideBySide(msgs, want, got))
		}
	})
}

// tokenSetSequence turns bytes into messages: each byte's low four bits
// pick what to send, its high four bits the token.
func tokenSetSequence(program []byte) []pgproto3.FrontendMessage {
	var msgs []pgproto3.FrontendMessage
	query := func(sql string) { msgs = append(msgs, &pgproto3.Query{String: sql}) }
	unit := func(sql string) { // as libpq's PQexecParams sends it
		msgs = append(msgs, &pgproto3.Parse{Query: sql}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{}, &pgproto3.Sync{})
	}
	for i, b := range program {
		token := fmt.Sprint(int(b>>4) + 10)
		set, local := "SET fence.token = '"+token+"'", "SET LOCAL fence.token = '"+token+"'"
		switch b & 15 {
		case 0:
			query("BEGIN")
		case 1:
			query("COMMIT")
		case 2:
			query("ROLLBACK")
		case 3:
			query("SAVEPOINT s")
		case 4:
			query("ROLLBACK TO SAVEPOINT s")
		case 5:
			query("RELEASE SAVEPOINT s")
		case 6:
			query(set)
		case 7:
			query(local)
		case 8:
			unit(set)
		case 9:
			unit(local)
		case 10:
			query("SHOW fence.token")
		case 11:
			unit("SELECT current_setting('fence.token', true)")
		case 12:
			query("SELECT 1/0")
		case 13: // prepared under a name of its own, then bound alone
			name := fmt.Sprint("t", i)
			msgs = append(msgs, &pgproto3.Parse{Name: name, Query: set}, &pgproto3.Sync{},
				&pgproto3.Bind{PreparedStatement: name}, &pgproto3.Execute{}, &pgproto3.Sync{})
		case 14: // a SET with a read pipelined behind it
			msgs = append(msgs, &pgproto3.Query{String: local}, &pgproto3.Query{String: "SHOW fence.token"})
		case 15:
			query(set + "; SHOW fence.token")
		}
	}
	return msgs
}

// runTokenSets runs msgs in a new session at addr and returns what each
// reply said.
func runTokenSets(t *testing.T, addr string, msgs []pgproto3.FrontendMessage, pipelined bool) []string {
	conn, fe := pgtest.RawSession(t, addr)
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	replies := sendAll(t, fe, msgs, pipelined)
	endSession(t, conn, fe)
	return replies
}
