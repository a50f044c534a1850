package sqlrewrite

import (
	"strings"
	"testing"
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
		{"/* nested /* */ */ VACUUM", false},
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
