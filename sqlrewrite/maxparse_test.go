package sqlrewrite

import (
	"strings"
	"testing"
)

// A text longer than Config.MaxParse is refused with 54000 when it may
// write a guarded table, as sent and as a template to bind; one that cannot
// write one passes unparsed, whatever its length, and one within the limit
// is fenced as ever.
func TestMaxParse(t *testing.T) {
	rw, err := New(Config{Guards: []Guard{{Table: "accounts", Column: "fence_epoch"}}, TokenSetting: "fence.token", MaxParse: 200})
	if err != nil {
		t.Fatal(err)
	}
	long := "'" + strings.Repeat("x", 300) + "'"
	for _, c := range []struct {
		sql  string
		mode Mode
		want string // "refused", "unchanged" or "fenced"
	}{
		{"UPDATE accounts SET v = 1 WHERE id = 2 AND v <> " + long, Simple, "refused"},
		{"UPDATE accounts SET v = $1 WHERE id = $2 AND v <> " + long, Prepared, "refused"},
		{"INSERT INTO accounts (id, v) VALUES (1, " + long + ")", Simple, "refused"},
		{"SELECT * FROM accounts WHERE v <> " + long, Simple, "unchanged"},
		{"UPDATE other SET v = 1 WHERE v <> " + long, Simple, "unchanged"},
		{"UPDATE accounts SET v = 1 WHERE id = 2", Simple, "fenced"},
	} {
		res, err := rw.Rewrite(c.sql, c.mode, nil)
		if err != nil {
			t.Fatalf("%.60s: %v", c.sql, err)
		}
		got := "fenced"
		switch {
		case res.Refusal != nil:
			got = "refused"
			if res.Refusal.Code != CodeTooLarge || !strings.Contains(res.Refusal.Message, "(200 bytes)") {
				t.Errorf("%.60s: refused %s %q, want %s naming the limit", c.sql, res.Refusal.Code, res.Refusal.Message, CodeTooLarge)
			}
		case res.SQL == c.sql:
			got = "unchanged"
		}
		if got != c.want {
			t.Errorf("%.60s: %s, want %s", c.sql, got, c.want)
		}
	}
	// A template longer than the limit is not planned: the text is then
	// rewritten as sent, and refused there.
	p, _ := parameterize("UPDATE accounts SET v = "+long+" WHERE id = 2", numbersOnly)
	if p.SQL == "" {
		t.Fatal("no template")
	}
	if _, ok, err := rw.RewriteTemplate(p); ok || err != nil {
		t.Errorf("a template of %d bytes planned (%v, %v) with MaxParse 200", len(p.SQL), ok, err)
	}
}
