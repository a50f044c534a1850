package sqlrewrite

import (
	"strconv"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

func TestTokenSet(t *testing.T) {
	cases := []struct {
		sql, name, value string
		local, ok        bool
	}{
		{"SET fence.token = '42'", "fence.token", "42", false, true},
		{"set fence.token to 42;", "fence.token", "42", false, true},
		{"  SET SESSION Fence.Token = '-7' ;  \n", "fence.token", "-7", false, true},
		{"SET fence.token=''", "fence.token", "", false, true},
		{"SET fence.token = 'a b-c'", "fence.token", "a b-c", false, true},
		{"SET fence.token = -2147483648", "fence.token", "-2147483648", false, true},
		{"SET fence.token = 123456789012345678", "fence.token", "123456789012345678", false, true},
		{"SET fence.token.billing = '9'", "fence.token.billing", "9", false, true},
		{"SET fence.token.billing_2 TO 0", "fence.token.billing_2", "0", false, true},
		{"SET LOCAL fence.token = '42'", "fence.token", "42", true, true},
		{"set local fence.token.billing to 3;", "fence.token.billing", "3", true, true},

		{"SET LOCAL SESSION fence.token = '42'", "", "", false, false}, // not SQL
		{"SET SESSION LOCAL fence.token = '42'", "", "", false, false}, // not SQL
		{"SET LOCALfence.token = '42'", "", "", false, false},          // no such setting

		{"SET fence.token = DEFAULT", "", "", false, false},            // a reset
		{"SET fence.token TO '1', '2'", "", "", false, false},          // a list
		{"SET fence.token = '42'; SELECT 1", "", "", false, false},     // two statements
		{"SET fence.token = '42' -- why", "", "", false, false},        // a comment
		{"/* c */ SET fence.token = '42'", "", "", false, false},       // a comment
		{`SET "fence.token" = '42'`, "fence.token", "42", false, true}, // a quoted name
		{`SET "FENCE.TOKEN" = '9'`, "fence.token", "9", false, true},   // Postgres folds setting names
		{`SET "fence"."token" TO 9`, "fence.token", "9", false, true},  // quoted parts
		{`SET fence."TOKEN" = '9'`, "fence.token", "9", false, true},   // one quoted part
		{`set "Fence.Token.BILLING" = '9'`, "fence.token.billing", "9", false, true},
		{`SET fence.token."to" = '1'`, "fence.token.to", "1", false, true}, // a keyword, quoted
		{`SET LOCAL "Fence.Token" = '1'`, "fence.token", "1", true, true},
		{`SET "fence.to""ken" = '1'`, "", "", false, false},             // another name
		{`SET "fence.token = '1'`, "", "", false, false},                // unterminated
		{`SET "" = '1'`, "", "", false, false},                          // an empty name
		{`SET "fence" . "token" = '1'`, "", "", false, false},           // spaced out: not plain
		{`SET U&"fence.token" = '1'`, "", "", false, false},             // an escape
		{`SET "fence.tokens" = '42'`, "", "", false, false},             // another setting
		{`SET "fence.token.other" = '42'`, "", "", false, false},        // not a domain of the configuration
		{"SET fence.tokens = '42'", "", "", false, false},               // another setting
		{"SET fence.token. = '42'", "", "", false, false},               // no domain
		{"SET fence.token.other = '42'", "", "", false, false},          // not a domain of the configuration
		{"SET fence.token.to = '42'", "", "", false, false},             // a keyword: Postgres refuses it
		{"SET search_path = 'x'", "", "", false, false},                 // not the token
		{"SET fence.token = E'42'", "", "", false, false},               // an escape string
		{"SET fence.token = 'it''s'", "", "", false, false},             // a doubled quote
		{`SET fence.token = 'a\b'`, "", "", false, false},               // a backslash
		{"SET fence.token = '42", "", "", false, false},                 // unterminated
		{"SET fence.token = 042", "", "", false, false},                 // stored as 42
		{"SET fence.token = -0", "", "", false, false},                  // stored as 0
		{"SET fence.token = 1.5", "", "", false, false},                 // a float
		{"SET fence.token = 1e3", "", "", false, false},                 // a float
		{"SET fence.token = 1234567890123456789", "", "", false, false}, // 19 digits
		{"SET fence.token = +5", "", "", false, false},                  // stored as 5
		{"SET fence.token = abc", "", "", false, false},                 // a word
		{"SET fence.token = $1", "", "", false, false},                  // a parameter
		{"SET fence.token", "", "", false, false},                       // cut short
		{"SET", "", "", false, false},
		{"SELECT set_config('fence.token', '1', false)", "", "", false, false},
		{"RESET fence.token", "", "", false, false},
	}
	ts := NewTokenSettings("fence.token", []string{"billing", "billing_2", "to"})
	for _, c := range cases {
		set, ok := ts.Match(c.sql)
		if ok != c.ok || set.Name != c.name || set.Value != c.value || set.Local != c.local {
			t.Errorf("Match(%q) = %+v, %v; want %q, %q, local %v, %v", c.sql, set, ok, c.name, c.value, c.local, c.ok)
		}
		if c.ok {
			checkTokenSet(t, c.sql, set)
		}
	}
	if _, ok := NewTokenSettings("App.Lease", nil).Match("SET app.lease = '1'"); !ok {
		t.Error("a token setting configured in capitals is not recognized")
	}
	if _, ok := NewTokenSettings("fence.select", nil).Match("SET fence.select = '1'"); ok {
		t.Error("a token setting Postgres cannot parse unquoted is recognized")
	}
}

// checkTokenSet checks what Match said of sql against Postgres's own
// parser: one plain SET (LOCAL or not) of set.Name to a constant Postgres
// stores as set.Value.
func checkTokenSet(t *testing.T, sql string, set TokenSet) {
	t.Helper()
	tree, err := pg_query.Parse(sql)
	if err != nil {
		t.Fatalf("Match accepted %q, which Postgres's parser refuses: %v", sql, err)
	}
	if len(tree.Stmts) != 1 {
		t.Fatalf("Match accepted %q, which has %d statements", sql, len(tree.Stmts))
	}
	stmt := tree.Stmts[0].Stmt.GetVariableSetStmt()
	if stmt == nil || stmt.Kind != pg_query.VariableSetKind_VAR_SET_VALUE || stmt.IsLocal != set.Local || asciiLower(stmt.Name) != set.Name || len(stmt.Args) != 1 {
		t.Fatalf("Match accepted %q as %+v, but the parser reads %v", sql, set, tree.Stmts[0].Stmt)
	}
	c := stmt.Args[0].GetAConst()
	var stored string
	switch {
	case c == nil:
		t.Fatalf("Match accepted %q, whose value is no constant: %v", sql, stmt.Args[0])
	case c.GetSval() != nil:
		stored = c.GetSval().Sval
	case c.GetIval() != nil:
		stored = strconv.Itoa(int(c.GetIval().Ival))
	case c.GetFval() != nil:
		stored = c.GetFval().Fval
	default:
		t.Fatalf("Match accepted %q, whose value is %v", sql, c)
	}
	if stored != set.Value {
		t.Fatalf("Match(%q) says the value is %q; Postgres stores %q", sql, set.Value, stored)
	}
}

// FuzzTokenSet checks that whatever TokenSettings.Match accepts, Postgres's parser
// reads as the same one SET.
func FuzzTokenSet(f *testing.F) {
	for _, s := range []string{
		"SET fence.token = '42'", "set session fence.token to 7;", "SET fence.token.billing = -3",
		"SET fence.token = 'x''y'", "SET fence.token = 0042", "SET LOCAL fence.token = 1",
		"SET LOCAL SESSION fence.token = 1", "set local fence.token.billing to '5'",
		`SET "FENCE"."TOKEN" = '1'`, `SET fence.token."select" = 2`, `SET "fence.token.x""1" = '3'`,
	} {
		f.Add(s)
	}
	ts := NewTokenSettings("fence.token", []string{"billing", "to", "select", "x1"})
	f.Fuzz(func(t *testing.T, sql string) {
		if set, ok := ts.Match(sql); ok {
			checkTokenSet(t, sql, set)
		}
	})
}
