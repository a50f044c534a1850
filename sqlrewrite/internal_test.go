package sqlrewrite

import (
	"strings"
	"testing"
)

func TestInternalChange(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want string // the setting refused, "" for none
	}{
		{"SET pgfence.stale_0 = '5'", "pgfence.stale_0"},
		{"set session PGFENCE.STALE_0 to 5", "pgfence.stale_0"},
		{"SET LOCAL pgfence.tx.fence.token = 'y'", "pgfence.tx.fence.token"},
		{`SET "pgfence.stale_0" = '5'`, "pgfence.stale_0"},
		{`SET "PGFENCE"."Stale_0" = '5'`, "pgfence.stale_0"},
		{`SET U&"pg\0066ence.stale_0" = '5'`, "pgfence.stale_0"},
		{"RESET pgfence.noticed", "pgfence.noticed"},
		{"SET pgfence.exempt_noted TO DEFAULT", "pgfence.exempt_noted"},
		{"SELECT set_config('pgfence.stale_0', '5', false)", "pgfence.stale_0"},
		{"SELECT pg_catalog.set_config(E'PGFENCE.dstale_1', '5', true)", "pgfence.dstale_1"},
		{`SELECT set_config(E'\x70gfence.stale_0', '5', true)`, "pgfence.stale_0"},
		{"SELECT set_config('pgf'\n'ence.stale_0', '5', true)", "pgfence.stale_0"},
		{`SELECT set_config(U&'pg\0066ence.x', '5', true)`, "pgfence.x"},
		{"SELECT set_config('pgfence.x'::text, '5', true)", "pgfence.x"},
		{"SELECT set_config($$pgfence.x$$, '5', true)", "pgfence.x"},
		{"SELECT * FROM set_config('pgfence.x', '1', false)", "pgfence.x"},
		{"SELECT 1; SET pgfence.x = 1", "pgfence.x"},
		{"ALTER ROLE app SET pgfence.stale_0 = '5'", "pgfence.stale_0"},
		{"ALTER DATABASE app RESET pgfence.stale_0", "pgfence.stale_0"},
		{"ALTER SYSTEM SET pgfence.stale_0 = '5'", "pgfence.stale_0"},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql SET pgfence.stale_0 = '1' AS 'SELECT 1'", "pgfence.stale_0"},
		{"BEGIN; SET LOCAL pgfence.stale_0 = '5'; COMMIT", "pgfence.stale_0"},
		{"PREPARE p AS SELECT set_config('pgfence.x', $1, false)", "pgfence.x"},
		// Reading them, and other settings, pass.
		{"SHOW pgfence.stale_0", ""},
		{"SELECT current_setting('pgfence.stale_0', true)", ""},
		{"SELECT * FROM pgfence.domains", ""},
		{"SET fence.token = '5'", ""},
		{"SELECT set_config('fence.token', '5', true)", ""},
		{"SELECT set_config('app.pgfence', '5', true)", ""},
		{"SET pgfencex.y = 1", ""},
		// What the text cannot say, it cannot refuse: a computed name, a
		// function's body.
		{"SELECT set_config('pgfence.' || 'stale_0', '5', false)", ""},
		{"DO $$ BEGIN PERFORM set_config('pgfence.stale_0', '5', false); END $$", ""},
		{"CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ SELECT set_config('pgfence.x', '1', false) $$", ""},
	} {
		ref := InternalChange(tc.sql)
		switch {
		case tc.want == "" && ref != nil:
			t.Errorf("InternalChange(%q) = %+v, want nil", tc.sql, ref)
		case tc.want != "" && (ref == nil || ref.Code != "42501" || !strings.Contains(ref.Message, " "+tc.want+" ") ||
			!strings.Contains(ref.Message, "pgfence's own") || ref.Hint == ""):
			t.Errorf("InternalChange(%q) = %+v, want 42501 naming %s", tc.sql, ref, tc.want)
		}
		if ref != nil && ref.Code == "42501" {
			// The refusal reads back with its hint, as the server raises it.
			back, ok := ParseErrorMarker("22P02", `invalid input syntax for type bigint: "pgfence 42501: `+strings.TrimPrefix(ref.Message, "pgfence: ")+`"`)
			if !ok || back.Code != "42501" || back.Hint != ref.Hint {
				t.Errorf("InternalChange(%q): the refusal reads back as %+v", tc.sql, back)
			}
		}
	}
	// A text the parser cannot read is refused only when it may name one.
	if ref := InternalChange("UPDATE t SET system_user = 'x'; SET pgfence.x = 1"); ref == nil || ref.Code != codeSyntax {
		t.Errorf("an unreadable text naming pgfence: %+v, want 42601", ref)
	}
	if ref := InternalChange("UPDATE t SET system_user = 'x'; SET work_mem = 1"); ref != nil {
		t.Errorf("an unreadable text naming no pgfence setting: %+v, want nil", ref)
	}
}

func TestInternalChangeAllocs(t *testing.T) {
	for _, sql := range []string{"UPDATE accounts SET balance = balance - 1 WHERE id = 42", "SELECT set_config('fence.token', $1, true)"} {
		if n := testing.AllocsPerRun(100, func() { InternalChange(sql) }); n != 0 {
			t.Errorf("InternalChange(%q) allocates %v times, want 0", sql, n)
		}
	}
}

func TestIsInternal(t *testing.T) {
	for name, want := range map[string]bool{"pgfence.x": true, "PGFENCE.tx.a": true, "pgfence": false, "pgfencex.y": false, "fence.token": false} {
		if IsInternal(name) != want {
			t.Errorf("IsInternal(%q) = %v", name, !want)
		}
	}
}
