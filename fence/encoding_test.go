package fence_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// nonASCIITable creates a guarded-shaped table with a non-ASCII name (the
// UTF-8 text of name, quoted) holding row (1, 'init', 5), and returns its
// name quoted as SQL names it.
func nonASCIITable(t *testing.T, name string) string {
	t.Helper()
	q := `"` + name + `"`
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS "+q+"; CREATE TABLE "+q+" (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)")
	pgtest.Exec(t, db, "INSERT INTO "+q+" VALUES (1, 'init', 5)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+q) })
	return q
}

// latin1 is s (UTF-8 text of Latin-1 characters) in LATIN1 bytes.
func latin1(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			panic("not Latin-1: " + s)
		}
		b = append(b, byte(r))
	}
	return string(b)
}

// wantEncodingRefusal checks that err is pgfence's refusal of non-ASCII
// text in a LATIN1 session.
func wantEncodingRefusal(t *testing.T, what string, err error) {
	t.Helper()
	pe := pgErr(t, err)
	if pe.Code != "0A000" || !strings.Contains(pe.Message, "client_encoding UTF8") || !strings.Contains(pe.Message, "LATIN1") ||
		pe.Hint != "SET client_encoding = 'UTF8'" {
		t.Fatalf("%s: %s %q (hint %q), want pgfence's 0A000 client_encoding refusal", what, pe.Code, pe.Message, pe.Hint)
	}
}

// A guarded table whose name is not ASCII is spelled in other bytes in a
// LATIN1 session than the UTF-8 ones pgfence looks for: its writes must be
// refused, not passed unfenced because the name prefilter missed them.
// pgconn sends a Go string's bytes as they are, so the LATIN1 bytes of the
// text are what goes on the wire.
func TestEncodingLatin1WriteToNonASCIITable(t *testing.T) {
	tbl := nonASCIITable(t, "kontö")
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '3'")
	pgtest.Exec(t, c, "SET client_encoding = 'LATIN1'")
	upd := latin1(`UPDATE "kontö" SET val = 'stale' WHERE id = 1`)
	if upd == `UPDATE "kontö" SET val = 'stale' WHERE id = 1` || strings.Contains(upd, "ö") {
		t.Fatal("the text is not in LATIN1 bytes")
	}
	unchanged := func(what string) {
		t.Helper()
		if v, e := row(t, tbl, 1); v != "init" || e != 5 {
			t.Fatalf("%s: row = (%s, %d), want (init, 5): a stale write got through unfenced", what, v, e)
		}
	}

	// Simple protocol.
	_, err := c.PgConn().Exec(ctx, upd).ReadAll()
	wantEncodingRefusal(t, "simple protocol", err)
	unchanged("simple protocol")

	// Extended protocol: Parse, Bind, Execute.
	err = c.PgConn().ExecParams(ctx, upd, nil, nil, nil, nil).Read().Err
	wantEncodingRefusal(t, "extended protocol", err)
	unchanged("extended protocol")
	_, err = c.PgConn().Prepare(ctx, "stale_upd", upd, nil)
	if err == nil {
		err = c.PgConn().ExecPrepared(ctx, "stale_upd", nil, nil, nil).Read().Err
	}
	wantEncodingRefusal(t, "prepared statement", err)
	unchanged("prepared statement")

	// Other writes, and one whose non-ASCII name hides in a literal too.
	for _, sql := range []string{
		`DELETE FROM "kontö" WHERE id = 1`,
		`INSERT INTO "kontö" (id, val) VALUES (2, 'neu')`,
		`WITH x AS (UPDATE "kontö" SET val = 'ö' WHERE id = 1 RETURNING 1) SELECT * FROM x`,
	} {
		_, err := c.PgConn().Exec(ctx, latin1(sql)).ReadAll()
		wantEncodingRefusal(t, sql, err)
		unchanged(sql)
	}

	// A text that spells no write keyword cannot write, however its bytes
	// are read: a query of the table still works in LATIN1.
	rs, err := c.PgConn().Exec(ctx, latin1(`SELECT val, fence_epoch FROM "kontö" WHERE id = 1`)).ReadAll()
	if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "init" {
		t.Fatalf("LATIN1 query: %v %v", rs, err)
	}
	r := c.PgConn().ExecParams(ctx, latin1(`SELECT val FROM "kontö" WHERE val <> 'ä'`), nil, nil, nil, nil).Read()
	if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != "init" {
		t.Fatalf("LATIN1 extended query: %v %v", r.Rows, r.Err)
	}
	// ASCII text reads the same in every encoding: a query naming the
	// table in a U& escape passes, but the fence of a write would name it
	// in UTF-8, which this session's server reads as "kontÃ¶".
	rs, err = c.PgConn().Exec(ctx, `SELECT val FROM U&"kont\00f6" WHERE id = 1`).ReadAll()
	if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "init" {
		t.Fatalf("LATIN1 query, ASCII text: %v %v", rs, err)
	}
	for _, sql := range []string{
		`UPDATE U&"kont\00f6" SET val = 'stale' WHERE id = 1`,
		`UPDATE U&"kont\00f6" SET val = 'stale' WHERE id = 1`, // from the cache
	} {
		_, err = c.PgConn().Exec(ctx, sql).ReadAll()
		wantEncodingRefusal(t, "LATIN1, ASCII text", err)
		unchanged("ASCII text")
	}

	// A fresh UTF8 session fences the table as usual.
	u := p.Connect(t)
	pgtest.Exec(t, u, "SET fence.token = '3'")
	if tag := pgtest.Exec(t, u, `UPDATE "kontö" SET val = 'stale' WHERE id = 1`, pgx.QueryExecModeSimpleProtocol); tag != "UPDATE 0" {
		t.Fatalf("UTF8, stale token: %s, want UPDATE 0", tag)
	}
	if tag := pgtest.Exec(t, u, `UPDATE "kontö" SET val = 'stale' WHERE id = 1`); tag != "UPDATE 0" {
		t.Fatalf("UTF8, stale token, extended: %s, want UPDATE 0", tag)
	}
	unchanged("UTF8 session")
	pgtest.Exec(t, u, "SET fence.token = '7'")
	if tag := pgtest.Exec(t, u, `UPDATE "kontö" SET val = 'fresh' WHERE id = 1`, pgx.QueryExecModeSimpleProtocol); tag != "UPDATE 1" {
		t.Fatalf("UTF8, fresh token: %s, want UPDATE 1", tag)
	}
	if v, e := row(t, tbl, 1); v != "fresh" || e != 7 {
		t.Fatalf("after the fresh write: (%s, %d), want (fresh, 7)", v, e)
	}
}

// The name check runs before the session's memo of the last text it
// passed: a text passed in a UTF8 session (where its LATIN1 bytes are
// invalid and Postgres rejects it) is judged again once the session reads
// LATIN1.
func TestEncodingChangeAfterPassedText(t *testing.T) {
	tbl := nonASCIITable(t, "konto_ä")
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '3'")
	upd := latin1(`UPDATE "konto_ä" SET val = 'stale' WHERE id = 1`)
	_, err := c.PgConn().Exec(ctx, upd).ReadAll()
	if pe := pgErr(t, err); pe.Code != "22021" {
		t.Fatalf("LATIN1 bytes in a UTF8 session: %s %q, want 22021", pe.Code, pe.Message)
	}
	// DISCARD PLANS keeps the policy from noting this text as its last.
	if _, err := c.PgConn().Exec(ctx, "SET client_encoding = 'LATIN1'; DISCARD PLANS").ReadAll(); err != nil {
		t.Fatal(err)
	}
	_, err = c.PgConn().Exec(ctx, upd).ReadAll()
	wantEncodingRefusal(t, "the same text in LATIN1", err)
	if v, e := row(t, tbl, 1); v != "init" || e != 5 {
		t.Fatalf("row = (%s, %d), want (init, 5)", v, e)
	}
}

// Guarded names that are all ASCII are spelled in the same bytes in every
// client encoding: a LATIN1 write with non-ASCII text to another table
// passes as before, and one to the guarded table is refused as before.
func TestEncodingASCIINamesUnchanged(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 5})
	other := nonASCIITable(t, "tüte")
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '3'")
	pgtest.Exec(t, c, "SET client_encoding = 'LATIN1'")
	rs, err := c.PgConn().Exec(ctx, latin1(`UPDATE "tüte" SET val = 'ö' WHERE id = 1`)).ReadAll()
	if err != nil || rs[0].CommandTag.String() != "UPDATE 1" {
		t.Fatalf("unguarded non-ASCII table: %v %v", rs, err)
	}
	if v, _ := row(t, other, 1); v != "ö" {
		t.Fatalf("unguarded table: val = %q", v)
	}
	_, err = c.PgConn().Exec(ctx, latin1("UPDATE "+tbl+" SET val = 'ö' WHERE id = 1")).ReadAll()
	wantEncodingRefusal(t, "guarded ASCII name, non-ASCII text", err)
}

// A SQL_ASCII client's bytes are taken as they are, in the server's
// encoding: on a LATIN1 database "kont\xf6" is the guarded "kontö", whose
// name pgfence has in UTF-8. Such writes are refused too, while a UTF8
// session on that database is fenced as usual.
func TestEncodingSQLASCIIOnLatin1Database(t *testing.T) {
	pgtest.Need(t)
	const db = "pgfence_latin1"
	direct := pgtest.Direct(t)
	pgtest.Exec(t, direct, "DROP DATABASE IF EXISTS "+db)
	pgtest.Exec(t, direct, "CREATE DATABASE "+db+" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	// pgx leaves client_encoding to the server, whose default is the
	// database's encoding.
	ldb := pgtest.Connect(t, pgtest.Server().URL(db)+"&client_encoding=UTF8")
	pgtest.Exec(t, ldb, `CREATE TABLE "kontö" (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0)`)
	pgtest.Exec(t, ldb, `INSERT INTO "kontö" VALUES (1, 'init', 5)`)
	unchanged := func(what string) {
		t.Helper()
		var v string
		var e int64
		if err := ldb.QueryRow(ctx, `SELECT val, fence_epoch FROM "kontö" WHERE id = 1`).Scan(&v, &e); err != nil {
			t.Fatal(err)
		}
		if v != "init" || e != 5 {
			t.Fatalf("%s: row = (%s, %d), want (init, 5): a stale write got through unfenced", what, v, e)
		}
	}

	p := pgtest.StartProxy(t, []string{`"kontö"`})
	url := strings.Replace(p.URL("client_encoding=UTF8"), "/postgres?", "/"+db+"?", 1)
	c := pgtest.Connect(t, url)
	pgtest.Exec(t, c, "SET fence.token = '3'")
	pgtest.Exec(t, c, "SET client_encoding = 'SQL_ASCII'")
	upd := latin1(`UPDATE "kontö" SET val = 'stale' WHERE id = 1`)
	_, err := c.PgConn().Exec(ctx, upd).ReadAll()
	pe := pgErr(t, err)
	if pe.Code != "0A000" || !strings.Contains(pe.Message, "SQL_ASCII (read as LATIN1)") || pe.Hint != "SET client_encoding = 'UTF8'" {
		t.Fatalf("SQL_ASCII on LATIN1: %s %q (hint %q)", pe.Code, pe.Message, pe.Hint)
	}
	unchanged("SQL_ASCII on LATIN1")
	rs, err := c.PgConn().Exec(ctx, latin1(`SELECT val FROM "kontö" WHERE id = 1`)).ReadAll()
	if err != nil || len(rs) != 1 || len(rs[0].Rows) != 1 || string(rs[0].Rows[0][0]) != "init" {
		t.Fatalf("SQL_ASCII query: %v %v", rs, err)
	}

	u := pgtest.Connect(t, url)
	pgtest.Exec(t, u, "SET fence.token = '3'")
	if tag := pgtest.Exec(t, u, `UPDATE "kontö" SET val = 'stale' WHERE id = 1`, pgx.QueryExecModeSimpleProtocol); tag != "UPDATE 0" {
		t.Fatalf("UTF8 on LATIN1, stale token: %s, want UPDATE 0", tag)
	}
	unchanged("UTF8 on LATIN1")
}

// A client that pipelines its write behind SET client_encoding, without
// waiting for the SET's reply, must not have the write judged in the old
// encoding: pgfence learns the new one only from that reply, so the write
// waits for it. In the simple protocol, and in one extended-protocol batch
// behind the SET's Sync.
func TestEncodingPipelinedBehindSet(t *testing.T) {
	tbl := nonASCIITable(t, "kontö_p")
	p := pgtest.StartProxy(t, []string{tbl})
	upd := latin1(`UPDATE "kontö_p" SET val = 'stale' WHERE id = 1`)
	for _, extended := range []bool{false, true} {
		conn, fe := pgtest.RawSession(t, p.Addr)
		_ = conn
		fe.Send(&pgproto3.Query{String: "SET fence.token = '3'"})
		fe.Send(&pgproto3.Query{String: "SET client_encoding = 'LATIN1'"})
		if extended {
			fe.Send(&pgproto3.Parse{Query: upd})
			fe.Send(&pgproto3.Bind{})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
		} else {
			fe.Send(&pgproto3.Query{String: upd})
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got *pgproto3.ErrorResponse
		tags, errs := pgtest.Replies(t, fe, 3)
		if len(errs) > 0 {
			got = &errs[len(errs)-1]
		}
		if got == nil || got.Code != "0A000" || !strings.Contains(got.Message, "LATIN1") {
			t.Fatalf("extended %v: the pipelined write got %v, tags %q; want pgfence's 0A000 client_encoding refusal", extended, got, tags)
		}
		if v, e := row(t, tbl, 1); v != "init" || e != 5 {
			t.Fatalf("extended %v: row = (%s, %d): a write pipelined behind SET client_encoding got through unfenced", extended, v, e)
		}
	}
}

// The same for standard_conforming_strings: a write pipelined behind SET
// standard_conforming_strings = off is judged with it off, and refused.
func TestStandardStringsPipelinedBehindSet(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	_, fe := pgtest.RawSession(t, p.Addr)
	fe.Send(&pgproto3.Query{String: "SET fence.token = '3'"})
	fe.Send(&pgproto3.Query{String: "SET standard_conforming_strings = off"})
	fe.Send(&pgproto3.Query{String: "UPDATE " + tbl + " SET val = 'stale' WHERE id = 1"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got *pgproto3.ErrorResponse
	if _, errs := pgtest.Replies(t, fe, 3); len(errs) > 0 {
		got = &errs[len(errs)-1]
	}
	if got == nil || got.Code != "0A000" || !strings.Contains(got.Message, "standard_conforming_strings") {
		t.Fatalf("the write pipelined behind SET standard_conforming_strings = off got %v; want pgfence's 0A000 refusal", got)
	}
	if v, e := row(t, tbl, 1); v != "init" || e != 5 {
		t.Fatalf("row = (%s, %d)", v, e)
	}
}
