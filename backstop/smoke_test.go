package backstop_test

import (
	"testing"

	"github.com/pgfence/pgfence/backstop"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestSmokeDirect(t *testing.T) {
	tb := guarded(t, tableName(t, ""), [3]any{1, "a", 5})
	install(t, backstop.Options{}, tb)
	stale := session(t, "3")
	if tag := pgtest.Exec(t, stale, "UPDATE "+tb+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
		t.Fatalf("stale: %s", tag)
	}
	fresh := session(t, "7")
	if tag := pgtest.Exec(t, fresh, "UPDATE "+tb+" SET val = 'fresh', fence_epoch = 999 WHERE id = 1"); tag != "UPDATE 1" {
		t.Fatalf("fresh: %s", tag)
	}
	if v, e := rowOf(t, tb, 1); v != "fresh" || e != 7 {
		t.Fatalf("row = %q, %d", v, e)
	}
	_, err := session(t, "").Exec(ctx, "DELETE FROM "+tb)
	if code(err) != "55000" {
		t.Fatalf("no token: %v", err)
	}
	c, err := backstop.ReadCounts(ctx, pgtest.Direct(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.Rejects["public."+tb] != 1 {
		t.Fatalf("counts %v", c)
	}
}
