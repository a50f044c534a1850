package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Through serve, against Postgres: a write to a guarded table in a text
// longer than --max-parse-size is refused with 54000 naming the limit, in
// the simple and the extended protocol, and the session goes on; a longer
// read, and a write within the limit, run.
func TestServeMaxParseSize(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE big (id int PRIMARY KEY, val text, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO big VALUES (1, 'a', 0)")
	inst := s.serve(serveOptions{backstop: "off", policyOptions: policyOptions{guards: []string{"big"}, maxParse: 4096}})
	c := s.client(inst, "5")
	long := strings.Repeat("x", 5000)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		_, err := c.Exec(context.Background(), "UPDATE big SET val = 'b' WHERE id = 1 AND val <> '"+long+"'", mode)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "54000" || !strings.Contains(pe.Message, "(4096 bytes)") || !strings.Contains(pe.Hint, "--max-parse-size") {
			t.Fatalf("a %d-byte write, %v: %v; want 54000 naming the limit and the flag", 5000, mode, err)
		}
		if got := tag(t, c, "SELECT count(*) FROM big WHERE val <> '"+long+"'"); got != "SELECT 1" {
			t.Fatalf("a long read after the refusal: %s", got)
		}
	}
	// A long text naming pgfence's own settings would be parsed to check
	// it sets none: refused too (red team 8: 550 MB for a 3 MB SELECT).
	_, err := c.Exec(context.Background(), "SELECT current_setting('pgfence.x', true) WHERE '"+long+"' <> ''", pgx.QueryExecModeSimpleProtocol)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "54000" {
		t.Fatalf("a long text naming pgfence.x: %v, want 54000", err)
	}
	if got := tag(t, c, "UPDATE big SET val = 'c' WHERE id = 1"); got != "UPDATE 1" {
		t.Fatalf("a short write: %s", got)
	}
	if v, e := s.epoch("big", 1); v != "c" || e != 5 {
		t.Fatalf("row 1: %q at %d, want c at 5", v, e)
	}
}
