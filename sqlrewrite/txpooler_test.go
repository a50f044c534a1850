package sqlrewrite

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

func TestWritesNothing(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want bool
	}{
		{"BEGIN", true},
		{"  commit;  ", true},
		{"ROLLBACK TO SAVEPOINT a", true},
		{"-- a comment\nSHOW work_mem", true},
		{"/* c */ VACUUM accounts", true},
		{"SET search_path = app", true},
		{"SELECT set_config('x', 'y', false)", false},
		{"SET x = 1; SELECT set_config('a', 'b', false)", false},
		{"CREATE INDEX CONCURRENTLY ON accounts (id)", true},
		{"CREATE UNIQUE INDEX CONCURRENTLY i ON accounts (id)", true},
		{"CREATE INDEX ON accounts (id)", false},
		{"CREATE DATABASE x", true},
		{"ALTER SYSTEM SET work_mem = '1MB'", true},
		{"DROP TABLESPACE t", true},
		{"SELECT 1", false},
		{"SELECT touch()", false},
		{"UPDATE accounts SET a = 1", false},
		{"BEGIN; UPDATE accounts SET a = 1", false},
		{"CALL p()", false},
		{"DO $$ BEGIN END $$", false},
		{"FETCH 1 FROM c", false},
		{"begins", false},
		{"", false},
		{"/* unclosed", false},
		{"/* nested /* */ */ VACUUM", true}, // Postgres's comments nest
		{"/* nested /* */ VACUUM", false},   // still in the comment: nothing
		{"-- x\rVACUUM", true},              // \r ends a line comment too
		{"\vVACUUM", true},
	} {
		if got := WritesNothing(tc.sql); got != tc.want {
			t.Errorf("WritesNothing(%q) = %v, want %v", tc.sql, got, tc.want)
		}
	}
}

func TestSessionChange(t *testing.T) {
	ts := NewTokenSettings("fence.token", []string{"billing"})
	for _, tc := range []struct {
		sql  string
		want string // "" for none
	}{
		{"SELECT 1", ""},
		{"SET LOCAL fence.token = '5'", ""},
		{"SET fence.token = '5'; SELECT 1", "SET fence.token"},
		{"SELECT 1; RESET fence.token.billing", "RESET fence.token.billing"},
		{"SET fence.token TO DEFAULT", "SET fence.token"},
		{"SET search_path = a", ""},
		{"RESET ALL", "RESET ALL"},
		{"RESET work_mem", ""},
		{"DISCARD ALL", "DISCARD ALL"},
		{"DISCARD PLANS", ""},
		{"SELECT set_config('fence.token', $1, true)", ""},
		{"SELECT pg_catalog.set_config('fence.token', '5', false)", "set_config(..., false)"},
		{"SELECT set_config('FENCE.TOKEN', '5', false)", "set_config(..., false)"},
		{"SELECT set_config($1, $2, false)", "set_config(..., false)"},
		{"SELECT set_config('fence.token', '5', $3)", "set_config(..., false)"},
		{"SELECT set_config('work_mem', '1MB', false)", ""},
		{"SELECT current_setting('fence.token')", ""},
		{"UPDATE t SET fence_token = 1", ""},
		{`SET "fence"."token" = '5'; SELECT 1`, "SET fence.token"},
		{"SET fence . token = '5'; SELECT 1", "SET fence.token"},
		{`SELECT U&"\0073et_config"('fence.token', '5', false)`, "set_config(..., false)"},
		{`SET U&"\0066ence".token = '5'; SELECT 1`, "SET fence.token"},
		// Names as Postgres compares them: ASCII case folded, quoted or
		// not, and the whole namespace of the token setting.
		{`SET "FENCE.TOKEN" = '5'; SELECT 1`, "SET FENCE.TOKEN"},
		{`SELECT 1; RESET "Fence"."Token"."Billing"`, "RESET Fence.Token.Billing"},
		{"SELECT set_config('Fence.Token.BILLING', '5', false)", "set_config(..., false)"},
		{"SELECT set_config('fence.token.other', '5', false)", "set_config(..., false)"},
		{"SET fence.token.other = '5'; SELECT 1", "SET fence.token.other"},
		{"SELECT set_config('fence.tokens', '5', false)", ""},
		{"SELECT set_config('fence.tokenother', '5', false)", ""},
		{"ALTER ROLE app SET fence.token = '5'", "SET fence.token"},
		// Texts pgfence's parser cannot read may be such changes on an
		// older server (UPDATE ... SET system_user = ... runs on 15).
		{"UPDATE t SET system_user = 'x'; SET fence.token = '9'", unreadForm},
		{"UPDATE t SET system_user = 'x'; RESET ALL", unreadForm},
		{"UPDATE t SET system_user = 'x'; DISCARD ALL", unreadForm},
		{"UPDATE t SET system_user = 'x'; SELECT set_config('work_mem', '1MB', false)", unreadForm},
		{"not sql at all fence.token", unreadForm},
		{"UPDATE t SET reset_at = now(), system_user = 'it''s", unreadForm}, // the scanner fails too
		// ... but not when they spell none of the words that could be.
		{"UPDATE t SET system_user = 'x' WHERE reset_at IS NULL", ""},
		{"UPDATE t SET system_user = 'reset' WHERE id = 1", ""},
		{"UPDATE t SET system_user = 'x' /* discard */", ""},
	} {
		got, ok, unread := ts.SessionChange(tc.sql)
		if ok != (tc.want != "") || got != tc.want || (unread != nil) != (tc.want == unreadForm) {
			t.Errorf("SessionChange(%q) = %q, %v, %v; want %q", tc.sql, got, ok, unread, tc.want)
		}
		if unread != nil && (unread.Code != codeSyntax || !strings.Contains(unread.Message, "transaction pooler") ||
			!strings.Contains(unread.Message, parserGrammar) || unread.Hint == "") {
			t.Errorf("SessionChange(%q) refusal: %+v", tc.sql, unread)
		}
	}
}

// unreadForm is the form SessionChange gives a text it cannot read.
const unreadForm = "a statement pgfence cannot read"

func TestMatchReset(t *testing.T) {
	ts := NewTokenSettings("fence.token", []string{"billing"})
	for _, tc := range []struct {
		sql, name string
	}{
		{"RESET fence.token", "fence.token"},
		{"reset FENCE.TOKEN ;", "fence.token"},
		{"RESET fence.token.billing", "fence.token.billing"},
		{`RESET "FENCE.TOKEN"`, "fence.token"},
		{`RESET fence."Token"."BILLING";`, "fence.token.billing"},
		{`RESET "fence.token.other"`, ""},
		{`RESET "fence.token`, ""},
		{"RESET fence.token; SELECT 1", ""},
		{"RESET work_mem", ""},
		{"RESET ALL", ""},
	} {
		set, ok := ts.MatchReset(tc.sql)
		if ok != (tc.name != "") || set.Name != tc.name || (ok && (!set.Reset || set.Value != "")) {
			t.Errorf("MatchReset(%q) = %+v, %v; want %q", tc.sql, set, ok, tc.name)
		}
	}
}

func TestShowsToken(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want bool
	}{
		{"SHOW fence.token", true},
		{`SHOW "FENCE"."TOKEN"`, true},
		{"show Fence . Token", true},
		{`SHOW U&"\0066ence.token"`, true},
		{"SET LOCAL fence . token = '5'", true},
		{"RESET fence.token", true},
		{"SHOW work_mem", false},
		{"VACUUM fence_log", false},
		{"CREATE INDEX CONCURRENTLY ON fence (id)", false},
		{"BEGIN", false},
	} {
		if got := ShowsToken(tc.sql, "fence.token"); got != tc.want {
			t.Errorf("ShowsToken(%q) = %v, want %v", tc.sql, got, tc.want)
		}
	}
}

func TestTxStarts(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want []string // the text from each start on, up to the next ';'
	}{
		{"UPDATE t SET a = 1", nil},
		{"COMMIT", nil},
		{"BEGIN; UPDATE t SET a = 1; COMMIT;", nil},
		{"SELECT 1; UPDATE t SET a = 1", nil},
		{"BEGIN; COMMIT; UPDATE t SET a = 1", []string{" UPDATE t SET a = 1"}},
		{"begin;end;select 1", []string{"select 1"}},
		{"BEGIN; ROLLBACK; SELECT 1; ABORT; SELECT 2", []string{" SELECT 1", " SELECT 2"}},
		{"BEGIN; COMMIT AND CHAIN; SELECT 1; COMMIT", []string{" SELECT 1"}},
		{"SELECT 1; COMMIT -- done\n; SELECT 2", []string{" SELECT 2"}},
		{"BEGIN; ROLLBACK TO SAVEPOINT a; SELECT 1", nil},
		{"PREPARE TRANSACTION 'x'; SELECT 1", []string{" SELECT 1"}},
		{"COMMIT PREPARED 'x'; SELECT 1", []string{" SELECT 1"}},
		{"SELECT 'commit'; SELECT 1", nil},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; SELECT 2", nil},
		{"SELECT 1; COMMIT; /* c */ SELECT 2", []string{" /* c */ SELECT 2"}},
	} {
		starts, ref := TxStarts(tc.sql)
		if ref != nil {
			t.Errorf("TxStarts(%q) refused: %+v", tc.sql, ref)
			continue
		}
		var got []string
		for i, s := range starts {
			rest, _, _ := strings.Cut(tc.sql[s.Offset:], ";")
			got = append(got, rest)
			if i > 0 && s.Index <= starts[i-1].Index {
				t.Errorf("TxStarts(%q): indexes out of order: %+v", tc.sql, starts)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("TxStarts(%q) = %q, want %q", tc.sql, got, tc.want)
		}
	}
	if starts, _ := TxStarts("BEGIN; COMMIT; SELECT 1; COMMIT; SELECT 2"); len(starts) != 2 || starts[0].Index != 2 || starts[1].Index != 4 {
		t.Errorf("indexes: %+v", starts)
	}
	if _, ref := TxStarts("UPDATE t SET system_user = 'x'; COMMIT; SELECT 1"); ref == nil || ref.Code != codeSyntax || !strings.Contains(ref.Message, "transaction pooler") {
		t.Errorf("an unreadable text: %+v, want it refused", ref)
	}
}

func TestPooledSetParts(t *testing.T) {
	names := []string{"fence.token", "fence.token.billing"}
	parts, args := PooledSet(names)
	if len(parts) != len(args)+1 || !slices.Equal(args, []int{0, 1, 0, 0, 2, 0}) {
		t.Fatalf("parts %q, args %v", parts, args)
	}
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(p)
		if i < len(args) {
			b.WriteString("$" + strconv.Itoa(args[i]+1))
		}
	}
	sql := b.String()
	tree, err := pg_query.Parse(sql)
	if err != nil || len(tree.Stmts) != 1 {
		t.Fatalf("%s: %v", sql, err)
	}
	for _, want := range []string{"pg_catalog.set_config(E'fence.token', $2::pg_catalog.text, true)",
		"pg_catalog.set_config(E'fence.token.billing', $3::pg_catalog.text, true)",
		"COALESCE(pg_catalog.current_setting(E'pgfence.tx.fence.token', true), E'') OPERATOR(pg_catalog.<>) ($1::pg_catalog.text" + stamp,
		"pg_catalog.set_config(E'pgfence.tx.fence.token', ($1::pg_catalog.text" + stamp + ", true)", "pg_catalog.set_config(E'fence.token', E'', false)"} {
		if !strings.Contains(sql, want) {
			t.Errorf("the statement lacks %s:\n%s", want, sql)
		}
	}
}

// TestPooledSetSQL: both forms of the statement the proxy sends behind a
// transaction pooler are written here, so the proxy writes no SQL: the
// one with parameters, and the one with the nonce and values as literals,
// ended to go in front of a Query's statements.
func TestPooledSetSQL(t *testing.T) {
	names := []string{"fence.token", "fence.token.billing"}
	ext, text := PooledSetSQL(names)
	if tree, err := pg_query.Parse(ext); err != nil || len(tree.Stmts) != 1 {
		t.Fatalf("%s: %v", ext, err)
	}
	if !strings.Contains(ext, "pg_catalog.set_config(E'fence.token.billing', $3::pg_catalog.text, true)") {
		t.Errorf("the statement with parameters lacks the second value's:\n%s", ext)
	}
	sql := text(`n'1`, []string{`4\2`, ""})
	if !strings.HasSuffix(sql, ";") {
		t.Errorf("the statement with literals does not end with a semicolon:\n%s", sql)
	}
	if tree, err := pg_query.Parse(sql + " SELECT 1"); err != nil || len(tree.Stmts) != 2 {
		t.Fatalf("%s SELECT 1: %v", sql, err)
	}
	for _, want := range []string{`pg_catalog.set_config(E'fence.token', E'4\\2'::pg_catalog.text, true)`,
		`pg_catalog.set_config(E'fence.token.billing', E''::pg_catalog.text, true)`,
		`pg_catalog.set_config(E'pgfence.tx.fence.token', (E'n''1'::pg_catalog.text` + stamp + `, true)`} {
		if !strings.Contains(sql, want) {
			t.Errorf("the statement with literals lacks %s:\n%s", want, sql)
		}
	}
}

// stamp is what a pooled marker's value has after its nonce.
const stamp = " OPERATOR(pg_catalog.||) E' ' OPERATOR(pg_catalog.||) " + PooledStamp + ")"
