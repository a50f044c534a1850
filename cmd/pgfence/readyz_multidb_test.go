package main

import (
	"net/http"
	"strings"
	"testing"
)

// /readyz answers for the --upstream database: a guarded table of another
// database that cannot be fenced (here one a role made there without the
// epoch column, under an explicit --guard) is in its body, and its writes
// are refused, but it does not take the --upstream database's sessions
// out of service (red team 7b); the same state in the --upstream database
// does.
func TestReadyzAnswersForUpstreamDatabase(t *testing.T) {
	s := newServeTest(t)
	s.exec("CREATE TABLE orders (id int PRIMARY KEY, fence_epoch bigint NOT NULL DEFAULT 0)")
	other := s.database("rz_other")
	if _, err := other.Exec(t.Context(), "CREATE TABLE orders (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	inst := s.serve(serveOptions{backstop: "off", policyOptions: policyOptions{guards: []string{"public.orders"}}})
	c := s.clientOf(inst, "rz_other", "5")
	if _, err := c.Exec(t.Context(), "UPDATE orders SET id = 2 WHERE id = 1"); err == nil || !strings.Contains(err.Error(), "PF003") {
		t.Fatalf("a write to the other database's unfenceable table: %v, want PF003", err)
	}
	code, body := readyz(t, inst)
	if code != http.StatusOK || !strings.Contains(body, `database "rz_other"`) || !strings.Contains(body, "no epoch column") {
		t.Fatalf("/readyz with another database's table unfenceable: %d %q, want 200 naming it in the body", code, body)
	}

	// The same in the --upstream database: not ready.
	s.exec("ALTER TABLE orders DROP COLUMN fence_epoch")
	inst.reload(t.Context(), inst.options())
	if code, body := readyz(t, inst); code != http.StatusServiceUnavailable || !strings.Contains(body, `database "postgres"`) {
		t.Fatalf("/readyz with the --upstream database's table unfenceable: %d %q, want 503", code, body)
	}
}
