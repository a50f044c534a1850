package fence_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// domainToken reads lock domain d's token straight from Postgres.
func domainToken(t *testing.T, d string) int64 {
	t.Helper()
	var tok int64
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT token FROM pgfence.domains WHERE domain = $1", d).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

// contents is a table's rows, read straight from Postgres.
func contents(t *testing.T, tbl string) string {
	t.Helper()
	var s string
	if err := pgtest.Direct(t).QueryRow(ctx, "SELECT coalesce(string_agg(format('%s:%s:%s', id, val, fence_epoch), ' ' ORDER BY id), '') FROM "+tbl).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// wantConflict checks the error of a write whose lock domain's setting
// (setting.billing = '50') and general one (setting = '40') disagree: it
// names what is written, one of subjects (whichever expression reading the
// token ran first).
func wantConflict(t *testing.T, what string, err error, setting string, subjects ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error; want 22023 for a leftover %s.billing that disagrees with %s", what, setting, setting)
	}
	pe := pgErr(t, err)
	msg := "pgfence: both " + setting + ".billing and " + setting + " are set, to different tokens ('50' and '40'), for a write to "
	hint := "a per-domain token left over from another lease must not override the one you set: RESET the setting of the lease you do not hold (RESET " +
		setting + ".billing), or set both to the same token"
	subject, ok := strings.CutPrefix(pe.Message, msg)
	if pe.Code != "22023" || !ok || !slices.Contains(subjects, subject) || pe.Hint != hint {
		t.Fatalf("%s: got %s %q hint %q\nwant 22023 %q + one of %q, hint %q", what, pe.Code, pe.Message, pe.Hint, msg, subjects, hint)
	}
}

// The precedence of a lock domain's token settings: a per-domain token
// left over on a connection (by the newer holder, say) must not override
// the token the next user of the connection sets. Both set to different
// tokens fails every write to the domain, even one that matches no row,
// and changes nothing; either alone, or both the same, is the token.
func TestPrecedenceLeftoverDomainToken(t *testing.T) {
	for _, setting := range []string{"fence.token", "app.lease"} {
		t.Run(strings.ReplaceAll(setting, ".", "_"), func(t *testing.T) {
			tbl := table(t, [3]any{1, "x", 0}, [3]any{2, "y", 0})
			p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "billing"), func(_ *proxy.Config, fc *fence.Config) {
				fc.TokenSetting = setting
			})
			subject := `guarded table "` + tbl + `" in lock domain "billing"`

			// The newer holder writes row 1 with its per-domain token 50 and
			// leaves the setting on its (pooled) connection.
			c := p.Connect(t)
			pgtest.Exec(t, c, "SET "+setting+".billing = '50'")
			if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'new' WHERE id = 1"); tag != "UPDATE 1" {
				t.Fatalf("newer holder: %s", tag)
			}
			before := contents(t, tbl)
			if before != "1:new:50 2:y:0" || domainToken(t, "billing") != 50 {
				t.Fatalf("after the newer holder: %q, domain token %d", before, domainToken(t, "billing"))
			}

			// (1) The stale holder gets the connection and sets its own token
			// 40: every write to the domain fails, and nothing changes.
			pgtest.Exec(t, c, "SET "+setting+" = '40'")
			for _, w := range []struct{ sql, subject string }{
				{"UPDATE " + tbl + " SET val = 'stale' WHERE id = 2", subject},
				{"UPDATE " + tbl + " SET val = 'stale' WHERE id = 12345", subject}, // matches nothing: still fails
				{"UPDATE " + tbl + " SET val = 'stale'", subject},
				{"DELETE FROM " + tbl + " WHERE id = 2", subject},
				{"DELETE FROM " + tbl + " WHERE id = 12345", subject},
				// The INSERT's stamp checks the token before it reads the claim.
				{"INSERT INTO " + tbl + " (id, val) VALUES (3, 'stale')", subject},
				{"INSERT INTO " + tbl + " (id, val) VALUES (2, 'stale') ON CONFLICT (id) DO UPDATE SET val = excluded.val", subject},
			} {
				for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
					_, err := c.Exec(ctx, w.sql, mode)
					wantConflict(t, w.sql+" ("+mode.String()+")", err, setting, w.subject)
				}
			}
			// In a transaction, with SET LOCAL, as a pool's user would.
			pgtest.Exec(t, c, "RESET "+setting)
			pgtest.Exec(t, c, "BEGIN")
			pgtest.Exec(t, c, "SET LOCAL "+setting+" = '40'")
			_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 2")
			wantConflict(t, "UPDATE in a transaction", err, setting, subject)
			pgtest.Exec(t, c, "ROLLBACK")
			if got := contents(t, tbl); got != before || domainToken(t, "billing") != 50 {
				t.Fatalf("conflicting settings changed something: %q (was %q), domain token %d", got, before, domainToken(t, "billing"))
			}

			// (5) Once the leftover is reset, the stale token 40 is fenced by
			// the domain as usual: row 2, which the newer holder never
			// touched, is not written either.
			pgtest.Exec(t, c, "RESET "+setting+".billing")
			pgtest.Exec(t, c, "SET "+setting+" = '40'")
			if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 2"); tag != "UPDATE 0" {
				t.Fatalf("token 40 after RESET of the leftover, domain at 50: %s, want UPDATE 0", tag)
			}
			if _, err := c.Exec(ctx, "INSERT INTO "+tbl+" (id, val) VALUES (3, 'stale')"); err == nil || pgErr(t, err).Code != "PF001" {
				t.Fatalf("stale INSERT after RESET of the leftover: %v, want PF001", err)
			}
			if got := contents(t, tbl); got != before {
				t.Fatalf("stale writes landed: %q (was %q)", got, before)
			}

			// (2) Only the per-domain setting: it is the token, and stamped.
			pgtest.Exec(t, c, "RESET "+setting)
			pgtest.Exec(t, c, "SET "+setting+".billing = '60'")
			if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'd60' WHERE id = 2"); tag != "UPDATE 1" {
				t.Fatalf("only %s.billing = 60: %s", setting, tag)
			}
			if tag := pgtest.Exec(t, c, "INSERT INTO "+tbl+" (id, val) VALUES (3, 'd60')"); tag != "INSERT 0 1" {
				t.Fatalf("only %s.billing = 60: %s", setting, tag)
			}
			if got := contents(t, tbl); got != "1:new:50 2:d60:60 3:d60:60" || domainToken(t, "billing") != 60 {
				t.Fatalf("only %s.billing = 60: %q, domain token %d", setting, got, domainToken(t, "billing"))
			}

			// (3) Only the general setting: it is the token.
			pgtest.Exec(t, c, "RESET "+setting+".billing")
			pgtest.Exec(t, c, "SET "+setting+" = '70'")
			if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'g70' WHERE id = 1"); tag != "UPDATE 1" {
				t.Fatalf("only %s = 70: %s", setting, tag)
			}
			if tag := pgtest.Exec(t, c, "DELETE FROM "+tbl+" WHERE id = 3"); tag != "DELETE 1" {
				t.Fatalf("only %s = 70: %s", setting, tag)
			}
			if got := contents(t, tbl); got != "1:g70:70 2:d60:60" || domainToken(t, "billing") != 70 {
				t.Fatalf("only %s = 70: %q, domain token %d", setting, got, domainToken(t, "billing"))
			}

			// (4) Both set to the same token: it is the token.
			pgtest.Exec(t, c, "SET "+setting+".billing = '80'")
			pgtest.Exec(t, c, "SET "+setting+" = '80'")
			if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'b80' WHERE id = 2"); tag != "UPDATE 1" {
				t.Fatalf("both 80: %s", tag)
			}
			if tag := pgtest.Exec(t, c, "INSERT INTO "+tbl+" (id, val) VALUES (4, 'b80')"); tag != "INSERT 0 1" {
				t.Fatalf("both 80: %s", tag)
			}
			if got := contents(t, tbl); got != "1:g70:70 2:b80:80 4:b80:80" || domainToken(t, "billing") != 80 {
				t.Fatalf("both 80: %q, domain token %d", got, domainToken(t, "billing"))
			}
			// An empty setting counts as unset.
			pgtest.Exec(t, c, "SET "+setting+".billing = ''")
			pgtest.Exec(t, c, "SET "+setting+" = '90'")
			if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'g90' WHERE id = 2"); tag != "UPDATE 1" {
				t.Fatalf("%s.billing empty, %s = 90: %s", setting, setting, tag)
			}
			if _, epoch := row(t, tbl, 2); epoch != 90 {
				t.Fatalf("%s.billing empty, %s = 90: epoch %d", setting, setting, epoch)
			}
		})
	}
}

// The rule holds for a domain table that lets writes without a token
// through (its domain check reads the allow-missing token) and for a Shadow
// table in a domain (which reads the domain's setting first too), and
// tables outside a domain never read the per-domain setting.
func TestPrecedenceOtherRollouts(t *testing.T) {
	t.Run("allow-missing", func(t *testing.T) {
		tbl := table(t, [3]any{1, "x", 0})
		p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "billing"), func(_ *proxy.Config, fc *fence.Config) {
			fc.Guards[0].AllowMissingToken = true
		})
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token.billing = '50'")
		pgtest.Exec(t, c, "SET fence.token = '40'")
		for _, sql := range []string{
			"UPDATE " + tbl + " SET val = 'stale' WHERE id = 1",
			"DELETE FROM " + tbl + " WHERE id = 1",
			"INSERT INTO " + tbl + " (id, val) VALUES (2, 'stale')",
		} {
			_, err := c.Exec(ctx, sql)
			wantConflict(t, sql, err, "fence.token", `guarded table "`+tbl+`" in lock domain "billing"`)
		}
		// Unlike a table that needs a token, one that lets writes without
		// one through has no check that runs before any row is read: a write
		// that matches no row reads no token, and its claim claims nothing.
		token := domainToken(t, "billing")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 12345"); tag != "UPDATE 0" {
			t.Fatalf("a write that matches no row: %s", tag)
		}
		if got := contents(t, tbl); got != "1:x:0" || domainToken(t, "billing") != token {
			t.Fatalf("conflicting settings changed something: %q, domain token %d (was %d)", got, domainToken(t, "billing"), token)
		}
		pgtest.Exec(t, c, "RESET fence.token")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'd50' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("only fence.token.billing: %s", tag)
		}
		if _, epoch := row(t, tbl, 1); epoch != 50 {
			t.Fatalf("only fence.token.billing = 50: epoch %d", epoch)
		}
	})
	t.Run("shadow", func(t *testing.T) {
		tbl := table(t, [3]any{1, "x", 0})
		p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "billing"), func(_ *proxy.Config, fc *fence.Config) {
			fc.Guards[0].Rollout = sqlrewrite.Shadow
		})
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token.billing = '50'")
		pgtest.Exec(t, c, "SET fence.token = '40'")
		for _, sql := range []string{
			"UPDATE " + tbl + " SET val = 'stale' WHERE id = 1",
			"DELETE FROM " + tbl + " WHERE id = 1",
			"INSERT INTO " + tbl + " (id, val) VALUES (2, 'stale')",
		} {
			_, err := c.Exec(ctx, sql)
			wantConflict(t, sql, err, "fence.token", `lock domain "billing"`)
		}
		if got := contents(t, tbl); got != "1:x:0" {
			t.Fatalf("conflicting settings changed something: %q", got)
		}
		pgtest.Exec(t, c, "SET fence.token = '50'")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'b50' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("both 50: %s", tag)
		}
		if _, epoch := row(t, tbl, 1); epoch != 50 {
			t.Fatalf("both 50: epoch %d", epoch)
		}
	})
	t.Run("no domain", func(t *testing.T) {
		tbl := table(t, [3]any{1, "x", 0})
		p := pgtest.StartProxy(t, []string{tbl})
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token.billing = '50'")
		pgtest.Exec(t, c, "SET fence.token = '40'")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'g40' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("no domain: %s", tag)
		}
		if _, epoch := row(t, tbl, 1); epoch != 40 {
			t.Fatalf("no domain: epoch %d, want 40 (fence.token only)", epoch)
		}
	})
}

// A conflict error is not mistaken for a malformed token: its hint tells
// the user which setting to reset, and a malformed token keeps its own.
func TestPrecedenceHintsDiffer(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 0})
	p := pgtest.StartProxy(t, []string{tbl}, inDomain(t, "billing"))
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token.billing = 'abc'")
	_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'w' WHERE id = 1")
	if pe := pgErr(t, err); pe.Code != "22023" || !strings.Contains(pe.Message, "must be an integer") || !strings.Contains(pe.Hint, "whole number") {
		t.Fatalf("malformed per-domain token: %s %q hint %q", pe.Code, pe.Message, pe.Hint)
	}
}
