package fence_test

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// inDomain puts every guard of a test proxy in lock domain d, creating the
// domain's row the way serve does.
func inDomain(t *testing.T, d string) func(*proxy.Config, *fence.Config) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, sqlrewrite.DomainTableDDL())
	pgtest.Exec(t, db, "DELETE FROM pgfence.domains WHERE domain = $1", d)
	pgtest.Exec(t, db, sqlrewrite.DomainRowSQL(), d)
	return func(_ *proxy.Config, fc *fence.Config) {
		for i := range fc.Guards {
			fc.Guards[i].Domain = d
		}
	}
}

// The zombie-on-untouched-row story: B (43) writes row X; A (42) then
// writes row Y, which B never touched. In a lock domain A's write changes
// nothing; with row-only fencing it lands.
func TestDomainFencesUntouchedRows(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0}, [3]any{2, "y", 0})
	other := table2(t)
	run := func(p *pgtest.Proxy) (string, string) {
		a, b := p.Connect(t), p.Connect(t)
		pgtest.Exec(t, a, "SET fence.token = '42'")
		pgtest.Exec(t, b, "SET fence.token = '43'")
		if tag := pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("B: %s", tag)
		}
		tagY := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'A' WHERE id = 2")
		tagOther := pgtest.Exec(t, a, "UPDATE "+other+" SET val = 'A' WHERE id = 1")
		return tagY, tagOther
	}

	p := pgtest.StartProxy(t, []string{tbl, other}, inDomain(t, "billing"))
	y, o := run(p)
	if y != "UPDATE 0" || o != "UPDATE 0" {
		t.Fatalf("in a domain, zombie A wrote rows B never touched: %s on %s, %s on %s", y, tbl, o, other)
	}
	if v, _ := row(t, tbl, 2); v != "y" {
		t.Fatalf("row Y = %q", v)
	}
	if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=domain"); got != 1 {
		t.Fatalf("domain reject on %s counted %v, want 1", tbl, got)
	}
	if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=row"); got != 0 {
		t.Fatalf("a domain reject was counted as a row reject: %v", got)
	}
	// A stale INSERT into the domain fails clearly; nothing is written.
	a := p.Connect(t)
	pgtest.Exec(t, a, "SET fence.token = '42'")
	_, err := a.Exec(ctx, "INSERT INTO "+tbl+" (id, val) VALUES (3, 'zombie')")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "PF001" || pe.Hint == "" {
		t.Fatalf("stale INSERT into a domain: %v, want PF001 with a hint", err)
	}
	if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "kind=domain"); got != 2 {
		t.Fatalf("stale domain INSERT not counted against %s: %v", tbl, got)
	}
	// A per-domain setting is the domain's token when the general one is
	// unset (set to a different token, it fails: see precedence_test.go).
	pgtest.Exec(t, a, "RESET fence.token")
	pgtest.Exec(t, a, "SET fence.token.billing = '44'")
	if tag := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'A44' WHERE id = 2"); tag != "UPDATE 1" {
		t.Fatalf("fence.token.billing = 44: %s", tag)
	}

	// The same story under row-only fencing: A's write to Y lands.
	pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+" SET val = 'x', fence_epoch = 0 WHERE id = 1; UPDATE "+tbl+" SET val = 'y', fence_epoch = 0 WHERE id = 2")
	rowOnly := pgtest.StartProxy(t, []string{tbl, other})
	if y, _ := run(rowOnly); y != "UPDATE 1" {
		t.Fatalf("row-only fencing: A's write to Y = %s; the difference domains make is gone", y)
	}
}

// table2 is a second guarded-shaped table for a test.
func table2(t *testing.T) string {
	t.Helper()
	name := "second_" + fmt.Sprint(time.Now().UnixNano()%1e9)
	pgtest.Exec(t, pgtest.Direct(t), "CREATE TABLE "+name+" (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO "+name+" VALUES (1, 'o')")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE "+name) })
	return name
}

// Many writers, tokens granted in order but used after random pauses: no
// write with a token below an already accepted one lands.
func TestDomainConcurrency(t *testing.T) {
	db := pgtest.Direct(t)
	// seq comes after fence_epoch: its default is computed after the
	// stamped epoch, i.e. after the statement took the domain's row lock,
	// which it keeps until commit, so seq order is commit order.
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS dom_log; CREATE TABLE dom_log (token bigint NOT NULL, fence_epoch bigint NOT NULL, seq bigserial)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS dom_log") })
	p := pgtest.StartProxy(t, []string{"dom_log"}, inDomain(t, "conc"))

	var grant atomic.Int64
	var accepted, rejected atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c, err := pgx.Connect(ctx, p.URL())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close(ctx)
			rnd := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 25; i++ {
				tok := grant.Add(1)
				time.Sleep(time.Duration(rnd.Intn(3000)) * time.Microsecond) // a pause: others may pass
				_, err := c.Exec(ctx, "SELECT set_config('fence.token', $1, false)", fmt.Sprint(tok))
				if err == nil {
					_, err = c.Exec(ctx, "INSERT INTO dom_log (token) VALUES ($1)", tok)
				}
				var pe *pgconn.PgError
				switch {
				case err == nil:
					accepted.Add(1)
				case errors.As(err, &pe) && pe.Code == "PF001":
					rejected.Add(1)
				default:
					t.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	rows, _ := db.Query(ctx, "SELECT token FROM dom_log ORDER BY seq")
	var last int64 = -1
	var n int64
	for rows.Next() {
		var tok int64
		rows.Scan(&tok)
		if tok < last {
			t.Fatalf("token %d landed after %d: a stale write got through", tok, last)
		}
		last, n = tok, n+1
	}
	var domainToken int64
	db.QueryRow(ctx, "SELECT token FROM pgfence.domains WHERE domain = 'conc'").Scan(&domainToken)
	if n != accepted.Load() || domainToken != last {
		t.Fatalf("%d rows for %d accepted writes; domain token %d, last accepted %d", n, accepted.Load(), domainToken, last)
	}
	if rejected.Load() == 0 {
		t.Fatal("no write was stale: the test did not test anything")
	}
	t.Logf("%d accepted, %d rejected as stale", accepted.Load(), rejected.Load())
}

// A lock domain's claim checks nothing but the settings' precedence: the
// writes check the token first, so every malformed, missing or conflicting
// token fails with pgfence's error naming the table, in every write form
// and protocol, and changes nothing, not even the domain's token. A write
// that runs no check (it matches no row by construction) claims nothing
// with conflicting settings, and fails with a token the claim cannot cast.
func TestDomainClaimChecksNothingTheWritesDoNot(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0}, [3]any{2, "y", 0})
	p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "billing"))
	pgtest.Exec(t, pgtest.Direct(t), "UPDATE pgfence.domains SET token = 10 WHERE domain = 'billing'")
	subject := `guarded table "` + tbl + `" in lock domain "billing"`
	writes := []string{
		"UPDATE " + tbl + " SET val = 'z' WHERE id = 1",
		"UPDATE " + tbl + " SET val = 'z' WHERE id = 12345",
		"DELETE FROM " + tbl + " WHERE id = 2",
		"INSERT INTO " + tbl + " (id, val) VALUES (3, 'z')",
		"INSERT INTO " + tbl + " (id, val) VALUES (3, 'z'), (4, 'z')",
		"INSERT INTO " + tbl + " (id, val) SELECT g, 'z' FROM generate_series(3, 4) g",
		"INSERT INTO " + tbl + " (id, val) VALUES (1, 'z') ON CONFLICT (id) DO UPDATE SET val = excluded.val",
	}
	for _, c := range []struct {
		name, set, code, msg string
	}{
		{"missing", "RESET fence.token", "55000", "pgfence: no fencing token is set for this write to " + subject},
		{"empty", "SET fence.token = ''", "55000", "pgfence: no fencing token is set for this write to " + subject},
		{"not an integer", "SET fence.token = 'abc'", "22023", "pgfence: fence.token.billing or fence.token must be an integer fencing token for a write to " + subject},
		{"conflicting", "SET fence.token.billing = '50'; SET fence.token = '40'", "22023", "pgfence: both fence.token.billing and fence.token are set, to different tokens ('50' and '40'), for a write to " + subject},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := p.Connect(t)
			pgtest.Exec(t, conn, c.set)
			for _, sql := range writes {
				for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
					_, err := conn.Exec(ctx, sql, mode)
					var pe *pgconn.PgError
					if !errors.As(err, &pe) || pe.Code != c.code || !strings.HasPrefix(pe.Message, c.msg) {
						t.Errorf("%s (%s): %v; want %s %q...", sql, mode, err, c.code, c.msg)
					}
				}
			}
			if got := contents(t, tbl); got != "1:x:0 2:y:0" || domainToken(t, "billing") != 10 {
				t.Fatalf("%s token changed something: %q, domain token %d", c.name, got, domainToken(t, "billing"))
			}
		})
	}
	conn := p.Connect(t)
	pgtest.Exec(t, conn, "SET fence.token.billing = '50'")
	pgtest.Exec(t, conn, "SET fence.token = '40'")
	for _, sql := range []string{
		"UPDATE " + tbl + " SET val = 'z' WHERE false",
		"INSERT INTO " + tbl + " (id, val) SELECT 3, 'z' WHERE false",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Errorf("%s with conflicting settings: %v", sql, err)
		}
		if got := domainToken(t, "billing"); got != 10 {
			t.Fatalf("%s with conflicting settings claimed the domain: token %d", sql, got)
		}
	}
	pgtest.Exec(t, conn, "RESET fence.token.billing; SET fence.token = 'abc'")
	if _, err := conn.Exec(ctx, "UPDATE "+tbl+" SET val = 'z' WHERE false"); err == nil {
		t.Errorf("a write with token 'abc' that runs no check of its own succeeded")
	}
	if got := contents(t, tbl); got != "1:x:0 2:y:0" || domainToken(t, "billing") != 10 {
		t.Fatalf("changed: %q, domain token %d", got, domainToken(t, "billing"))
	}
	// A good token: every row of a multi-row INSERT stamps the claim.
	pgtest.Exec(t, conn, "SET fence.token = '60'")
	if tag := pgtest.Exec(t, conn, "INSERT INTO "+tbl+" (id, val) VALUES (3, 'a'), (4, 'b')"); tag != "INSERT 0 2" {
		t.Fatalf("token 60: %s", tag)
	}
	if got := contents(t, tbl); got != "1:x:0 2:y:0 3:a:60 4:b:60" || domainToken(t, "billing") != 60 {
		t.Fatalf("token 60: %q, domain token %d", got, domainToken(t, "billing"))
	}
}
