package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// TestServeUnfenceable: a --guard table without its epoch column has every
// write refused with pgfence's own error (PF003), naming the table and the
// fix, in the simple and the extended protocol, and not counted as a write
// without a token; reads go on; the table is named in
// pgfence_guarded_table_unfenceable and in /readyz, which answers 503.
// Once the column is added (through pgfence: its catalog is read again
// before the session's next statement) the table is fenced, and all is
// well again.
func TestServeUnfenceable(t *testing.T) {
	s := newServeTest(t)
	bg := context.Background()
	s.exec(`CREATE TABLE nf_plain (id int PRIMARY KEY, val text); INSERT INTO nf_plain VALUES (1, 'a');
		CREATE TABLE nf_fine (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO nf_fine VALUES (1, 'a', 5)`)
	inst := s.serve(serveOptions{discover: true, discoverInterval: time.Hour, backstop: "install",
		policyOptions: policyOptions{guards: []string{"nf_plain"}}})
	const series = `pgfence_guarded_table_unfenceable{database="postgres",table="public.nf_plain"}`
	if v := scrape(t, inst, series); v != "1" {
		t.Fatalf("%s = %q, want 1", series, v)
	}
	code, body := readyz(t, inst)
	if code != 503 || !strings.Contains(body, "guarded table public.nf_plain cannot be fenced") ||
		!strings.Contains(body, "ALTER TABLE public.nf_plain ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0") {
		t.Fatalf("/readyz with a table that cannot be fenced: %d %q", code, body)
	}
	c := s.client(inst, "7")
	refused := func(what string, err error) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != sqlrewrite.CodeUnfenceable {
			t.Fatalf("%s: %v, want SQLSTATE %s", what, err, sqlrewrite.CodeUnfenceable)
		}
		if !strings.Contains(pe.Message, `guarded table "public.nf_plain"`) || !strings.Contains(pe.Message, "ADD COLUMN fence_epoch") ||
			strings.Contains(pe.Message, "does not exist") || pe.Hint == "" {
			t.Fatalf("%s: message %q hint %q: want pgfence's, naming the table and the fix", what, pe.Message, pe.Hint)
		}
	}
	_, err := c.Exec(bg, "UPDATE nf_plain SET val = 'b' WHERE id = 1", pgx.QueryExecModeSimpleProtocol)
	refused("simple-protocol UPDATE", err)
	_, err = c.Exec(bg, "UPDATE nf_plain SET val = $1 WHERE id = $2", "b", 1)
	refused("extended-protocol UPDATE", err)
	_, err = c.Exec(bg, "INSERT INTO nf_plain (id, val) VALUES (2, 'c')")
	refused("INSERT", err)
	var val string
	if err := c.QueryRow(bg, "SELECT val FROM nf_plain WHERE id = 1").Scan(&val); err != nil || val != "a" {
		t.Fatalf("a read of the table: %q %v", val, err)
	}
	if got := tag(t, c, "UPDATE nf_fine SET val = 'b' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("a write to another guarded table: %s", got)
	}
	if v := scrape(t, inst, `critical_write_without_token_total{action="refused",database="postgres",mode="enforce",table="public.nf_plain"}`); v != "0" {
		t.Fatalf("refusals counted as writes without a token: %q", v)
	}

	// The fix, through pgfence.
	tag(t, c, "ALTER TABLE nf_plain ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0")
	if got := tag(t, c, "UPDATE nf_plain SET val = 'b' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("a write once the column is there: %s", got)
	}
	if got := tag(t, s.client(inst, "3"), "UPDATE nf_plain SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Fatalf("a stale write once the column is there: %s", got)
	}
	poll.Eventually(t, 10*time.Second, "/readyz 200 once the table can be fenced", func() bool {
		code, _ := readyz(t, inst)
		return code == 200
	})
	if v := scrape(t, inst, series); v != "" {
		t.Fatalf("%s after the fix: %q, want no series", series, v)
	}
}

// TestServeMixedTree: a partitioned table whose partition is fenced
// otherwise (here: the partition in a lock domain, the parent found by its
// epoch column, in none) has its writes refused (PF003): a write naming
// the parent writes the partition's rows, and fenced as the parent is it
// would let a stale writer into the domain. The partition is fenced as
// ever, by name. With the backstop off, nothing else stands in the way.
func TestServeMixedTree(t *testing.T) {
	s := newServeTest(t)
	bg := context.Background()
	s.exec(`CREATE TABLE mt_parent (id int NOT NULL, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE mt_ledger (id int NOT NULL, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		INSERT INTO mt_ledger VALUES (1, 'a', 5);
		ALTER TABLE mt_parent ATTACH PARTITION mt_ledger FOR VALUES FROM (MINVALUE) TO (MAXVALUE)`)
	inst := s.serve(serveOptions{discover: true, discoverInterval: time.Hour, backstop: "off", initDomains: true,
		policyOptions: policyOptions{guards: []string{"mt_ledger"}, domains: []string{"mt_ledger=mt"}}})
	s.exec("UPDATE pgfence.domains SET token = 10 WHERE domain = 'mt'")
	c := s.client(inst, "7") // below the domain's token, above the row's epoch
	for _, sql := range []string{
		"INSERT INTO mt_parent (id, val) VALUES (2, 'stale')",
		"UPDATE mt_parent SET val = 'stale' WHERE id = 1",
	} {
		_, err := c.Exec(bg, sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != sqlrewrite.CodeUnfenceable || !strings.Contains(pe.Message, "public.mt_ledger") ||
			!strings.Contains(pe.Message, `lock domain "mt"`) {
			t.Errorf("%s: %v; want PF003 naming the partition and its domain", sql, err)
		}
	}
	if got := tag(t, c, "UPDATE mt_ledger SET val = 'stale' WHERE id = 1"); got != "UPDATE 0" {
		t.Errorf("a stale write naming the partition: %s", got)
	}
	if v, _ := s.epoch("mt_ledger", 1); v != "a" {
		t.Errorf("the row: %q, want it untouched", v)
	}
	if code, body := readyz(t, inst); code != 503 || !strings.Contains(body, "public.mt_parent") {
		t.Errorf("/readyz: %d %q; want 503 naming the parent", code, body)
	}
}
