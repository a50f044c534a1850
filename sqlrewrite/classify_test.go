package sqlrewrite

import (
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// classifyOracles are the facts Classify merges, each from its oracle:
// the prefilter as it was, scanning the text on its own.
func classifyOracles(r *Rewriter, sql string) Class {
	var c Class
	for _, f := range []struct {
		fact Class
		on   bool
	}{
		{Writes, oracleMayWrite(sql)},
		{Executes, ContainsFold(sql, "execute")},
		{Invalidates, oracleMayInvalidate(sql)},
		{EndsTx, oracleEndsTransaction(sql)},
		{ChangesTables, oracleMayChangeTables(sql)},
		{ChangesReading, oracleMayChangeReading(sql)},
		{Touches, r != nil && r.oracleMayTouch(sql)},
	} {
		if f.on {
			c |= f.fact
		}
	}
	return c
}

// classifyTexts are texts that sit on the prefilters' edges, and the
// inputs of the rewrite cases.
func classifyTexts(t testing.TB) []string {
	texts := []string{
		"", ";", "SELECT 1", "UPDATE accounts SET v = 1", "select 'x' || $$update$$ from t /* insert */",
		"Copy t to stdout", "SELECT U&\"d\\0065lete\" FROM accounts", "EXECUTE q", "executed", "xexecute",
		"SELECT updated_at FROM accounts;DISCARD ALL", "SELECT 1deallocate", "BEGIN; SET LOCAL ROLE r",
		"select pg_catalog.set_config('role', 'r', true)", "select set_config('search_path', 'x', false)",
		"select set_config(name, 'x', false)", "ROLLBACK TO SAVEPOINT s", "COMMIT AND CHAIN", "/* c */ SET ROLE r",
		"RESET ALL", "reset role", "SET SESSION AUTHORIZATION u", "END", "abort;", "prepare transaction 'x'",
		"PREPARE q AS SELECT 1", "-- commit\nselect 1", "CREATE TABLE t (x int)", "alter table a rename to b",
		"IMPORT FOREIGN SCHEMA s FROM SERVER x INTO y", "SET client_encoding = 'LATIN1'", "set names 'utf8'",
		"SET standard_conforming_strings = off", "DISCARD ALL", "reset all", "select all from reset",
		"SELECT * FROM \"Odd \"\"Name\"\"\"", "select * from ACCOUNTS", "SELECT u&'x'", "select u & 1",
		"select * from public.orders_archive", "SELECT * FROM billing.LEDGER", "search_path", "x_search_path",
		"set_config", "SELECT 1; COMMIT; UPDATE accounts SET v = 2", "/* unterminated", "--", "a;b;c;",
	}
	for _, dir := range []string{"../testdata/rewrite", "testdata/fuzz/FuzzRewrite", "testdata/fuzz/FuzzParameterize"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				if q, err := strconv.Unquote(strings.TrimPrefix(strings.TrimSuffix(strings.TrimPrefix(line, "string("), ")"), "")); err == nil {
					texts = append(texts, q)
				}
				texts = append(texts, line)
			}
		}
	}
	return texts
}

// Classify says, in one pass, exactly what the prefilters it merges said,
// each in its own: on edge cases, the rewrite cases' texts, and random
// splices of their words.
func TestClassifyOracles(t *testing.T) {
	r := fuzzRewriter(t, 0)
	texts := classifyTexts(t)
	rnd := rand.New(rand.NewSource(1))
	var words []string
	for _, s := range texts {
		words = append(words, strings.Fields(s)...)
	}
	for range 20000 {
		var b strings.Builder
		for range 1 + rnd.Intn(8) {
			b.WriteString(words[rnd.Intn(len(words))])
			b.WriteByte(" ;_(\n'"[rnd.Intn(6)])
		}
		texts = append(texts, b.String())
	}
	for _, sql := range texts {
		checkClassify(t, r, sql)
	}
}

func checkClassify(t *testing.T, r *Rewriter, sql string) {
	t.Helper()
	if got, want := r.Classify(sql), classifyOracles(r, sql); got != want {
		t.Fatalf("Classify(%q) = %07b, the prefilters say %07b", sql, got, want)
	}
	if got, want := Classify(sql), classifyOracles(nil, sql); got != want {
		t.Fatalf("package Classify(%q) = %07b, the prefilters say %07b", sql, got, want)
	}
	if r.MayTouch(sql) != r.oracleMayTouch(sql) {
		t.Fatalf("MayTouch(%q) = %v, the old prefilter says %v", sql, r.MayTouch(sql), !r.MayTouch(sql))
	}
}

func FuzzClassify(f *testing.F) {
	for _, s := range classifyTexts(f) {
		f.Add(s)
	}
	r := fuzzRewriter(f, 0)
	f.Fuzz(func(t *testing.T, sql string) { checkClassify(t, r, sql) })
}

// Classify allocates nothing.
func TestClassifyAllocs(t *testing.T) {
	r := fuzzRewriter(t, 0)
	sql := "SELECT a.id, b.v FROM accounts a JOIN other b USING (id) WHERE a.x = 'execute' AND b.y = 2; COMMIT"
	if n := testing.AllocsPerRun(100, func() { classSink = r.Classify(sql) }); n != 0 {
		t.Fatalf("Classify allocates %v times", n)
	}
}

var classSink Class
