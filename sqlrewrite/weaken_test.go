package sqlrewrite

import (
	"strings"
	"testing"
)

// TestDDLWeakeningRefused: DDL that would leave a guarded table's backstop
// weaker is refused in the text (42501), whoever sends it; ordinary
// migrations pass unchanged.
func TestDDLWeakeningRefused(t *testing.T) {
	refused := []string{
		`ALTER TABLE accounts DISABLE TRIGGER USER`,
		`ALTER TABLE public.accounts DISABLE TRIGGER ALL`,
		`alter table ACCOUNTS disable trigger "~pgfence_backstop"`,
		`ALTER TABLE accounts DISABLE TRIGGER "~pgfence_backstop_truncate"`,
		`ALTER TABLE accounts ENABLE REPLICA TRIGGER "~pgfence_backstop"`,
		`ALTER TABLE accounts ENABLE ALWAYS TRIGGER "~pgfence_backstop"`,
		`ALTER TABLE accounts ALTER COLUMN fence_epoch TYPE bigint USING 0`,
		`ALTER TABLE accounts ALTER fence_epoch SET DATA TYPE int`,
		`ALTER TABLE accounts ALTER COLUMN note TYPE text USING CASE WHEN id = 1 THEN 'x' ELSE note END`,
		`ALTER TABLE accounts DROP COLUMN fence_epoch`,
		`ALTER TABLE accounts ADD COLUMN x int, DROP COLUMN fence_epoch CASCADE`,
		`ALTER TABLE accounts RENAME COLUMN fence_epoch TO e`,
		`ALTER TABLE accounts RENAME fence_epoch TO e`,
		`ALTER TRIGGER "~pgfence_backstop" ON accounts RENAME TO mine`,
		`ALTER TRIGGER audit ON accounts RENAME TO "~~late"`,
		`ALTER TRIGGER audit ON accounts RENAME TO "~pgfence_backstop_p1"`,
		`CREATE TRIGGER "~pgfence_backstop_p1" BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION forge()`,
		`DROP TRIGGER "~pgfence_backstop" ON accounts`,
		`DROP TRIGGER IF EXISTS "~pgfence_epoch" ON public.accounts`,
		`CREATE OR REPLACE TRIGGER "~pgfence_backstop" BEFORE INSERT OR UPDATE OR DELETE ON accounts FOR EACH ROW WHEN (false) EXECUTE FUNCTION pgfence.backstop_x()`,
		`CREATE TRIGGER "~~forge" BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION forge()`,
		`BEGIN; ALTER TABLE accounts DISABLE TRIGGER USER; DO $$ BEGIN UPDATE accounts SET v = 1; END $$; ALTER TABLE accounts ENABLE TRIGGER USER; COMMIT`,
		`ALTER TABLE parent DETACH PARTITION accounts`,
		`ALTER TABLE accounts DETACH PARTITION accounts_2027`,
		`DROP FUNCTION pgfence.backstop_0123456789abcdef() CASCADE`,
		`CREATE OR REPLACE FUNCTION pgfence.claim_domain(d text, tok bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$`,
		`ALTER FUNCTION pgfence.claim_domain(text, bigint) OWNER TO app`,
		`DROP SCHEMA pgfence CASCADE`,
		`DROP TABLE pgfence.domains`,
	}
	passed := []string{
		`ALTER TABLE accounts ADD COLUMN note text`,
		`ALTER TABLE accounts ALTER COLUMN note TYPE varchar(10)`,
		`ALTER TABLE accounts RENAME TO accounts_old`,
		`ALTER TABLE accounts ENABLE TRIGGER "~pgfence_backstop"`,
		`ALTER TABLE accounts DISABLE TRIGGER mine`,
		`CREATE INDEX ON accounts (note)`,
		`CREATE TRIGGER audit BEFORE UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION audit()`,
		`CREATE TRIGGER "~~late" AFTER UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION audit()`,
		`DROP TRIGGER audit ON accounts`,
		`ALTER TRIGGER audit ON accounts RENAME TO audit_before`,
		`ALTER TRIGGER "~~late" ON other RENAME TO "~~later"`,
		`DROP TABLE accounts`,
		`ALTER TABLE other DISABLE TRIGGER ALL`,
		`DROP TRIGGER "~pgfence_backstop" ON other`,
		`ALTER TABLE other DROP COLUMN fence_epoch`,
		`COMMENT ON TABLE accounts IS 'mine'`,
	}
	for _, guard := range []bool{false, true} {
		r, err := New(Config{TokenSetting: "fence.token", DDLGuard: guard, Guards: []Guard{{Table: "accounts", Column: "fence_epoch"}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, sql := range refused {
			if guard && strings.Contains(sql, "DETACH") {
				continue // the database's guard gives the partition its own backstop
			}
			res, err := r.Rewrite(sql, Simple, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Refusal == nil || res.Refusal.Code != codeWeakens || !strings.Contains(res.Refusal.Message, "pgfence") {
				t.Errorf("guard %v: %s: %+v, want refused with %s", guard, sql, res.Refusal, codeWeakens)
			}
		}
		for _, sql := range passed {
			res, err := r.Rewrite(sql, Simple, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Refusal != nil || res.SQL != sql {
				t.Errorf("guard %v: %s: refused or rewritten: %+v", guard, sql, res.Refusal)
			}
		}
		if guard {
			res, _ := r.Rewrite(`ALTER TABLE parent DETACH PARTITION accounts`, Simple, nil)
			if res.Refusal != nil {
				t.Errorf("DETACH with the database's guard in place: %+v", res.Refusal)
			}
		}
	}
	// Every refused text is one the policy sends to the rewriter.
	for _, sql := range refused {
		r := mustNew(t, "fence.token", "accounts")
		cl := r.Classify(sql)
		if !cl.Has(Touches) || !cl.Has(Writes) && !MayBeDDL(sql, cl) {
			t.Errorf("%s: class %b would pass it unread", sql, cl)
		}
	}
}
