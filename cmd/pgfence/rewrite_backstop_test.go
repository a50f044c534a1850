package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestRewriteBackstop checks 'pgfence rewrite --backstop': MERGE, refused
// without it, runs unrewritten with it, and a write beside it is still
// fenced in the text.
func TestRewriteBackstop(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"rewrite"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	merge := "WITH o AS (UPDATE orders SET q = 1 WHERE id = 2 RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE"
	out, err := run("--guard", "accounts", "--guard", "orders", merge)
	if !errors.Is(err, errRefused) || !strings.Contains(out, "SQLSTATE: 0A000") || !strings.Contains(out, "database backstop") {
		t.Errorf("MERGE without --backstop: %v\n%s", err, out)
	}
	out, err = run("--guard", "accounts", "--guard", "orders", "--backstop", merge)
	if err != nil {
		t.Fatalf("MERGE with --backstop: %v\n%s", err, out)
	}
	for _, want := range []string{"-- MERGE accounts (enforce, fenced by the database backstop)", "-- UPDATE orders (enforce, nested)",
		`UPDATE orders SET "fence_epoch" = `, " RETURNING id) MERGE INTO accounts a USING o ON a.id = o.id WHEN MATCHED THEN DELETE;"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = run("--guard", "accounts", "--backstop", "--prepared", "COPY accounts FROM STDIN")
	if err != nil || !strings.Contains(out, "-- COPY FROM accounts (enforce, fenced by the database backstop)") || !strings.HasSuffix(out, "\nCOPY accounts FROM STDIN\n") {
		t.Errorf("COPY FROM with --backstop: %v\n%s", err, out)
	}
	out, err = run("--guard", "accounts", "--backstop", "TRUNCATE accounts")
	if !errors.Is(err, errRefused) || !strings.Contains(out, "SQLSTATE: 0A000") {
		t.Errorf("TRUNCATE with --backstop: %v\n%s", err, out)
	}
}
