package fence_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A stale write's log line names the epoch that beat it, and
// fencing_token_gap records by how much; pgfence_token_accepted_max follows
// the highest token that went through.
func TestTokenGapAndAcceptedMax(t *testing.T) {
	tbl := table(t, [3]any{1, "a", 0}, [3]any{2, "b", 0}, [3]any{3, "c", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	if got := p.Counter(t, "pgfence_token_accepted_max", "table="+tbl); got != 0 {
		t.Fatalf("accepted max at start: %v, want 0", got)
	}
	b, c, stale := p.Connect(t), p.Connect(t), p.Connect(t)
	pgtest.Exec(t, b, "SET fence.token = '43'")
	pgtest.Exec(t, c, "SET fence.token = '50'")
	pgtest.Exec(t, stale, "SET fence.token = '40'")
	pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B' WHERE id = 1")
	pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'C' WHERE id = 2")
	if got := p.Counter(t, "pgfence_token_accepted_max", "table="+tbl); got != 50 {
		t.Fatalf("accepted max: %v, want 50", got)
	}

	if tag := pgtest.Exec(t, stale, "UPDATE "+tbl+" SET val = 'S' WHERE id = 2"); tag != "UPDATE 0" {
		t.Fatalf("stale: %s", tag)
	}
	if n, sum := p.Histogram(t, "fencing_token_gap", "table="+tbl, "kind=row"); n != 1 || sum != 10 {
		t.Fatalf("fencing_token_gap after 50 beat 40: count %d sum %v, want 1, 10", n, sum)
	}
	if logs := p.Logs.String(); !strings.Contains(logs, "token=40 epoch=50") {
		t.Fatalf("reject log does not name the winning epoch:\n%s", logs)
	}
	// Extended protocol; a partly stale write raises no accepted max.
	pgtest.Exec(t, stale, "SET fence.token = '41'")
	if tag, err := stale.Exec(ctx, "UPDATE "+tbl+" SET val = $1 WHERE id IN (1, 3)", "S"); err != nil || tag.String() != "UPDATE 1" {
		t.Fatalf("partly stale: %v %v", tag, err)
	}
	if n, sum := p.Histogram(t, "fencing_token_gap", "table="+tbl, "kind=row"); n != 2 || sum != 12 {
		t.Fatalf("fencing_token_gap after 43 beat 41: count %d sum %v, want 2, 12", n, sum)
	}
	// Token-less and fresh writes record no gap; a lower accepted token
	// leaves the max.
	pgtest.Exec(t, b, "SET fence.token = '45'")
	pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B' WHERE id = 1")
	if got := p.Counter(t, "pgfence_token_accepted_max", "table="+tbl); got != 50 {
		t.Fatalf("accepted max after 45: %v, want 50", got)
	}
	if n, _ := p.Histogram(t, "fencing_token_gap", "table="+tbl); n != 2 {
		t.Fatalf("fencing_token_gap count %d after fresh writes, want 2", n)
	}
}

// In a lock domain, the gap is to the domain's token, on both stale paths:
// a matched row skipped because the domain was claimed higher, and a stale
// INSERT (PF001), whose message names the newer token.
func TestTokenGapInDomain(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0}, [3]any{2, "y", 0})
	p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "gapdomain"))
	if got := p.Counter(t, "pgfence_domain_token_accepted_max", "domain=gapdomain"); got != 0 {
		t.Fatalf("domain accepted max at start: %v, want 0", got)
	}
	a, b := p.Connect(t), p.Connect(t)
	pgtest.Exec(t, a, "SET fence.token = '42'")
	pgtest.Exec(t, b, "SET fence.token = '47'")
	pgtest.Exec(t, b, "UPDATE "+tbl+" SET val = 'B' WHERE id = 1")
	if got := p.Counter(t, "pgfence_domain_token_accepted_max", "domain=gapdomain"); got != 47 {
		t.Fatalf("domain accepted max: %v, want 47", got)
	}
	if tag := pgtest.Exec(t, a, "UPDATE "+tbl+" SET val = 'A' WHERE id = 2"); tag != "UPDATE 0" {
		t.Fatalf("stale domain write: %s", tag)
	}
	if n, sum := p.Histogram(t, "fencing_token_gap", "table="+tbl, "kind=domain"); n != 1 || sum != 5 {
		t.Fatalf("domain gap: count %d sum %v, want 1, 5", n, sum)
	}
	_, err := a.Exec(ctx, "INSERT INTO "+tbl+" (id, val) VALUES (3, 'zombie')", pgx.QueryExecModeSimpleProtocol)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "PF001" || !strings.HasSuffix(pe.Message, "token: 42; newer token: 47") {
		t.Fatalf("stale INSERT: %v, want PF001 naming both tokens", err)
	}
	if n, sum := p.Histogram(t, "fencing_token_gap", "table="+tbl, "kind=domain"); n != 2 || sum != 10 {
		t.Fatalf("domain gap after PF001: count %d sum %v, want 2, 10", n, sum)
	}
	if logs := p.Logs.String(); strings.Count(logs, "token=42 epoch=47") != 2 {
		t.Fatalf("domain reject logs do not name the domain's token twice:\n%s", logs)
	}
}
