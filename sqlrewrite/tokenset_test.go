package sqlrewrite

import (
	"strconv"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

func TestTokenSet(t *testing.T) {
	cases := []struct {
		sql, name, value string
		ok               bool
	}{
		{"SET fence.token = '42'", "fence.token", "42", true},
		{"set fence.token to 42;", "fence.token", "42", true},
		{"  SET SESSION Fence.Token = '-7' ;  \n", "fence.token", "-7", true},
		{"SET fence.token=''", "fence.token", "", true},
		{"SET fence.token = 'a b-c'", "fence.token", "a b-c", true},
		{"SET fence.token = -2147483648", "fence.token", "-2147483648", true},
		{"SET fence.token = 123456789012345678", "fence.token", "123456789012345678", true},
		{"SET fence.token.billing = '9'", "fence.token.billing", "9", true},
		{"SET fence.token.billing_2 TO 0", "fence.token.billing_2", "0", true},

		{"SET LOCAL fence.token = '42'", "", "", false},          // undone at commit
		{"SET fence.token = DEFAULT", "", "", false},             // a reset
		{"SET fence.token TO '1', '2'", "", "", false},           // a list
		{"SET fence.token = '42'; SELECT 1", "", "", false},      // two statements
		{"SET fence.token = '42' -- why", "", "", false},         // a comment
		{"/* c */ SET fence.token = '42'", "", "", false},        // a comment
		{`SET "fence.token" = '42'`, "", "", false},              // a quoted name
		{"SET fence.tokens = '42'", "", "", false},               // another setting
		{"SET fence.token. = '42'", "", "", false},               // no domain
		{"SET fence.token.other = '42'", "", "", false},          // not a domain of the configuration
		{"SET fence.token.to = '42'", "", "", false},             // a keyword: Postgres refuses it
		{"SET search_path = 'x'", "", "", false},                 // not the token
		{"SET fence.token = E'42'", "", "", false},               // an escape string
		{"SET fence.token = 'it''s'", "", "", false},             // a doubled quote
		{`SET fence.token = 'a\b'`, "", "", false},               // a backslash
		{"SET fence.token = '42", "", "", false},                 // unterminated
		{"SET fence.token = 042", "", "", false},                 // stored as 42
		{"SET fence.token = -0", "", "", false},                  // stored as 0
		{"SET fence.token = 1.5", "", "", false},                 // a float
		{"SET fence.token = 1e3", "", "", false},                 // a float
		{"SET fence.token = 1234567890123456789", "", "", false}, // 19 digits
		{"SET fence.token = +5", "", "", false},                  // stored as 5
		{"SET fence.token = abc", "", "", false},                 // a word
		{"SET fence.token = $1", "", "", false},                  // a parameter
		{"SET fence.token", "", "", false},                       // cut short
		{"SET", "", "", false},
		{"SELECT set_config('fence.token', '1', false)", "", "", false},
		{"RESET fence.token", "", "", false},
	}
	ts := NewTokenSettings("fence.token", []string{"billing", "billing_2", "to"})
	for _, c := range cases {
		name, value, ok := ts.Match(c.sql)
		if ok != c.ok || name != c.name || value != c.value {
			t.Errorf("Match(%q) = %q, %q, %v; want %q, %q, %v", c.sql, name, value, ok, c.name, c.value, c.ok)
		}
		if c.ok {
			checkTokenSet(t, c.sql, name, value)
		}
	}
	if _, _, ok := NewTokenSettings("App.Lease", nil).Match("SET app.lease = '1'"); !ok {
		t.Error("a token setting configured in capitals is not recognized")
	}
	if _, _, ok := NewTokenSettings("fence.select", nil).Match("SET fence.select = '1'"); ok {
		t.Error("a token setting Postgres cannot parse unquoted is recognized")
	}
}

// checkTokenSet checks what Match said of sql against Postgres's own
// parser: one plain SET of name to a constant Postgres stores as value.
func checkTokenSet(t *testing.T, sql, name, value string) {
	t.Helper()
	tree, err := pg_query.Parse(sql)
	if err != nil {
		t.Fatalf("Match accepted %q, which Postgres's parser refuses: %v", sql, err)
	}
	if len(tree.Stmts) != 1 {
		t.Fatalf("Match accepted %q, which has %d statements", sql, len(tree.Stmts))
	}
	set := tree.Stmts[0].Stmt.GetVariableSetStmt()
	if set == nil || set.Kind != pg_query.VariableSetKind_VAR_SET_VALUE || set.IsLocal || set.Name != name || len(set.Args) != 1 {
		t.Fatalf("Match accepted %q as setting %q, but the parser reads %v", sql, name, tree.Stmts[0].Stmt)
	}
	c := set.Args[0].GetAConst()
	var stored string
	switch {
	case c == nil:
		t.Fatalf("Match accepted %q, whose value is no constant: %v", sql, set.Args[0])
	case c.GetSval() != nil:
		stored = c.GetSval().Sval
	case c.GetIval() != nil:
		stored = strconv.Itoa(int(c.GetIval().Ival))
	case c.GetFval() != nil:
		stored = c.GetFval().Fval
	default:
		t.Fatalf("Match accepted %q, whose value is %v", sql, c)
	}
	if stored != value {
		t.Fatalf("Match(%q) says the value is %q; Postgres stores %q", sql, value, stored)
	}
}

// FuzzTokenSet checks that whatever TokenSettings.Match accepts, Postgres's parser
// reads as the same one SET.
func FuzzTokenSet(f *testing.F) {
	for _, s := range []string{
		"SET fence.token = '42'", "set session fence.token to 7;", "SET fence.token.billing = -3",
		"SET fence.token = 'x''y'", "SET fence.token = 0042", "SET LOCAL fence.token = 1",
	} {
		f.Add(s)
	}
	ts := NewTokenSettings("fence.token", []string{"billing", "to", "select", "x1"})
	f.Fuzz(func(t *testing.T, sql string) {
		name, value, ok := ts.Match(sql)
		if ok {
			checkTokenSet(t, sql, name, value)
		}
	})
}
