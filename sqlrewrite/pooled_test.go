package sqlrewrite

import "testing"

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
		{"not sql at all fence.token", ""}, // Postgres refuses it
	} {
		got, ok := ts.SessionChange(tc.sql)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("SessionChange(%q) = %q, %v; want %q", tc.sql, got, ok, tc.want)
		}
	}
}

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
