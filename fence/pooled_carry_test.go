package fence_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgbouncer"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Behind a transaction pooler, nothing one client leaves on a server
// connection may change what the next client's writes carry. Every test
// here runs clients one after another on PgBouncer's single server
// connection (pool size 1), through pgfence, against rows at epoch 5:
// row 1 of each table is what a stale holder (token 3) tries to write,
// row 2 (epoch 0) what a fresh one writes.

// carry is one such setup: a plain guarded table, one in a lock domain
// (whose token is at 5 too), PgBouncer and pgfence.
type carry struct {
	t          *testing.T
	plain, dom string
	domain     string
	p          *pgtest.Proxy
	b          *pgbouncer.PgBouncer
}

func newCarry(t *testing.T) *carry {
	t.Helper()
	c := &carry{t: t}
	base := table(t, [3]any{1, "p1", 5}, [3]any{2, "p2", 0})
	c.plain = base
	c.dom = base + "_d"
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0);"+
		" INSERT INTO %[1]s VALUES (1, 'd1', 5), (2, 'd2', 0)", c.dom))
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS "+c.dom) })
	c.domain = "carry" + fmt.Sprint(len(t.Name()))
	pgtest.Exec(t, db, sqlrewrite.DomainTableDDL())
	pgtest.Exec(t, db, "DELETE FROM pgfence.domains WHERE domain = $1", c.domain)
	pgtest.Exec(t, db, sqlrewrite.DomainRowSQL(), c.domain)
	pgtest.Exec(t, db, "UPDATE pgfence.domains SET token = 5 WHERE domain = $1", c.domain)
	c.b = startBouncer(t, "transaction", 1)
	c.p = pgtest.StartProxy(t, []string{c.plain, c.dom}, func(pc *proxy.Config, fc *fence.Config) {
		pc.Upstream, pc.UpstreamTLS = c.b.Addr(), nil
		pc.GoroutineRelay = false // transaction pooling needs the event loop
		pc.TransactionPooling, pc.TokenSetting = true, "fence.token"
		fc.TransactionPooling = true
		for i := range fc.Guards {
			if fc.Guards[i].Table == c.dom {
				fc.Guards[i].Domain = c.domain
			}
		}
	})
	return c
}

// client connects a client through pgfence, with its token set (none for
// "").
func (c *carry) client(token string, params ...string) *pgx.Conn {
	c.t.Helper()
	cfg, err := pgx.ParseConfig(c.p.URL(params...))
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close(ctx) })
	if token != "" {
		exec(c.t, conn, simple, "SET fence.token = '"+token+"'")
	}
	return conn
}

// stale checks that a stale client's writes of row 1 of both tables change
// nothing, however it sends them, and that both rows are still as they
// were.
func (c *carry) stale(conn *pgx.Conn, sqls ...string) {
	c.t.Helper()
	if len(sqls) == 0 {
		sqls = []string{"UPDATE %s SET val = 'stale' WHERE id = 1"}
	}
	for _, tbl := range []string{c.plain, c.dom} {
		for _, f := range sqls {
			sql := fmt.Sprintf(f, tbl)
			tag, err := conn.Exec(ctx, sql, simple)
			if err != nil || !strings.HasSuffix(tag.String(), "UPDATE 0") {
				c.t.Errorf("a stale write (%s): %q, %v; want UPDATE 0", sql, tag, err)
			}
		}
	}
	c.untouched()
}

// untouched checks that row 1 of both tables is still at epoch 5.
func (c *carry) untouched() {
	c.t.Helper()
	for _, tbl := range []string{c.plain, c.dom} {
		if v, e := row(c.t, tbl, 1); e != 5 || strings.Contains(v, "stale") || strings.Contains(v, "none") {
			c.t.Errorf("row 1 of %s is %q at epoch %d: a write that should have changed nothing landed", tbl, v, e)
		}
	}
}

// none checks that the writes of a client without a token are refused
// for want of one.
func (c *carry) none(conn *pgx.Conn, sqls ...string) {
	c.t.Helper()
	if len(sqls) == 0 {
		sqls = []string{"UPDATE %s SET val = 'none' WHERE id = 1"}
	}
	for _, tbl := range []string{c.plain, c.dom} {
		for _, f := range sqls {
			sql := fmt.Sprintf(f, tbl)
			_, err := conn.Exec(ctx, sql, simple)
			if err == nil {
				c.t.Errorf("a write without a token (%s) ran; want 55000", sql)
				continue
			}
			if pe := pgErr(c.t, err); pe.Code != "55000" {
				c.t.Errorf("a write without a token (%s): %s %s; want 55000", sql, pe.Code, pe.Message)
			}
		}
	}
	c.untouched()
}

// fresh checks that a client's write of row 2 of tbl lands stamped with
// its token.
func (c *carry) fresh(conn *pgx.Conn, tbl string, token int64, sql string) {
	c.t.Helper()
	if sql == "" {
		sql = "UPDATE %s SET val = 'fresh' WHERE id = 2"
	}
	sql = fmt.Sprintf(sql, tbl)
	tag, err := conn.Exec(ctx, sql, simple)
	if err != nil || !strings.HasSuffix(tag.String(), "UPDATE 1") {
		c.t.Errorf("a fresh write with token %d (%s): %q, %v; want UPDATE 1", token, sql, tag, err)
		return
	}
	if _, e := row(c.t, tbl, 2); e != token {
		c.t.Errorf("a fresh write with token %d (%s) stamped %d", token, sql, e)
	}
}

// clean checks that the server connection keeps no token for the session,
// read through PgBouncer straight: what its next client would find.
func (c *carry) clean() {
	c.t.Helper()
	direct := bouncerConn(c.t, c.b)
	defer direct.Close(ctx)
	for _, name := range []string{"fence.token", "fence.token." + c.domain} {
		var v string
		if err := direct.QueryRow(ctx, "SELECT coalesce(current_setting($1, true), '')", name).Scan(&v); err != nil {
			c.t.Fatal(err)
		}
		if v != "" {
			c.t.Errorf("the pooled server connection keeps %s = %q for its next client", name, v)
		}
	}
}

// leave has a client set tokens at session level on the server connection
// in ways pgfence cannot see in the text: a function, a DO block.
func (c *carry) leave(token string) {
	c.t.Helper()
	db := pgtest.Direct(c.t)
	fn := "use_lease_" + c.plain
	pgtest.Exec(c.t, db, fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s(t text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('fence.token', t, false);
	PERFORM set_config('fence.token.%s', t, false);
END $$`, fn, c.domain))
	c.t.Cleanup(func() { pgtest.Exec(c.t, pgtest.Direct(c.t), "DROP FUNCTION IF EXISTS "+fn+"(text)") })
	l := c.client("")
	exec(c.t, l, simple, "SELECT "+fn+"('"+token+"')")
	exec(c.t, l, simple, "DO $$ BEGIN PERFORM set_config('fence.token.' || '"+c.domain+"', '"+token+"', false); END $$")
	l.Close(ctx)
}

// 1. Setting names are matched as Postgres matches them, in any case and
// quoted: a SET of the token or of a lock domain's spelled so is the
// session's, kept by pgfence, never left on the server connection.
func TestPooledTokenNameCase(t *testing.T) {
	c := newCarry(t)
	a := c.client("")
	d := strings.ToUpper(c.domain)
	for _, sql := range []string{`SET "FENCE.TOKEN" = '9'`, `SET "fence.token.` + d + `" = '9'`} {
		if _, err := a.Exec(ctx, sql, simple); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	c.fresh(a, c.plain, 9, "")
	c.fresh(a, c.dom, 9, "")
	c.clean()
	// Read and set LOCAL in any spelling, it is the session's token, and a
	// SET LOCAL stands for its transaction.
	var got string
	if err := a.QueryRow(ctx, `SHOW "FENCE"."TOKEN"`, simple).Scan(&got); err != nil || got != "9" {
		t.Errorf(`SHOW "FENCE"."TOKEN": %q, %v; want 9`, got, err)
	}
	exec(t, a, simple, "BEGIN")
	exec(t, a, simple, "SET LOCAL Fence . Token = '11'")
	exec(t, a, simple, "UPDATE "+c.plain+" SET val = 'local' WHERE id = 2")
	exec(t, a, simple, "COMMIT")
	if _, e := row(t, c.plain, 2); e != 11 {
		t.Errorf("a write after SET LOCAL Fence . Token = '11' stamped %d", e)
	}
	if got := show(t, a); got != "9" {
		t.Errorf("after the block, the session's token reads %q, want 9", got)
	}
	c.none(c.client(""))
	c.stale(c.client("3"))

	// RESET in any case drops it.
	exec(t, a, simple, `RESET "Fence.Token"`)
	exec(t, a, simple, `RESET fence.TOKEN.`+d)
	c.none(a)
	// Session-level changes pgfence cannot follow are refused, however
	// the name is spelled.
	for _, sql := range []string{
		`SELECT set_config('FENCE.TOKEN', '9', false)`,
		`SELECT set_config('Fence.Token.` + d + `', '9', false)`,
		`SET "FENCE"."TOKEN" = '9'; SELECT 1`,
	} {
		_, err := a.Exec(ctx, sql, simple)
		if err == nil {
			t.Errorf("%s: ran; want it refused", sql)
			continue
		}
		if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "transaction pooler") {
			t.Errorf("%s: %s %q; want 0A000 naming the transaction pooler", sql, pe.Code, pe.Message)
		}
	}
	c.clean()
	c.none(c.client(""))
}

// 2. The marker that says pgfence has set the tokens in a transaction
// cannot be forged: a client that sets it at session level changes
// nothing for the clients after it.
func TestPooledMarkerCannotBeForged(t *testing.T) {
	c := newCarry(t)
	f := c.client("")
	_, err := f.Exec(ctx, "SET pgfence.tx.fence.token = 'y'", simple)
	if err == nil {
		t.Errorf("SET pgfence.tx.fence.token ran; want it refused as pgfence's own")
	} else if pe := pgErr(t, err); pe.Code != "42501" || !strings.Contains(pe.Message, "pgfence.tx.fence.token") {
		t.Errorf("SET pgfence.tx.fence.token: %s %q; want 42501 naming it", pe.Code, pe.Message)
	}
	// Where pgfence cannot see it, it must not matter.
	exec(t, f, simple, "DO $$ BEGIN PERFORM set_config('pgfence.tx.fence.token', 'y', false); PERFORM set_config('pgfence.tx.fence.token."+c.domain+"', 'y', false); END $$")
	c.leave("9")

	c.stale(c.client("3"))
	c.none(c.client(""))
	c.fresh(c.client("7"), c.plain, 7, "")
	c.fresh(c.client("7"), c.dom, 7, "")
	c.clean()
}

// 3. A token set at session level where pgfence cannot see it (a function,
// a DO block) does not reach the next clients.
func TestPooledTokenLeftByFunction(t *testing.T) {
	c := newCarry(t)
	c.leave("9")
	c.none(c.client(""))
	c.stale(c.client("3"))
	c.fresh(c.client("7"), c.dom, 7, "")
	c.clean()
	c.leave("9")
	c.fresh(c.client("8"), c.plain, 8, "")
	c.clean()
}

// 4. The statements after a transaction ends within one Query run with
// the session's token too.
func TestPooledTokenAfterCommitInOneQuery(t *testing.T) {
	c := newCarry(t)
	ends := []string{"BEGIN; SELECT 1; COMMIT; ", "BEGIN; END; ", "BEGIN; ROLLBACK; ", "START TRANSACTION; ABORT; ",
		"SELECT 1; COMMIT; ", "BEGIN; COMMIT AND CHAIN; COMMIT; "}
	var stale []string
	for _, e := range ends {
		stale = append(stale, e+"UPDATE %s SET val = 'stale' WHERE id = 1")
	}
	c.leave("9")
	c.stale(c.client("3"), stale...)
	c.none(c.client(""), stale...)
	for i, e := range ends {
		c.fresh(c.client(fmt.Sprint(10+i)), c.plain, int64(10+i), e+"UPDATE %s SET val = 'fresh' WHERE id = 2")
		c.fresh(c.client(fmt.Sprint(20+i)), c.dom, int64(20+i), e+"UPDATE %s SET val = 'fresh' WHERE id = 2")
	}
	// Two fenced writes around a COMMIT: both fenced and counted.
	before := rejects(t, c.p, c.plain)
	s := c.client("3")
	tag := exec(t, s, simple, "UPDATE "+c.plain+" SET val = 'stale' WHERE id = 1; COMMIT; UPDATE "+c.plain+" SET val = 'stale' WHERE id = 1")
	if tag != "UPDATE 0" {
		t.Errorf("two stale writes around a COMMIT: %s", tag)
	}
	if got := rejects(t, c.p, c.plain) - before; got != 2 {
		t.Errorf("two stale writes around a COMMIT counted %v rejects, want 2", got)
	}
	// An error after the statement pgfence adds points into the client's
	// text.
	q := "BEGIN; COMMIT; SELECT nosuchcolumn FROM " + c.plain
	_, err := s.Exec(ctx, q, simple)
	if pe := pgErr(t, err); pe.Code != "42703" || int(pe.Position) != strings.Index(q, "nosuchcolumn")+1 {
		t.Errorf("an error after a COMMIT: %s at %d, want 42703 at %d", pe.Code, pe.Position, strings.Index(q, "nosuchcolumn")+1)
	}
	c.untouched()
	c.clean()
}

// 4b. So do they when the Query's rewrite comes from the cache: a write
// with RETURNING is rewritten as sent (not bound to its literals), and
// where that rewrite starts its transactions is found once, with the plan
// the cache keeps, which each later execution carries.
func TestPooledTokenAfterCommitCached(t *testing.T) {
	c := newCarry(t)
	c.leave("9") // a token the second write would take, were the session's not set ahead of it
	hits := func() float64 { return c.p.Counter(t, "pgfence_rewrite_cache_hits_total") }
	const (
		stale = "UPDATE %[1]s SET val = 'stale' WHERE id = 1 RETURNING fence_epoch; COMMIT; UPDATE %[1]s SET val = 'stale' WHERE id = 1"
		fresh = "UPDATE %[1]s SET val = 'fresh-a' WHERE id = 2 RETURNING fence_epoch; COMMIT; UPDATE %[1]s SET val = 'fresh' WHERE id = 2"
	)
	s := c.client("3")
	a := c.client("")
	for _, tbl := range []string{c.plain, c.dom} {
		for i := range 2 { // the second from the cache
			h := hits()
			before := rejects(t, c.p, tbl)
			if tag := exec(t, s, simple, fmt.Sprintf(stale, tbl)); tag != "UPDATE 0" {
				t.Errorf("execution %d of two stale writes of %s around a COMMIT: %s, want UPDATE 0", i+1, tbl, tag)
			}
			if got := rejects(t, c.p, tbl) - before; got != 2 {
				t.Errorf("execution %d of two stale writes of %s around a COMMIT counted %v rejects, want 2", i+1, tbl, got)
			}
			c.untouched()

			token := int64(10*i + 10)
			exec(t, a, simple, fmt.Sprintf("SET fence.token = '%d'", token))
			c.fresh(a, tbl, token, fresh)
			if i == 1 && hits()-h < 2 {
				t.Fatalf("the second executions were not served from the rewrite cache (%v hits): this test checks nothing", hits()-h)
			}
		}
	}
	c.clean()
}

// 4c. So do they in a text that runs as sent (no guarded table), whose
// starts each event loop finds once and keeps: the statement after the
// COMMIT reads the session's token at every execution, never what was
// left on the server connection.
func TestPooledTokenAfterCommitPassed(t *testing.T) {
	c := newCarry(t)
	const q = "BEGIN; SELECT 1; COMMIT; SELECT pg_catalog.current_setting('fence.token', true)"
	for _, cl := range []struct{ token, want string }{{"3", "3"}, {"", ""}} {
		conn := c.client(cl.token)
		for i := range 3 { // the later ones from what the loop kept
			c.leave("9")
			res, err := conn.PgConn().Exec(ctx, q).ReadAll()
			if err != nil {
				t.Fatalf("client with token %q, execution %d: %v", cl.token, i+1, err)
			}
			last := res[len(res)-1]
			if len(res) != 4 || len(last.Rows) != 1 || string(last.Rows[0][0]) != cl.want {
				t.Fatalf("client with token %q, execution %d: the statement after the COMMIT read %q (%d results); want %q",
					cl.token, i+1, last.Rows, len(res), cl.want)
			}
		}
	}
	c.clean()
}

// 5. A token in the startup packet is the session's: pgfence keeps it and
// sets it in each transaction, and PgBouncer never sees it.
func TestPooledStartupToken(t *testing.T) {
	c := newCarry(t)
	c.leave("9")
	c.stale(c.client("", "options=-c fence.token=3"))
	c.stale(c.client("", "options=--fence.token=3 -c fence.token."+c.domain+"=3"))
	a := c.client("", "options=-c fence.token=7")
	if got := show(t, a); got != "7" {
		t.Errorf("SHOW fence.token of a client with -c fence.token=7: %q", got)
	}
	c.fresh(a, c.plain, 7, "")
	c.fresh(c.client("", "options=-c fence.token."+c.domain+"=8"), c.dom, 8, "")
	c.clean()
}

// 6. pgfence's own settings are pgfence's alone, in every mode: a client
// cannot set them through pgfence, and one it sets where pgfence cannot
// see does not make a write that landed count as a reject.
func TestInternalSettingsRefused(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "pooled"}[pooled], func(t *testing.T) {
			var p *pgtest.Proxy
			var tbl string
			if pooled {
				c := newCarry(t)
				p, tbl = c.p, c.plain
			} else {
				tbl = table(t, [3]any{1, "p1", 5}, [3]any{2, "p2", 0})
				p = pgtest.StartProxy(t, []string{tbl})
			}
			conn := pooledConn(t, p)
			for _, sql := range []string{
				"SET pgfence.stale_0 = '5'",
				"SET SESSION PGFENCE.STALE_0 TO 5",
				`SET "pgfence.stale_0" = '5'`,
				`SET pgfence."STALE_0" = '5'`,
				`SET U&"pg\0066ence.stale_0" = '5'`,
				"RESET pgfence.tx.fence.token",
				"SELECT set_config('PGFENCE.STALE_0', '5', false)",
				"SELECT pg_catalog.set_config(E'pgfence.dstale_0', '5', true)",
				"SELECT 1; SET pgfence.noticed = 'x'",
				"ALTER ROLE CURRENT_USER SET pgfence.stale_0 = '5'",
				"BEGIN; SET LOCAL pgfence.stale_0 = '5'; COMMIT",
			} {
				_, err := conn.Exec(ctx, sql, simple)
				if err == nil {
					t.Errorf("%s: ran; want it refused", sql)
					continue
				}
				if pe := pgErr(t, err); pe.Code != "42501" || !strings.Contains(strings.ToLower(pe.Message), "pgfence.") || !strings.Contains(pe.Message, "pgfence's own") {
					t.Errorf("%s: %s %q; want 42501 naming the setting as pgfence's own", sql, pe.Code, pe.Message)
				}
			}
			if _, err := conn.Exec(ctx, "SELECT set_config('pgfence.stale_0', $1, false)", "5"); err == nil {
				t.Errorf("set_config of pgfence.stale_0 in the extended protocol ran; want it refused")
			}
			// Reading them passes.
			var v *string
			if err := conn.QueryRow(ctx, "SELECT current_setting('pgfence.stale_0', true)", simple).Scan(&v); err != nil {
				t.Errorf("reading pgfence.stale_0: %v", err)
			}
			// Set where pgfence cannot see it (here in a DO block, in the
			// form the rewrite raises them, with that transaction's start),
			// a flag does not count a later transaction's write that lands
			// as a reject, the client's own or another's on the server
			// connection.
			forger := pooledConn(t, p)
			exec(t, forger, simple, "DO $$ BEGIN PERFORM set_config('pgfence.stale_0', '9', false); PERFORM set_config('pgfence.stale_1', '9', false);"+
				" PERFORM set_config('pgfence.stale_0', format('%s:%s', now(), 9), false); PERFORM set_config('pgfence.dstale_1', format('%s:%s', now(), 9), false); END $$")
			if !pooled {
				exec(t, forger, simple, "SET fence.token = '7'")
				if tag := exec(t, forger, simple, "UPDATE "+tbl+" SET val = 'forged' WHERE id = 2"); tag != "UPDATE 1" {
					t.Errorf("a fresh write after forged flags: %s", tag)
				}
			} else {
				w := pooledConn(t, p)
				exec(t, w, simple, "SET fence.token = '7'")
				if tag := exec(t, w, simple, "UPDATE "+tbl+" SET val = 'forged' WHERE id = 2"); tag != "UPDATE 1" {
					t.Errorf("a fresh write after another client forged flags: %s", tag)
				}
			}
			if got := rejects(t, p, tbl); got != 0 {
				t.Errorf("a write that landed counted %v rejects after forged flags, want 0", got)
			}
			// Nor from the startup packet.
			for _, param := range []string{"options=-c pgfence.stale_0=9", "options=--PGFENCE.TX.fence.token=y", "pgfence.stale_0=9"} {
				cfg, err := pgx.ParseConfig(p.URL(param))
				if err != nil {
					t.Fatal(err)
				}
				c, err := pgx.ConnectConfig(ctx, cfg)
				if err == nil {
					c.Close(ctx)
					t.Errorf("a client with %s connected; want FATAL 42501", param)
					continue
				}
				if pe := pgErr(t, err); pe.Code != "42501" || !strings.Contains(pe.Message, "pgfence's own") {
					t.Errorf("a client with %s: %s %q; want 42501 naming it pgfence's own", param, pe.Code, pe.Message)
				}
			}
		})
	}
}

// 2b. The nonce in a marker is no secret from the client whose session
// drew it (it can read its marker), nor from those it tells. A marker
// left with that nonce still stops nothing in the session's later
// transactions: each draws its own.
func TestPooledMarkerNonceKnown(t *testing.T) {
	c := newCarry(t)
	v := c.client("3")
	var marker string
	if err := v.QueryRow(ctx, "SELECT current_setting('pgfence.tx.fence.token')", simple).Scan(&marker); err != nil {
		t.Fatalf("reading the marker: %v", err)
	}
	nonce, _, _ := strings.Cut(marker, ":")
	a := c.client("")
	for _, m := range []string{marker, nonce} {
		exec(t, a, simple, "DO $$ BEGIN"+
			" PERFORM set_config('pgfence.tx.fence.token', '"+m+"', false);"+
			" PERFORM set_config('pgfence.tx.fence.token."+c.domain+"', '"+m+"', false);"+
			" PERFORM set_config('fence.token', '9', false); PERFORM set_config('fence.token."+c.domain+"', '9', false); END $$")
		c.stale(v)
	}
}

// A client that pipelines the start of a transaction behind the end of
// the one before keeps its SET LOCAL for the rest of that transaction:
// the session's nonce changes only where a transaction starts with nothing
// in flight, not at the ReadyForQuery that ended the one before.
func TestPooledSetLocalPipelinedAcrossTransactions(t *testing.T) {
	c := newCarry(t)
	a := c.client("7")
	pl := a.PgConn().StartPipeline(ctx)
	pl.SendQueryParams("UPDATE "+c.plain+" SET val = 'p1' WHERE id = 2", nil, nil, nil, nil)
	pl.SendPipelineSync()
	pl.SendQueryParams("BEGIN", nil, nil, nil, nil)
	pl.SendQueryParams("SET LOCAL fence.token = '20'", nil, nil, nil, nil)
	pl.SendPipelineSync()
	if err := pl.Flush(); err != nil {
		t.Fatal(err)
	}
	for syncs := 0; syncs < 2; {
		res, err := pl.GetResults()
		if err != nil {
			t.Fatal(err)
		}
		switch r := res.(type) {
		case *pgconn.ResultReader:
			if _, err := r.Close(); err != nil {
				t.Fatal(err)
			}
		case *pgconn.PipelineSync:
			syncs++
		}
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	exec(t, a, simple, "UPDATE "+c.plain+" SET val = 'p2' WHERE id = 2")
	exec(t, a, simple, "COMMIT")
	if v, e := row(t, c.plain, 2); v != "p2" || e != 20 {
		t.Errorf("row 2 is %q at epoch %d, want p2 at 20 (the SET LOCAL's)", v, e)
	}
}
