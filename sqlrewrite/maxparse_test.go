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

// The other parses a text's analysis makes besides the rewrite's are
// bounded too (red team 8: a 3 MB SELECT naming pgfence.* took pgfence to
// 550 MB): a text over the limit that may set one of pgfence's own
// settings, or, behind a transaction pooler, change a token setting for
// the session or end a transaction and go on, is refused with 54000.
func TestMaxParseAnalysis(t *testing.T) {
	rw, err := New(Config{Guards: []Guard{{Table: "accounts", Column: "fence_epoch"}}, TokenSetting: "fence.token", MaxParse: 200})
	if err != nil {
		t.Fatal(err)
	}
	long := "'" + strings.Repeat("x", 300) + "'"
	internal := rw.Analyze("SELECT current_setting('pgfence.x', true), "+long, false)
	if ref := internal.InternalChange(); ref == nil || ref.Code != CodeTooLarge {
		t.Errorf("a long text naming pgfence.*: %v, want %s", ref, CodeTooLarge)
	}
	session := rw.Analyze("SELECT set_config('fence.token', '5', false), "+long, true)
	if _, ok, ref := session.SessionChange(); !ok || ref == nil || ref.Code != CodeTooLarge {
		t.Errorf("a long text that may set the token for the session, pooled: %v %v, want refused %s", ok, ref, CodeTooLarge)
	}
	starts := rw.Analyze("COMMIT; SELECT "+long, true)
	if _, ref := starts.TxStarts(); ref == nil || ref.Code != CodeTooLarge {
		t.Errorf("a long text that ends a transaction and goes on, pooled: %v, want %s", ref, CodeTooLarge)
	}
	short := rw.Analyze("SELECT current_setting('pgfence.x', true)", false)
	if ref := short.InternalChange(); ref != nil {
		t.Errorf("a short read of pgfence.x: %v", ref)
	}
}
