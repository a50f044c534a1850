package v258923c

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/sqlrewrite"
)

// Mode is what Reconcile may do to the database.
type Mode int

const (
	// Install creates and updates the backstop, and enables triggers that
	// were disabled.
	Install Mode = iota
	// Verify only reads: for teams that forbid runtime DDL and install
	// the backstop with 'pgfence init'.
	Verify
)

// Table is the backstop of one guarded table, as the catalog shows it.
type Table struct {
	Guard sqlrewrite.Guard
	// OK is set when the table's triggers are in place, enabled for
	// ordinary sessions, and run the functions this configuration wants,
	// with their bodies unedited.
	OK bool
	// Changed says what Reconcile did to the table ("" for nothing).
	Changed string
	// Problem says why the table is not OK.
	Problem string
}

// Report is what Reconcile found and did.
type Report struct {
	Tables []Table
	// WatchingDDL is set when the event trigger is in place (see
	// EventTrigger); NotWatchingDDL says why not, when Options.Discovered
	// asked for it.
	WatchingDDL    bool
	NotWatchingDDL string
	// Problems are the findings that are not one guarded table's: tables
	// that carry the backstop but are not guarded by this configuration.
	Problems []string
}

// Installed reports whether the backstop is OK on the table g names
// (schema-qualified).
func (r *Report) Installed(g sqlrewrite.Guard) bool {
	if r == nil {
		return false
	}
	for _, t := range r.Tables {
		if t.Guard.Schema == g.Schema && t.Guard.Table == g.Table {
			return t.OK
		}
	}
	return false
}

// Missing counts the tables whose backstop is not OK.
func (r *Report) Missing() int {
	n := 0
	for _, t := range r.Tables {
		if !t.OK {
			n++
		}
	}
	return n
}

// lockKey is the advisory lock that serialises pgfence instances' setups.
const lockKey = 0x7067666e63 // "pgfnc"

// setupVersion names setupSQL's version.
var setupVersion = func() string {
	sum := sha256.Sum256([]byte(strings.Join(setupSQL, "\n;\n")))
	return "pgfence schema " + hex.EncodeToString(sum[:8])
}()

// setupState is the mark Setup leaves on the schema (its comment): the
// version of setupSQL and a fingerprint of the helpers' bodies and the
// domain table's triggers, so that one edited, dropped or disabled by hand
// is found and set up again.
const setupState = `
SELECT $1::text || ' ' || pg_catalog.md5(
         coalesce((SELECT pg_catalog.string_agg(p.proname || ':' || p.prosrc, ';' ORDER BY p.proname)
                   FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = 'pgfence' AND p.proname IN ('domains_guard', 'claim_domain', 'note_reject', 'note_exempt')), '') || '|' ||
         coalesce((SELECT pg_catalog.string_agg(t.tgname || ':' || t.tgenabled::text, ';' ORDER BY t.tgname)
                   FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = pg_catalog.to_regclass('pgfence.domains') AND NOT t.tgisinternal), '')),
       (SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence')`

// Setup creates or updates pgfence's schema objects (see setupSQL). It
// costs one query when they are as it left them.
func Setup(ctx context.Context, conn *pgx.Conn) error {
	if ok, err := setUp(ctx, conn); ok || err != nil {
		return err
	}
	var want string
	var mark *string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
			return err
		}
		for _, sql := range setupSQL {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, setupState, setupVersion).Scan(&want, &mark); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "COMMENT ON SCHEMA pgfence IS "+literal(want))
		return err
	})
	if err != nil {
		return fmt.Errorf("cannot create or update pgfence's schema objects (the role pgfence connects as must own the pgfence schema and the guarded tables, or run 'pgfence init' as a role that does): %w", err)
	}
	return nil
}

// setUp reports whether pgfence's schema objects are as Setup left them.
func setUp(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var want string
	var mark *string
	if err := conn.QueryRow(ctx, setupState, setupVersion).Scan(&want, &mark); err != nil {
		return false, fmt.Errorf("reading pgfence's schema: %w", err)
	}
	return mark != nil && *mark == want, nil
}

// Reconcile brings the backstop of guards (each schema-qualified: a table
// that exists) to what o wants (Install), or only reports how far it is
// from that (Verify). A table's failure (its owner is another role, a lock
// it could not get) is that table's Problem; the error is for what stops
// everything (the connection, pgfence's schema).
func Reconcile(ctx context.Context, conn *pgx.Conn, guards []sqlrewrite.Guard, o Options, mode Mode) (*Report, error) {
	r := &Report{}
	state, err := readState(ctx, conn, guards)
	if err != nil {
		return nil, err
	}
	changed := map[int]string{}
	failed := map[int]string{}
	if mode == Install {
		// What keeps the backstop from being installed is reported, not
		// returned: the tables' state is still worth reading.
		err := Setup(ctx, conn)
		if err == nil {
			changed, failed, r.NotWatchingDDL, err = apply(ctx, conn, state, o)
		}
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			for i := range state {
				failed[i] = err.Error()
			}
		}
		if state, err = readState(ctx, conn, guards); err != nil {
			return nil, err
		}
	} else if ok, err := setUp(ctx, conn); err != nil {
		return nil, err
	} else if !ok {
		r.Problems = append(r.Problems, "pgfence's schema objects (lock domains, the backstop's helpers) are missing, were changed by hand, or are another pgfence version's: run 'pgfence init'")
	}
	if o.Discovered != nil {
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $1 AND evtenabled = 'O')`, EventTrigger).Scan(&r.WatchingDDL)
		if err != nil {
			return nil, err
		}
		if !r.WatchingDDL && r.NotWatchingDDL == "" {
			r.NotWatchingDDL = "the event trigger " + EventTrigger + " is missing or disabled: a table that gets the epoch column by DDL outside pgfence is fenced from pgfence's next discovery on; 'pgfence init' as a superuser creates it"
		}
	}
	for i, st := range state {
		t := Table{Guard: st.guard, Changed: changed[i]}
		t.Problem = st.problem(state, o)
		if f := failed[i]; f != "" && t.Problem != "" {
			t.Problem += "; " + f
		}
		t.OK = t.Problem == ""
		r.Tables = append(r.Tables, t)
	}
	strays, err := strayTables(ctx, conn, state)
	if err != nil {
		return nil, err
	}
	for _, s := range strays {
		r.Problems = append(r.Problems, fmt.Sprintf("table %s carries pgfence's backstop but is not guarded by this configuration; "+
			"its writes are still fenced by Postgres. If that is not wanted: DROP TRIGGER %s ON %s", s, ident(RowTrigger), s))
	}
	return r, nil
}

// trigger is one of pgfence's triggers on a table, as the catalog has it.
type trigger struct {
	exists    bool
	schema    string // the function's
	function  string
	body      string
	enabled   string // pg_trigger.tgenabled: O (origin), D, R, A
	inherited bool   // cloned from a partitioned parent
}

// tableState is one guard's table in the catalog.
type tableState struct {
	guard      sqlrewrite.Guard
	oid        uint32 // 0: no such table
	partition  bool
	ancestors  []uint32
	row, trunc trigger
	counter    bool // its rejects_<oid> sequence exists
	// after names the BEFORE row triggers that fire after the backstop's
	// (their names sort after it): they could change the epoch it stamps.
	after string
}

const stateQuery = `
SELECT g.i::int, coalesce(c.oid, 0)::int8, coalesce(c.relispartition, false),
       coalesce(ARRAY(SELECT a.relid::oid::int8 FROM pg_catalog.pg_partition_ancestors(c.oid) a WHERE a.relid <> c.oid), '{}'),
       rt.tgname IS NOT NULL, coalesce(rt.nspname, ''), coalesce(rt.proname, ''), coalesce(rt.prosrc, ''), coalesce(rt.tgenabled, ''), coalesce(rt.inherited, false),
       tt.tgname IS NOT NULL, coalesce(tt.nspname, ''), coalesce(tt.proname, ''), coalesce(tt.prosrc, ''), coalesce(tt.tgenabled, ''),
       c.oid IS NOT NULL AND pg_catalog.to_regclass('pgfence.' || pg_catalog.quote_ident('rejects_' || c.oid)) IS NOT NULL,
       coalesce((SELECT pg_catalog.string_agg(pg_catalog.quote_ident(t.tgname), ', ' ORDER BY t.tgname COLLATE "C")
                 FROM pg_catalog.pg_trigger t
                 WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND t.tgenabled <> 'D'
                   AND t.tgtype & 3 = 3 AND t.tgtype & 20 <> 0 -- BEFORE ROW, INSERT or UPDATE
                   AND t.tgname COLLATE "C" > $3), '')
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS g(schema, name, i)
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = g.schema
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = g.name AND c.relkind IN ('r', 'p')
LEFT JOIN LATERAL (
    SELECT t.tgname, pn.nspname::text, p.proname::text, p.prosrc, t.tgenabled::text, t.tgparentid <> 0 AS inherited
    FROM pg_catalog.pg_trigger t
    JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
    JOIN pg_catalog.pg_namespace pn ON pn.oid = p.pronamespace
    WHERE t.tgrelid = c.oid AND t.tgname = $3) rt ON true
LEFT JOIN LATERAL (
    SELECT t.tgname, pn.nspname::text, p.proname::text, p.prosrc, t.tgenabled::text
    FROM pg_catalog.pg_trigger t
    JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
    JOIN pg_catalog.pg_namespace pn ON pn.oid = p.pronamespace
    WHERE t.tgrelid = c.oid AND t.tgname = $4) tt ON true
ORDER BY g.i`

func readState(ctx context.Context, conn *pgx.Conn, guards []sqlrewrite.Guard) ([]tableState, error) {
	schemas := make([]string, len(guards))
	names := make([]string, len(guards))
	for i, g := range guards {
		schemas[i], names[i] = g.Schema, g.Table
	}
	rows, err := conn.Query(ctx, stateQuery, schemas, names, RowTrigger, TruncateTrigger)
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	out := make([]tableState, 0, len(guards))
	for rows.Next() {
		var i int
		var oid int64
		var anc []int64
		var st tableState
		if err := rows.Scan(&i, &oid, &st.partition, &anc,
			&st.row.exists, &st.row.schema, &st.row.function, &st.row.body, &st.row.enabled, &st.row.inherited,
			&st.trunc.exists, &st.trunc.schema, &st.trunc.function, &st.trunc.body, &st.trunc.enabled,
			&st.counter, &st.after); err != nil {
			return nil, fmt.Errorf("reading the backstop's state: %w", err)
		}
		st.guard, st.oid = guards[i-1], uint32(oid)
		for _, a := range anc {
			st.ancestors = append(st.ancestors, uint32(a))
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	return out, nil
}

// clonedFromGuarded reports whether the table's row trigger comes, or will
// come, from a partitioned ancestor that is guarded too: Postgres clones a
// partitioned table's row triggers to its partitions.
func (st tableState) clonedFromGuarded(all []tableState) bool {
	for _, a := range st.ancestors {
		for _, o := range all {
			if o.oid == a {
				if _, ok := RowFunction(o.guard, Options{}); ok {
					return true
				}
			}
		}
	}
	return false
}

// problem says what keeps the table's backstop from being what o wants,
// or "".
func (st tableState) problem(all []tableState, o Options) string {
	name := st.guard.Name()
	if st.oid == 0 {
		return "table " + name + " does not exist"
	}
	if f, ok := RowFunction(st.guard, o); ok {
		switch {
		case !st.row.exists:
			return "table " + name + " has no backstop trigger " + ident(RowTrigger)
		case st.row.inherited && st.row.schema == Schema:
			// A partition's clone runs its ancestor's function, which
			// may enforce another table's configuration; the ancestor's
			// own check covers it.
		case st.row.schema != Schema || st.row.function != f.Name:
			return fmt.Sprintf("the backstop trigger of table %s runs %s.%s, not %s.%s (another pgfence configuration, or edited by hand)",
				name, st.row.schema, st.row.function, Schema, f.Name)
		case st.row.body != f.Body:
			return fmt.Sprintf("function %s.%s, the backstop of table %s, was edited by hand", Schema, f.Name, name)
		}
		if st.row.enabled != "O" {
			return "the backstop trigger of table " + name + " is " + enabledWord(st.row.enabled) + ": " + enabledWhy(st.row.enabled)
		}
		if !st.counter {
			return "table " + name + " has no reject counter pgfence.rejects_" + strconv.FormatUint(uint64(st.oid), 10)
		}
		if st.after != "" {
			return "table " + name + " has BEFORE row triggers that fire after the backstop's and could change the epoch it stamps: " + st.after +
				"; rename them so that their names sort before " + ident(RowTrigger)
		}
	}
	if f, ok := TruncateFunction(o); ok {
		switch {
		case !st.trunc.exists:
			return "table " + name + " has no TRUNCATE backstop trigger " + ident(TruncateTrigger)
		case st.trunc.schema != Schema || st.trunc.function != f.Name || st.trunc.body != f.Body:
			return "the TRUNCATE backstop trigger of table " + name + " runs another function than this configuration's"
		case st.trunc.enabled != "O":
			return "the TRUNCATE backstop trigger of table " + name + " is " + enabledWord(st.trunc.enabled) + ": " + enabledWhy(st.trunc.enabled)
		}
	}
	return ""
}

func enabledWord(e string) string {
	switch e {
	case "D":
		return "disabled"
	case "R":
		return "enabled for replicas only"
	case "A":
		return "enabled always"
	}
	return "in state " + strconv.Quote(e)
}

func enabledWhy(e string) string {
	switch e {
	case "D":
		return "writes to it are not fenced by Postgres (ALTER TABLE ... DISABLE TRIGGER)"
	case "R":
		return "it fires only under session_replication_role = replica, so ordinary writes are not fenced by Postgres"
	case "A":
		return "it fires under session_replication_role = replica too, fencing logical-replication apply a second time"
	}
	return "not enabled as pgfence installs it"
}

// apply makes the catalog what o wants, one savepoint per table, so one
// table's failure (its owner is another role, say) leaves the others done.
// It returns what it did and what failed, by index into state.
func apply(ctx context.Context, conn *pgx.Conn, state []tableState, o Options) (changed, failed map[int]string, notWatching string, err error) {
	changed, failed = map[int]string{}, map[int]string{}
	funcs := map[string]Function{}
	var discovered Function
	if o.Discovered != nil {
		discovered, _ = RowFunction(*o.Discovered, o)
		if discovered.Name != "" {
			funcs[discovered.Name] = discovered
		}
	}
	for _, st := range state {
		if f, ok := RowFunction(st.guard, o); ok {
			funcs[f.Name] = f
		}
	}
	if f, ok := TruncateFunction(o); ok {
		funcs[f.Name] = f
	}
	// Parents first: their row triggers are cloned to partitions.
	order := make([]int, len(state))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(state[a].ancestors) - len(state[b].ancestors) })
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
			return err
		}
		if err := ensureFunctions(ctx, tx, funcs); err != nil {
			return err
		}
		for _, i := range order {
			st := state[i]
			if st.oid == 0 {
				continue
			}
			stmts, what := st.actions(state, o)
			if len(stmts) == 0 {
				continue
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT pgfence_backstop"); err != nil {
				return err
			}
			var failure error
			for _, sql := range stmts {
				if _, failure = tx.Exec(ctx, sql); failure != nil {
					break
				}
			}
			if failure != nil {
				if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT pgfence_backstop"); err != nil {
					return err
				}
				failed[i] = installFailure(st.guard.Name(), failure)
				continue
			}
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT pgfence_backstop"); err != nil {
				return err
			}
			changed[i] = what
		}
		if discovered.Name == "" {
			return nil
		}
		// The DDL watch: one savepoint of its own, as the rest is done.
		if _, err := tx.Exec(ctx, "SAVEPOINT pgfence_backstop"); err != nil {
			return err
		}
		tf, _ := TruncateFunction(o)
		why, err := watchDDL(ctx, tx, o.Discovered.Column, discovered.Name, tf.Name)
		if err != nil {
			if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT pgfence_backstop"); rerr != nil {
				return rerr
			}
			why = err.Error()
		}
		notWatching = why
		return nil
	})
	return changed, failed, notWatching, err
}

// installFailure says why a table's backstop could not be installed, and
// what to do.
func installFailure(table string, err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "42501":
			return fmt.Sprintf("cannot install the backstop on table %s: %s; the role pgfence connects as must own the table (or be a member of its owner) "+
				"to create its triggers; pgfence still fences what it sees", table, pe.Message)
		case "55P03":
			return fmt.Sprintf("cannot install the backstop on table %s yet: a long transaction holds a lock on it (lock_timeout 5s); retrying at the next discovery", table)
		}
	}
	return fmt.Sprintf("cannot install the backstop on table %s: %v", table, err)
}

// ensureFunctions creates the trigger functions that are missing or whose
// body is not theirs.
func ensureFunctions(ctx context.Context, tx pgx.Tx, funcs map[string]Function) error {
	names := make([]string, 0, len(funcs))
	for n := range funcs {
		names = append(names, n)
	}
	slices.Sort(names)
	rows, err := tx.Query(ctx, `SELECT p.proname::text, p.prosrc FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = ANY($2)`, Schema, names)
	if err != nil {
		return err
	}
	have := map[string]string{}
	for rows.Next() {
		var n, body string
		if err := rows.Scan(&n, &body); err != nil {
			return err
		}
		have[n] = body
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, n := range names {
		f := funcs[n]
		if body, ok := have[n]; ok && body == f.Body {
			continue
		}
		if _, err := tx.Exec(ctx, f.DDL()); err != nil {
			return fmt.Errorf("creating backstop function %s.%s: %w", Schema, n, err)
		}
	}
	return nil
}

// actions are the statements that bring one table's backstop to what o
// wants, and a word for what they do.
func (st tableState) actions(all []tableState, o Options) ([]string, string) {
	table := ident(st.guard.Schema) + "." + ident(st.guard.Table)
	var stmts []string
	var what []string
	f, wantRow := RowFunction(st.guard, o)
	switch {
	case !wantRow:
		if st.row.exists && !st.row.inherited {
			stmts = append(stmts, "DROP TRIGGER "+ident(RowTrigger)+" ON "+table)
			what = append(what, "removed (observe)")
		}
	case st.row.inherited || !st.row.exists && st.partition && st.clonedFromGuarded(all):
		// The partitioned ancestor's trigger covers it.
		if st.row.exists && st.row.enabled != "O" {
			stmts = append(stmts, "ALTER TABLE "+table+" ENABLE TRIGGER "+ident(RowTrigger))
			what = append(what, "enabled")
		}
	case !st.row.exists || st.row.schema != Schema || st.row.function != f.Name:
		stmts = append(stmts, "CREATE OR REPLACE TRIGGER "+ident(RowTrigger)+" BEFORE INSERT OR UPDATE OR DELETE ON "+table+
			" FOR EACH ROW EXECUTE FUNCTION "+ident(Schema)+"."+ident(f.Name)+"()")
		if st.row.exists {
			what = append(what, "updated")
		} else {
			what = append(what, "created")
		}
		if st.row.exists && st.row.enabled != "O" {
			stmts = append(stmts, "ALTER TABLE "+table+" ENABLE TRIGGER "+ident(RowTrigger))
		}
	case st.row.enabled != "O":
		stmts = append(stmts, "ALTER TABLE "+table+" ENABLE TRIGGER "+ident(RowTrigger))
		what = append(what, "enabled (was "+enabledWord(st.row.enabled)+")")
	}
	if wantRow && !st.counter {
		stmts = append(stmts, "CREATE SEQUENCE IF NOT EXISTS "+ident(Schema)+"."+ident("rejects_"+strconv.FormatUint(uint64(st.oid), 10)))
	}
	tf, wantTrunc := TruncateFunction(o)
	switch {
	case !wantTrunc:
		if st.trunc.exists {
			stmts = append(stmts, "DROP TRIGGER "+ident(TruncateTrigger)+" ON "+table)
			what = append(what, "TRUNCATE allowed")
		}
	case !st.trunc.exists || st.trunc.schema != Schema || st.trunc.function != tf.Name:
		stmts = append(stmts, "CREATE OR REPLACE TRIGGER "+ident(TruncateTrigger)+" BEFORE TRUNCATE ON "+table+
			" FOR EACH STATEMENT EXECUTE FUNCTION "+ident(Schema)+"."+ident(tf.Name)+"()")
		if st.trunc.exists && st.trunc.enabled != "O" {
			stmts = append(stmts, "ALTER TABLE "+table+" ENABLE TRIGGER "+ident(TruncateTrigger))
		}
		if len(what) == 0 {
			what = append(what, "TRUNCATE trigger set")
		}
	case st.trunc.enabled != "O":
		stmts = append(stmts, "ALTER TABLE "+table+" ENABLE TRIGGER "+ident(TruncateTrigger))
		what = append(what, "TRUNCATE trigger enabled")
	}
	return stmts, strings.Join(what, ", ")
}

// strayTables lists the tables that carry the backstop's row trigger of
// their own but are not among state's.
func strayTables(ctx context.Context, conn *pgx.Conn, state []tableState) ([]string, error) {
	var oids []int64
	for _, st := range state {
		if st.oid != 0 {
			oids = append(oids, int64(st.oid))
		}
	}
	rows, err := conn.Query(ctx, `SELECT t.tgrelid::regclass::text FROM pg_catalog.pg_trigger t
		WHERE t.tgname = $1 AND t.tgparentid = 0 AND NOT t.tgrelid::int8 = ANY($2) ORDER BY 1`, RowTrigger, oids)
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// carriersQuery lists the tables that carry a backstop row trigger of
// their own, with the epoch column its function stamps (read from the body
// rowBody writes: "epoch := OLD.<column>;").
const carriersQuery = `
SELECT n.nspname::text, c.relname::text, pg_catalog.substring(p.prosrc, E'  epoch := OLD\\.("(?:[^"]|"")+");')
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
JOIN pg_catalog.pg_namespace pn ON pn.oid = p.pronamespace
WHERE t.tgname = $1 AND t.tgparentid = 0 AND pn.nspname = $2
ORDER BY 1, 2`

// Carriers returns the tables that carry the backstop (its row trigger of
// their own), each as a guard with its schema, table and epoch column. The
// trigger goes with its table when it is renamed or moved to another
// schema, so a table guarded by a name it no longer has is found here
// under its new one.
func Carriers(ctx context.Context, conn *pgx.Conn) ([]sqlrewrite.Guard, error) {
	rows, err := conn.Query(ctx, carriersQuery, RowTrigger, Schema)
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	var out []sqlrewrite.Guard
	for rows.Next() {
		var g sqlrewrite.Guard
		var col *string
		if err := rows.Scan(&g.Schema, &g.Table, &col); err != nil {
			return nil, fmt.Errorf("reading the backstop's state: %w", err)
		}
		if col == nil {
			continue // not a body pgfence wrote
		}
		g.Column = strings.ReplaceAll(strings.Trim(*col, `"`), `""`, `"`)
		out = append(out, g)
	}
	return out, rows.Err()
}
