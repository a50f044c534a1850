package fence_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Texts that write a guarded table when Postgres reads them with a
// setting a statement pipelined before them changed, and that read, with
// the setting pgfence last heard of, as a SELECT of string literals. The
// write sets val to 'stale' in row 1 without a token: unfenced, it lands
// (there is no backstop in these tests, so only the rewrite protects).
//
// standard_conforming_strings off: in 'a\', ' the backslash escapes the
// quote, and the literal ends at the next one. SJIS: the UTF-8 bytes of
// "Á" are C3 81, and 81 5C (5C is the backslash) is one SJIS character,
// so E'Á\' ends at the quote the backslash escapes in UTF-8.
func hiddenWrites(tbl string) map[string][2]string {
	upd := "UPDATE " + tbl + " SET val = $$stale$$ WHERE id = 1"
	return map[string][2]string{
		// [0]: for a simple Query, two statements; [1]: one statement, for Parse.
		"standard_conforming_strings": {
			`SELECT 'a\', '; ` + upd + ` --'`,
			`WITH w AS (SELECT 'a\', ' AS c), u AS (` + upd + ` RETURNING 1) SELECT * FROM w, u --') SELECT * FROM w`,
		},
		"client_encoding": {
			`SELECT E'Á\'; ` + upd + ` --'`,
			`WITH w AS (SELECT E'Á\' AS c), u AS (` + upd + ` RETURNING 1) SELECT * FROM w, u --') SELECT * FROM w`,
		},
	}
}

// Statements that change how the session's server reads SQL: spelled (the
// text holds the next statement), and without spelling the setting's name,
// so that the text alone does not say so.
var readingChanges = map[string][]string{
	"standard_conforming_strings": {
		`SET standard_conforming_strings = off`,
		`SELECT set_config('standard_conforming_'||'strings', 'off', false)`,
		`DO $$BEGIN PERFORM set_config('standard_conforming_' || 'strings', 'off', false); END$$`,
	},
	"client_encoding": {
		`SET client_encoding = 'SJIS'`,
		`SELECT set_config('client_'||'encoding', 'SJIS', false)`,
		`DO $$BEGIN PERFORM set_config('client_' || 'encoding', 'SJIS', false); END$$`,
	},
}

// A write pipelined behind a statement that changes
// standard_conforming_strings or client_encoding, by name or without
// naming it (a computed set_config, a DO block), is judged with the new
// setting, which
// pgfence learns from the server before it judges the write: from the
// ReadyForQuery of a simple Query, and from a probe of the settings in the
// middle of an extended-protocol batch, where Postgres reports none. Read
// with the new setting, the write is refused; read with the old one, it
// would pass as a SELECT and land unfenced.
func TestReadingChangePipelined(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	hidden := hiddenWrites(tbl)
	for setting, changes := range readingChanges {
		for _, change := range changes {
			for _, extended := range []bool{false, true} {
				name := setting + "/" + strings.Fields(change)[0] + map[bool]string{false: "/simple", true: "/extended"}[extended]
				t.Run(name, func(t *testing.T) {
					pgtest.Exec(t, pgtest.Direct(t), "UPDATE "+tbl+" SET val = 'init', fence_epoch = 5 WHERE id = 1")
					_, fe := pgtest.RawSession(t, p.Addr)
					readies := 2
					if extended {
						// One batch: the change, then the write, then Sync.
						readies = 1
						fe.Send(&pgproto3.Parse{Query: change})
						fe.Send(&pgproto3.Bind{})
						fe.Send(&pgproto3.Execute{})
						fe.Send(&pgproto3.Parse{Query: hidden[setting][1]})
						fe.Send(&pgproto3.Bind{})
						fe.Send(&pgproto3.Execute{})
						fe.Send(&pgproto3.Sync{})
					} else {
						fe.Send(&pgproto3.Query{String: change})
						fe.Send(&pgproto3.Query{String: hidden[setting][0]})
					}
					if err := fe.Flush(); err != nil {
						t.Fatal(err)
					}
					tags, errs := pgtest.Replies(t, fe, readies)
					if v, e := row(t, tbl, 1); v != "init" || e != 5 {
						t.Fatalf("row 1 = (%s, %d), want (init, 5): the write hidden from the old reading landed unfenced (tags %q, errors %v)", v, e, tags, errs)
					}
					if len(errs) != 1 || errs[0].Code != "0A000" || !strings.Contains(errs[0].Message, setting) && !strings.Contains(errs[0].Message, "SJIS") {
						t.Fatalf("errors %v (tags %q), want pgfence's 0A000 refusal of the write, read with %s changed", errs, tags, setting)
					}
				})
			}
		}
	}
}

// What pgfence relies on, straight on Postgres: in the middle of an
// extended-protocol batch, Postgres (14 and later) reports a changed
// setting only at the Sync, right before ReadyForQuery; and a simple Query
// is read whole, with the settings from before it, before any of its
// statements runs, so that a setting it changes does not change how its
// later statements are read (pgfence reads them all alike too).
func TestPostgresReportsReadingAtReady(t *testing.T) {
	pgtest.Need(t)
	addr := pgtest.Server().Addr()

	_, fe := pgtest.RawSession(t, addr)
	fe.Send(&pgproto3.Parse{Query: `SELECT set_config('standard_conforming_strings', 'off', false)`})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Flush{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.ParameterStatus:
			t.Fatalf("Postgres reported %s = %s before the Sync", m.Name, m.Value)
		case *pgproto3.ErrorResponse:
			t.Fatalf("set_config: %s", m.Message)
		case *pgproto3.CommandComplete:
			done = true
		}
	}
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	reported := false
	for ready := false; !ready; {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.ParameterStatus:
			reported = reported || m.Name == "standard_conforming_strings" && m.Value == "off"
		case *pgproto3.ReadyForQuery:
			ready = true
		}
	}
	if !reported {
		t.Fatal("Postgres did not report standard_conforming_strings = off at the Sync")
	}

	_, fe = pgtest.RawSession(t, addr)
	fe.Send(&pgproto3.Query{String: `SELECT set_config('standard_conforming_'||'strings', 'off', false); SELECT 'a\', 'b'`})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for ready := false; !ready; {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.DataRow:
			var vals []string
			for _, v := range m.Values {
				vals = append(vals, string(v))
			}
			rows = append(rows, vals)
		case *pgproto3.ErrorResponse:
			t.Fatalf("%s", m.Message)
		case *pgproto3.ReadyForQuery:
			ready = true
		}
	}
	if len(rows) != 2 || strings.Join(rows[1], "|") != `a\|b` {
		t.Fatalf("rows %q, want the second statement read with standard_conforming_strings on: a\\ and b", rows)
	}
}

// What a reading probe finds holds until the batch's ReadyForQuery; from
// there pgfence goes by what Postgres reported again. Here the change the
// probe saw is rolled back with the batch (the held write was refused), so
// Postgres reports nothing, and a later write with a backslash in a
// literal, read with standard_conforming_strings on again, is fenced,
// not refused as if it were still off.
func TestReadingProbeLastsUntilReady(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	_, fe := pgtest.RawSession(t, p.Addr)
	fe.Send(&pgproto3.Query{String: "SET fence.token = '7'"})
	fe.Send(&pgproto3.Parse{Query: readingChanges["standard_conforming_strings"][1]})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Parse{Query: hiddenWrites(tbl)["standard_conforming_strings"][1]})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, errs := pgtest.Replies(t, fe, 2); len(errs) != 1 || errs[0].Code != "0A000" {
		t.Fatalf("errors %v, want pgfence's refusal of the held write", errs)
	}
	fe.Send(&pgproto3.Query{String: `UPDATE ` + tbl + ` SET val = 'x\y' WHERE id = 1`})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if tags, errs := pgtest.Replies(t, fe, 1); len(errs) != 0 || len(tags) != 1 || tags[0] != "UPDATE 1" {
		t.Fatalf("the write after the batch: tags %q, errors %v; want UPDATE 1", tags, errs)
	}
	if v, e := row(t, tbl, 1); v != `x\y` || e != 7 {
		t.Fatalf("row 1 = (%s, %d), want (x\\y, 7)", v, e)
	}
}

// Only a text that may write a guarded table and reads otherwise under
// another setting waits, and only it costs the session a reading probe in
// a batch: a pgx batch of ASCII writes to the guarded table, a function
// call between them, runs no probe; one write with a non-ASCII literal
// among them does. (The probe's statement stays prepared on the session's
// backend, where the session can see it.)
func TestReadingHoldOnlyWhenTextDepends(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 5}, [3]any{2, "init", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	for _, c := range []struct {
		name  string
		value string
		probe int
	}{{"ASCII", "plain", 0}, {"non-ASCII", "grüße", 1}} {
		t.Run(c.name, func(t *testing.T) {
			conn := p.Connect(t, "default_query_exec_mode=exec")
			pgtest.Exec(t, conn, "SET fence.token = '7'")
			b := &pgx.Batch{}
			b.Queue("UPDATE " + tbl + " SET val = 'first' WHERE id = 1")
			b.Queue("SELECT set_config('application_name', 'reading', false)")
			b.Queue("UPDATE " + tbl + " SET val = '" + c.value + "' WHERE id = 2")
			if err := conn.SendBatch(ctx, b).Close(); err != nil {
				t.Fatal(err)
			}
			if v, e := row(t, tbl, 2); v != c.value || e != 7 {
				t.Fatalf("row 2 = (%s, %d), want (%s, 7)", v, e, c.value)
			}
			var probes int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", sqlrewrite.ReadingProbeSQL).Scan(&probes); err != nil {
				t.Fatal(err)
			}
			if probes != c.probe {
				t.Fatalf("reading probes prepared on the session's backend: %d, want %d", probes, c.probe)
			}
		})
	}
}

// A statement held in a batch learns the settings from a probe, a
// statement that fails in a transaction block that failed; the held
// statement may be the ROLLBACK that ends the block (pgJDBC sends a Close
// before it). Then nothing ran since the ReadyForQuery that said the block
// failed, which reported the settings: the ROLLBACK needs no probe, and
// runs.
func TestHeldRollbackInFailedBlock(t *testing.T) {
	p := pgtest.StartProxy(t, []string{"accounts"})
	_, fe := pgtest.RawSession(t, p.Addr)
	fe.Send(&pgproto3.Query{String: "BEGIN"})
	fe.Send(&pgproto3.Query{String: "SET client_encoding = 'NO SUCH ENCODING'"}) // holds the next statement
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, errs := pgtest.Replies(t, fe, 2); len(errs) != 1 || errs[0].Code != "22023" {
		t.Fatalf("errors %v, want the SET's 22023", errs)
	}
	fe.Send(&pgproto3.Close{ObjectType: 'P', Name: "x"})
	fe.Send(&pgproto3.Parse{Query: "ROLLBACK"})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	tags, errs := pgtest.Replies(t, fe, 1)
	if len(errs) != 0 || len(tags) != 1 || tags[0] != "ROLLBACK" {
		t.Fatalf("the held ROLLBACK: tags %q, errors %v; want ROLLBACK", tags, errs)
	}
}

// A Bind plans its prepared statement's text again after a reload (see
// proxy's replan), and sends the new plan's Parse: Postgres reads that
// with the settings of that moment. A Bind pipelined behind a statement
// that changed them without naming them waits for them too. Here the
// reload renames the token setting, which changes the fence; read with
// standard_conforming_strings off, the rewrite's WHERE clause would fall
// into a literal and a comment, and the UPDATE, now without one, would
// stamp every row with the stale token 1.
func TestReplanWaitsForReading(t *testing.T) {
	tbl := table(t, [3]any{1, "init", 5}, [3]any{2, "init", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	_, fe := pgtest.RawSession(t, p.Addr)
	fe.Send(&pgproto3.Query{String: "SET fence.token = '7'"})
	fe.Send(&pgproto3.Query{String: "SET fence.tok2 = '1'"})
	fe.Send(&pgproto3.Parse{Name: "w", Query: `UPDATE ` + tbl + ` SET val = 'a\' WHERE id = 1 AND '--' = '--'`})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, errs := pgtest.Replies(t, fe, 3); len(errs) != 0 {
		t.Fatalf("setting up: %v", errs)
	}
	cfg := p.Policy.Config()
	cfg.TokenSetting = "fence.tok2"
	if err := p.Policy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	fe.Send(&pgproto3.Parse{Query: readingChanges["standard_conforming_strings"][1]})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Bind{PreparedStatement: "w"})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	tags, errs := pgtest.Replies(t, fe, 1)
	for _, id := range []int{1, 2} {
		if v, e := row(t, tbl, id); v != "init" || e != 5 {
			t.Fatalf("row %d = (%s, %d), want (init, 5): the statement planned again with the old reading ran unfenced (tags %q, errors %v)", id, v, e, tags, errs)
		}
	}
	if len(errs) != 1 || errs[0].Code != "0A000" {
		t.Fatalf("errors %v (tags %q), want pgfence's refusal of the statement read with standard_conforming_strings off", errs, tags)
	}
}
