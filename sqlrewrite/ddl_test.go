package sqlrewrite

import "testing"

func TestMayChangeTables(t *testing.T) {
	for _, c := range []struct {
		sql  string
		want bool
	}{
		{"CREATE TABLE t (id int, fence_epoch bigint NOT NULL DEFAULT 0)", true},
		{"create table t (id int)", true},
		{"ALTER TABLE accounts RENAME TO accounts2", true},
		{"alter table accounts set schema billing", true},
		{"ALTER TABLE p ATTACH PARTITION p1 FOR VALUES IN (1)", true},
		{"IMPORT FOREIGN SCHEMA s FROM SERVER x INTO public", true},
		{"BEGIN; CREATE TABLE c () INHERITS (p); COMMIT", true},
		{"SELECT 1", false},
		{"UPDATE accounts SET created_at = now() WHERE id = 1", false},
		{"SELECT altered, creator FROM t", false},
		{"INSERT INTO t VALUES (1)", false},
	} {
		if got := Classify(c.sql).Has(ChangesTables); got != c.want {
			t.Errorf("ChangesTables of %q: %v, want %v", c.sql, got, c.want)
		}
	}
}

func TestMayChangeReading(t *testing.T) {
	for _, c := range []struct {
		sql  string
		want bool
	}{
		{"SET client_encoding = 'LATIN1'", true},
		{"set CLIENT_ENCODING to 'SJIS'", true},
		{"SET NAMES 'LATIN1'", true},
		{"SET standard_conforming_strings = off", true},
		{"SELECT set_config('client_encoding', 'LATIN1', false)", true},
		{"RESET ALL", true},
		{"DISCARD ALL", true},
		{"RESET client_encoding", true},
		{"RESET fence.token", false},
		{"SELECT all_names FROM t", false},
		{"UPDATE accounts SET balance = 0 WHERE id = 1", false},
		{"SELECT 1 UNION ALL SELECT 2", false},
	} {
		if got := Classify(c.sql).Has(ChangesReading); got != c.want {
			t.Errorf("ChangesReading of %q: %v, want %v", c.sql, got, c.want)
		}
	}
}
