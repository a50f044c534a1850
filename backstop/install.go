package backstop

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

	"github.com/pgfence/pgfence/internal/pgversion"
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
	// ordinary sessions, of the shape pgfence creates, and run unedited
	// functions of the configuration the database records.
	OK bool
	// AsConfigured is set when that configuration is also this
	// instance's: only then does the backstop fence the table as this
	// instance's rewrite assumes (see Covers).
	AsConfigured bool
	// Changed says what Reconcile did to the table ("" for nothing).
	Changed string
	// Problem says why the table is not OK.
	Problem string
	// Owner is the role that owns the table.
	Owner string
	// Retry is set when Install could not take the table's lock without
	// waiting behind open transactions: it is worth trying again soon.
	Retry bool
}

// Report is what Reconcile found and did.
type Report struct {
	Tables []Table
	// Role is the role Reconcile ran as (pgfence's), and Superuser says
	// whether it is one.
	Role      string
	Superuser bool
	// GuardingDDL is set when the DDL guard's event triggers are in place
	// (see GuardTrigger): DDL that would weaken a backstop is refused on
	// every connection, but for pgfence's and the exempt roles.
	// NotGuardingDDL says why not.
	GuardingDDL    bool
	NotGuardingDDL string
	// WatchingDDL is set when the event trigger is in place (see
	// EventTrigger); NotWatchingDDL says why not, when Options.Discovered
	// asked for it.
	WatchingDDL    bool
	NotWatchingDDL string
	// Problems are the findings that are not one guarded table's: tables
	// that carry the backstop but are not guarded by this configuration.
	Problems []string
	// Differences are where this instance's configuration differs from
	// the one the database records, which stays (see RolloutHint).
	Differences []string
	// SetUp is set when pgfence's schema objects are as this version
	// sets them up (Install: set up now).
	SetUp bool
	// Recorded is set when Install recorded the configuration it
	// installed (see record.go).
	Recorded bool
	// DroppedFunctions are the trigger functions Install dropped because
	// nothing uses them any more.
	DroppedFunctions []string
	// Grants are the statements that would give pgfence's role the
	// privileges Install lacked (see privileges.go), each once; a
	// superuser or the objects' owner runs them.
	Grants []string
}

// Covers reports whether the backstop on the table g names
// (schema-qualified) is OK and this instance's configuration: writes the
// rewrite leaves to it (MERGE, COPY FROM) are then fenced as configured.
func (r *Report) Covers(g sqlrewrite.Guard) bool {
	t := r.table(g)
	return t != nil && t.OK && t.AsConfigured
}

func (r *Report) table(g sqlrewrite.Guard) *Table {
	if r == nil {
		return nil
	}
	for i, t := range r.Tables {
		if t.Guard.Schema == g.Schema && t.Guard.Table == g.Table {
			return &r.Tables[i]
		}
	}
	return nil
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

// Retry reports whether a table's install waited on a lock and is worth
// trying again before the next discovery.
func (r *Report) Retry() bool {
	return slices.ContainsFunc(r.Tables, func(t Table) bool { return t.Retry })
}

// lockKey is the advisory lock that serialises pgfence instances' setups.
const lockKey = 0x7067666e63 // "pgfnc"

// setupVersion names setupSQL's version.
var setupVersion = func() string {
	sum := sha256.Sum256([]byte(strings.Join(setupSQL, "\n;\n")))
	return "pgfence schema " + hex.EncodeToString(sum[:8])
}()

// setupState is the mark Setup leaves on the schema (its comment): the
// version of setupSQL and a fingerprint of the helpers (their bodies,
// whether they run as their owner, and the settings they run with) and the
// domain table's triggers, so that one edited, dropped or disabled by hand
// is found and set up again: an ALTER FUNCTION that only made a helper
// SECURITY INVOKER, or took its search_path or client_min_messages away,
// leaves its body as it was.
const setupState = `
SELECT $1::text || ' ' || pg_catalog.md5(
         coalesce((SELECT pg_catalog.string_agg(p.proname::text || ':' || p.prosecdef::text || ':' ||
                     coalesce(pg_catalog.array_to_string(p.proconfig, ','), '') || ':' || p.prosrc, ';' ORDER BY p.proname)
                   FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = 'pgfence' AND p.proname::text NOT LIKE 'backstop\_%'), '') || '|' ||
         coalesce((SELECT pg_catalog.string_agg(t.tgname::text || ':' || t.tgenabled::text, ';' ORDER BY t.tgname)
                   FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = pg_catalog.to_regclass('pgfence.domains')::oid AND NOT t.tgisinternal), '')),
       (SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence')`

// Setup creates or updates pgfence's schema objects (see setupSQL). It
// costs one query when they are as it left them. It never waits behind a
// writer: it takes pgfence.domains's lock without waiting, or fails with
// SQLSTATE 55P03.
func Setup(ctx context.Context, conn *pgx.Conn) error {
	if ok, err := setUp(ctx, conn); ok || err != nil {
		return err
	}
	if err := supported(ctx, conn); err != nil {
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
		// Its triggers are set up again below: a lock-domain writer holds
		// its rows until it commits.
		if _, err := tx.Exec(ctx, `DO $$ BEGIN
			IF pg_catalog.to_regclass('pgfence.domains') IS NOT NULL THEN LOCK TABLE pgfence.domains IN SHARE ROW EXCLUSIVE MODE NOWAIT; END IF;
			END $$`); err != nil {
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
		return fmt.Errorf("cannot create or update pgfence's schema objects (the schema pgfence, which pgfence's role must own or may create): %w", err)
	}
	return nil
}

// supported returns an error naming the server's version when the
// backstop cannot be installed there (see pgversion): its DDL would fail
// with a syntax error that says nothing of the version.
func supported(ctx context.Context, conn *pgx.Conn) error {
	v, err := pgversion.Read(ctx, conn)
	if err != nil {
		return err
	}
	if err := v.Supported(); err != nil {
		return fmt.Errorf("cannot install the database backstop: %w", err)
	}
	return nil
}

// IsSetUp reports whether pgfence's schema objects are as this version's
// Setup leaves them, at the cost of one query.
func IsSetUp(ctx context.Context, conn *pgx.Conn) (bool, error) { return setUp(ctx, conn) }

// setUp reports whether pgfence's schema objects are as Setup left them.
func setUp(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var want string
	var mark *string
	if err := conn.QueryRow(ctx, setupState, setupVersion).Scan(&want, &mark); err != nil {
		return false, fmt.Errorf("reading pgfence's schema: %w", err)
	}
	return mark != nil && *mark == want, nil
}

// notSetUp is the problem of every table when pgfence's schema objects
// are not as this version sets them up.
const notSetUp = "pgfence's schema objects (lock domains, the backstop's helpers) are missing, were changed by hand, or are another pgfence version's: run 'pgfence init'"

// Reconcile brings the backstop of guards (each schema-qualified: a table
// that exists) to what o wants (Install), or only reports how far it is
// from that (Verify). What it installs on a table is the configuration the
// database records for it where there is one (see record.go). A table's
// failure (its owner is another role, a lock it could not get) is that
// table's Problem; the error is for what stops everything (the
// connection).
func Reconcile(ctx context.Context, conn *pgx.Conn, guards []sqlrewrite.Guard, o Options, mode Mode) (*Report, error) {
	r := &Report{}
	v, err := pgversion.Read(ctx, conn)
	if err != nil {
		return nil, err
	}
	if err := v.Supported(); err != nil {
		return nil, fmt.Errorf("cannot install or check the database backstop: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT CURRENT_USER::text, r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER`).Scan(&r.Role, &r.Superuser); err != nil {
		return nil, fmt.Errorf("reading pgfence's role: %w", err)
	}
	if mode == Install {
		// What keeps the backstop from being installed is reported, not
		// returned: the tables' state is still worth reading.
		if err := Setup(ctx, conn); err != nil {
			grants, gerr := setupGrants(ctx, conn)
			if gerr != nil {
				return nil, gerr
			}
			tables, gerr := guardGrants(ctx, conn, r.Role, guards, o)
			if gerr != nil {
				return nil, gerr
			}
			r.Grants = append(grants, tables...)
			r.Problems = append(r.Problems, err.Error())
			why := "no backstop: pgfence's schema objects could not be set up"
			if code(err) == "55P03" {
				why += " yet (a lock-domain writer holds pgfence.domains); trying again shortly"
			}
			r.NotGuardingDDL = why
			for _, g := range guards {
				r.Tables = append(r.Tables, Table{Guard: g, Problem: why, Retry: code(err) == "55P03"})
			}
			return r, nil
		}
	} else if ok, err := setUp(ctx, conn); err != nil {
		return nil, err
	} else if !ok {
		r.Problems = append(r.Problems, notSetUp)
		r.NotGuardingDDL = notSetUp
		for _, g := range guards {
			r.Tables = append(r.Tables, Table{Guard: g, Problem: notSetUp})
		}
		return r, nil
	}
	r.SetUp = true
	rec, err := readRecorded(ctx, conn)
	if err != nil {
		return nil, err
	}
	oids, err := tableOIDs(ctx, conn, guards)
	if err != nil {
		return nil, err
	}
	eo := rec.options(o)
	eff, want, mine := make([]sqlrewrite.Guard, len(guards)), make([]wanted, len(guards)), make([]wanted, len(guards))
	for i, g := range guards {
		eff[i] = rec.guard(g, oids[i], o)
		want[i], mine[i] = wantedFor(eff[i], eo), wantedFor(g, o)
	}
	r.Differences = rec.differences(guards, oids, o)
	state, err := readState(ctx, conn, eff, want)
	if err != nil {
		return nil, err
	}
	changed, failed := map[int]string{}, map[int]error{}
	if mode == Install {
		r.Grants = tableGrants(r.Role, state, want)
		changed, failed, err = apply(ctx, conn, state, eff, want, eo, o, rec, r)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			r.Recorded = false // rolled back with the rest
		}
		if state, err = readState(ctx, conn, eff, want); err != nil {
			return nil, err
		}
	}
	if err := r.readEventTriggers(ctx, conn, o); err != nil {
		return nil, err
	}
	setters, err := replicationRoleSetters(ctx, conn, v, append([]string{r.Role}, eo.ExemptRoles...))
	if err != nil {
		return nil, err
	}
	for i, st := range state {
		t := Table{Guard: guards[i], Changed: changed[i], Owner: st.owner, Problem: st.problem, AsConfigured: want[i] == mine[i]}
		switch {
		case st.oid == 0:
			t.Problem = "table " + guards[i].Name() + " does not exist"
		case t.Problem == "" && want[i].row.Name != "" && !st.counter:
			t.Problem = "table " + guards[i].Name() + " has no reject counter pgfence.rejects_" + strconv.FormatUint(uint64(st.oid), 10)
		}
		if t.Problem == "" && want[i].row.Name != "" && len(setters) > 0 {
			t.Problem = "roles that are not superusers may set session_replication_role, under which no trigger fires: " + strings.Join(setters, ", ") +
				"; REVOKE SET ON PARAMETER session_replication_role FROM them, or name them with --backstop-exempt-role if they may write unfenced"
		}
		switch f := failed[i]; {
		case f != nil && t.Problem != "":
			t.Problem += "; " + installFailure(guards[i].Name(), r.Role, st, f)
			t.Retry = code(f) == "55P03"
		case f != nil:
			// The backstop is as good as wanted (it fences more than asked,
			// observe or TRUNCATE allowed, or keeps an older name), but
			// what was asked was not done: said, not a missing backstop.
			r.Problems = append(r.Problems, installFailure(guards[i].Name(), r.Role, st, f))
			t.Retry = code(f) == "55P03"
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
			"its writes are still fenced by Postgres. If that is not wanted, have an exempt role drop its %s triggers", s, ident(RowTrigger)))
	}
	return r, nil
}

// tableOIDs finds the tables guards name (0 for none).
func tableOIDs(ctx context.Context, conn *pgx.Conn, guards []sqlrewrite.Guard) ([]uint32, error) {
	schemas, names := make([]string, len(guards)), make([]string, len(guards))
	for i, g := range guards {
		schemas[i], names[i] = g.Schema, g.Table
	}
	rows, err := conn.Query(ctx, `SELECT coalesce(c.oid, 0)::int8
		FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) WITH ORDINALITY AS g(schema, name, i)
		LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = g.schema
		LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = g.name AND c.relkind IN ('r', 'p')
		ORDER BY g.i`, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	oids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("reading the backstop's state: %w", err)
	}
	out := make([]uint32, len(oids))
	for i, o := range oids {
		out[i] = uint32(o)
	}
	return out, nil
}

// readEventTriggers notes whether the DDL guard and the discovery watch
// are in place, and why not.
func (r *Report) readEventTriggers(ctx context.Context, conn *pgx.Conn, o Options) error {
	var guard, watch bool
	if err := conn.QueryRow(ctx, `SELECT
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_event_trigger WHERE evtname OPERATOR(pg_catalog.=) ANY($1::text[]) AND evtenabled = 'O') = pg_catalog.cardinality($1),
		EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $2 AND evtenabled = 'O')`,
		guardTriggers, EventTrigger).Scan(&guard, &watch); err != nil {
		return fmt.Errorf("reading the backstop's event triggers: %w", err)
	}
	r.GuardingDDL = guard
	switch {
	case guard:
		r.NotGuardingDDL = ""
	case r.NotGuardingDDL == "":
		r.NotGuardingDDL = "the event triggers " + strings.Join(guardTriggers, ", ") + " are not all in place and enabled"
	}
	if r.NotGuardingDDL != "" {
		r.NotGuardingDDL += ": the owner of a guarded table can drop, disable or change its backstop, or its epoch column, unseen until pgfence's next read of the catalog; " +
			"a superuser can run 'pgfence init' once to create them"
	}
	if o.Discovered != nil {
		r.WatchingDDL = watch
		if !watch && r.NotWatchingDDL == "" {
			r.NotWatchingDDL = "the event trigger " + EventTrigger + " is missing or disabled: a table that gets the epoch column by DDL outside pgfence is fenced from pgfence's next discovery on; 'pgfence init' as a superuser creates it"
		}
	}
	return nil
}

// replicationRoleSetters lists the roles, neither superusers nor exempt,
// that may set session_replication_role (GRANT SET ON PARAMETER, from
// Postgres 15; before, only superusers may): under replica no trigger
// fires, the backstop's included.
func replicationRoleSetters(ctx context.Context, conn *pgx.Conn, v pgversion.Version, exempt []string) ([]string, error) {
	if !v.HasParameterPrivileges() {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `SELECT r.rolname::text FROM pg_catalog.pg_roles r
		WHERE NOT r.rolsuper AND NOT r.rolname = ANY($1::text[])
		  AND r.rolname::text !~ '^pg_'
		  AND pg_catalog.has_parameter_privilege(r.oid, 'session_replication_role', 'SET')
		ORDER BY 1`, sortedRoles(exempt))
	if err != nil {
		return nil, fmt.Errorf("reading who may set session_replication_role: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// code is err's SQLSTATE, "" for none.
func code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// apply makes the catalog what eff and want say, one savepoint per table,
// so one table's failure (its owner is another role, a lock it could not
// take at once) leaves the others done; records the configuration; and
// keeps the event triggers. It returns what it did and what failed, by
// index into state.
func apply(ctx context.Context, conn *pgx.Conn, state []tableState, eff []sqlrewrite.Guard, want []wanted, eo, o Options, rec *recorded, r *Report) (changed map[int]string, failed map[int]error, err error) {
	changed, failed = map[int]string{}, map[int]error{}
	funcs := map[string]Function{}
	var discovered Function
	var effDiscovered sqlrewrite.Guard
	if o.Discovered != nil {
		effDiscovered = rec.discovered(*o.Discovered, o)
		discovered, _ = RowFunction(effDiscovered, eo)
		if discovered.Name != "" {
			funcs[discovered.Name] = discovered
		}
	}
	if f, ok := TruncateFunction(eo); ok {
		funcs[f.Name] = f // the DDL watch's too
	}
	for _, w := range want {
		for _, f := range []Function{w.row, w.trunc} {
			if f.Name != "" {
				funcs[f.Name] = f
			}
		}
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
		// Recorded first: the DDL guard judges each table's DDL below by
		// what the database records (a table put to observe may then lose
		// its row trigger), whichever role runs it.
		r.Recorded = true
		if err := savepoint(ctx, tx, func() error { return record(ctx, tx, state, eff, want, eo) },
			func(err error) { r.Recorded = false; r.Problems = append(r.Problems, err.Error()) }); err != nil {
			return err
		}
		for _, i := range order {
			st := state[i]
			if st.oid == 0 {
				continue
			}
			a := st.actions(state, eff[i], want, i)
			if len(a.stmts) == 0 {
				continue
			}
			if err := savepoint(ctx, tx, func() error {
				// Never queue behind an open transaction: a writer queued
				// behind this DDL's lock request would wait too. (Undone
				// with the savepoint when a statement fails.)
				if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+tableLockTimeout+"'"); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, fmt.Sprintf(lockNowSQL, literal(a.table), a.table)); err != nil {
					return err
				}
				for _, sql := range a.stmts {
					if _, err := tx.Exec(ctx, sql); err != nil {
						return &stmtError{sql, err}
					}
				}
				_, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'")
				return err
			}, func(err error) { failed[i] = err }); err != nil {
				return err
			}
			if failed[i] == nil {
				changed[i] = strings.Join(a.what, ", ")
			}
		}
		for _, name := range guardTriggers {
			if err := savepoint(ctx, tx, func() error {
				why, err := keepEventTrigger(ctx, tx, name, r.Superuser)
				if why != "" && r.NotGuardingDDL == "" {
					r.NotGuardingDDL = why
				}
				return err
			}, func(err error) { r.NotGuardingDDL = err.Error() }); err != nil {
				return err
			}
		}
		if discovered.Name != "" {
			tf, _ := TruncateFunction(eo)
			if err := savepoint(ctx, tx, func() error {
				why, err := watchDDL(ctx, tx, effDiscovered, discovered.Name, tf.Name, r.Superuser)
				r.NotWatchingDDL = why
				return err
			}, func(err error) { r.NotWatchingDDL = err.Error() }); err != nil {
				return err
			}
		}
		// Last, once the triggers and the records are what they are now.
		return savepoint(ctx, tx, func() error {
			var err error
			r.DroppedFunctions, err = dropUnused(ctx, tx, funcs)
			return err
		}, func(err error) { r.DroppedFunctions = nil })
	})
	return changed, failed, err
}

// unusedQuery lists pgfence's trigger functions (backstop_<hash> and
// backstop_truncate_<hash>) that no trigger runs, no recorded
// configuration names (pgfence.guarded, pgfence.ddl_backstop: what mends a
// table, or what the DDL watch puts on a new one) and that $1 does not
// list.
const unusedQuery = `
SELECT p.proname::text FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'pgfence' AND p.proname::text LIKE 'backstop\_%' AND p.prorettype = 'pg_catalog.trigger'::pg_catalog.regtype AND p.pronargs = 0
  AND NOT p.proname = ANY($1::text[])
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgfoid = p.oid)
  AND NOT EXISTS (SELECT 1 FROM pgfence.guarded g WHERE p.proname IN (g.row_function, g.truncate_function))
  AND NOT EXISTS (SELECT 1 FROM pgfence.ddl_backstop d WHERE p.proname IN (d.row_function, d.truncate_function))
ORDER BY 1`

// dropUnused drops the trigger functions nothing uses any more (see
// unusedQuery): each configuration change leaves the functions of the
// last one, and each version's bodies differ from the one before. keep
// are the functions this configuration wants. DROP FUNCTION without
// CASCADE: one a trigger took up meanwhile stays.
func dropUnused(ctx context.Context, tx pgx.Tx, keep map[string]Function) ([]string, error) {
	names := make([]string, 0, len(keep))
	for n := range keep {
		names = append(names, n)
	}
	rows, err := tx.Query(ctx, unusedQuery, names)
	if err != nil {
		return nil, err
	}
	unused, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, f := range unused {
		if _, err := tx.Exec(ctx, "DROP FUNCTION "+ident(Schema)+"."+ident(f)+"()"); err != nil {
			return nil, fmt.Errorf("dropping the unused trigger function %s.%s: %w", Schema, f, err)
		}
	}
	return unused, nil
}

// savepoint runs do in a savepoint of tx; when do fails, the savepoint is
// rolled back and failed gets do's error. The error is for tx itself.
func savepoint(ctx context.Context, tx pgx.Tx, do func() error, failed func(error)) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT pgfence_backstop"); err != nil {
		return err
	}
	if err := do(); err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT pgfence_backstop"); rerr != nil {
			return rerr
		}
		failed(err)
		return nil
	}
	_, err := tx.Exec(ctx, "RELEASE SAVEPOINT pgfence_backstop")
	return err
}

// stmtError is the error of one statement of a table's actions.
type stmtError struct {
	stmt string
	err  error
}

func (e *stmtError) Error() string { return e.err.Error() }
func (e *stmtError) Unwrap() error { return e.err }

// installFailure says why a table's backstop could not be installed, and
// what to do.
func installFailure(table, role string, st tableState, err error) string {
	var pe *pgconn.PgError
	var se *stmtError
	// Dropping a trigger, or enabling one with ALTER TABLE, takes owning
	// the table; creating one, the TRIGGER privilege on the table and on
	// each of its partitions (a partitioned table's is cloned to them).
	owning := errors.As(err, &se) && (strings.HasPrefix(se.stmt, "DROP ") || strings.HasPrefix(se.stmt, "ALTER "))
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "42501" && !owning && !st.mayTrigger:
			return fmt.Sprintf("cannot install the backstop on table %s: %s; pgfence's role %s needs the TRIGGER privilege on it to create its triggers "+
				"(GRANT TRIGGER ON TABLE %s TO %s); pgfence still fences what it sees", table, pe.Message, role, table, ident(role))
		case pe.Code == "42501" && !owning:
			return fmt.Sprintf("cannot install the backstop on table %s: %s; pgfence's role %s needs the TRIGGER privilege on each of its partitions too, "+
				"as Postgres creates a partitioned table's row trigger on every partition; pgfence still fences what it sees", table, pe.Message, role)
		case pe.Code == "42501" && !st.owns:
			return fmt.Sprintf("cannot change the backstop on table %s: %s; dropping one of its triggers (or enabling a partition's) takes owning the table, "+
				"which pgfence's role %s does not (its owner is %s): make it a member of the owner until pgfence's next read of the catalog has done it "+
				"(GRANT %s TO %s; REVOKE it after), or run 'pgfence init' once as a superuser; pgfence still fences what it sees",
				table, pe.Message, role, st.owner, ident(st.owner), ident(role))
		case pe.Code == "55P03":
			return fmt.Sprintf("cannot install the backstop on table %s yet: open transactions hold locks on it, and pgfence does not queue behind them (writers would queue behind pgfence); trying again shortly", table)
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

// tableActions are the statements that bring one table's backstop to
// what is wanted, and words for what they do.
type tableActions struct {
	table string
	stmts []string
	what  []string
}

func (a *tableActions) add(what string, stmts ...string) {
	a.stmts = append(a.stmts, stmts...)
	if what != "" {
		a.what = append(a.what, what)
	}
}

// tableLockTimeout is how long a table's DDL may wait for the table's
// lock: next to nothing, as a writer queued behind the DDL's request would
// wait too. It stands for LOCK TABLE ... NOWAIT, which would need more
// than the TRIGGER privilege (UPDATE, DELETE or TRUNCATE on the table);
// it fails with the same SQLSTATE, 55P03.
const tableLockTimeout = "1ms"

// lockNowSQL takes a table's lock for creating its triggers without
// waiting at all (NOWAIT), where pgfence's role may lock the table (it
// owns it, or has UPDATE, DELETE or TRUNCATE on it); with the TRIGGER
// privilege alone it cannot, and its DDL waits tableLockTimeout at most.
// Its arguments are the table's name as a literal, then as an identifier.
const lockNowSQL = `DO $pgfence$ BEGIN
  IF pg_catalog.has_table_privilege(%[1]s, 'UPDATE, DELETE, TRUNCATE') THEN
    LOCK TABLE %[2]s IN SHARE ROW EXCLUSIVE MODE NOWAIT;
  END IF;
END $pgfence$`

// actions are what brings table i's backstop (st) to g's, whose functions
// want[i] says. Only what needs it drops a trigger (observe, TRUNCATE
// allowed, a partition's redundant own trigger, the rename of an old
// name), which takes owning the table: a trigger is created, replaced or
// enabled again (CREATE OR REPLACE enables it) with the TRIGGER privilege
// alone.
func (st tableState) actions(all []tableState, g sqlrewrite.Guard, want []wanted, i int) tableActions {
	a := tableActions{table: ident(g.Schema) + "." + ident(g.Table)}
	w := want[i]
	createRow := func(verb, name string) string {
		return verb + " TRIGGER " + ident(name) + " BEFORE INSERT OR UPDATE OR DELETE ON " + a.table +
			" FOR EACH ROW EXECUTE FUNCTION " + ident(Schema) + "." + ident(w.row.Name) + "()"
	}
	switch {
	case w.row.Name == "":
		if st.own.exists {
			a.add("removed (observe)", "DROP TRIGGER "+ident(st.own.name)+" ON "+a.table)
		}
		if st.epoch != "" {
			a.add("", "DROP TRIGGER "+ident(EpochTrigger)+" ON "+a.table)
		}
	case st.cloned && (st.clone.function == w.row.Name || st.clonedFromGuarded(all, want, w)):
		// The partitioned ancestor's trigger covers it. A clone that runs
		// another configuration than the table's (an ancestor configured
		// otherwise, see backstop_problem, which reports it) does not:
		// the table then keeps a trigger of its own, below, which fires
		// first and fences it as configured.
		if st.own.exists {
			a.add("own row trigger dropped (the one cloned from its parent covers it)", "DROP TRIGGER "+ident(st.own.name)+" ON "+a.table)
		}
		if st.clone.enabled != "O" {
			// A clone cannot be replaced on its own: this takes owning
			// the partition.
			a.add("enabled", "ALTER TABLE "+a.table+" ENABLE TRIGGER "+ident(st.clone.name))
		}
	case !st.own.exists && st.partition && st.clonedFromGuarded(all, want, w):
		// Its ancestor's, installed first, will be cloned to it.
	default:
		name := ownRowTrigger(st.kind, st.oid)
		switch {
		case !st.own.exists:
			a.add("created", createRow("CREATE", name))
		case st.own.name != name:
			// A partitioned table's trigger named as a plain table's
			// (before pgfence named them apart) would stop a table with a
			// backstop of its own from being attached as a partition.
			a.add("renamed "+name, createRow("CREATE", name), "DROP TRIGGER "+ident(st.own.name)+" ON "+a.table)
		case !st.own.ok || st.own.function != w.row.Name:
			a.add("updated", createRow("CREATE OR REPLACE", name))
		case st.own.enabled != "O":
			a.add("enabled (was "+enabledWord(st.own.enabled)+")", createRow("CREATE OR REPLACE", name))
		}
	}
	switch {
	case w.row.Name == "":
	case st.epoch != "O":
		// Missing, or not enabled as created (it never runs, so its state
		// changes nothing, but a trigger not as pgfence creates it is not
		// left so).
		what := ""
		if st.epoch == "" && len(a.what) == 0 {
			what = "epoch column tied to the backstop"
		}
		a.add(what, "CREATE OR REPLACE TRIGGER "+ident(EpochTrigger)+" BEFORE UPDATE OF "+ident(g.Column)+" ON "+a.table+
			" FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION "+ident(Schema)+".epoch_guard()")
	}
	if w.row.Name != "" && !st.counter {
		a.stmts = append(a.stmts, "CREATE SEQUENCE IF NOT EXISTS "+ident(Schema)+"."+ident("rejects_"+strconv.FormatUint(uint64(st.oid), 10)))
	}
	createTrunc := "CREATE OR REPLACE TRIGGER " + ident(TruncateTrigger) + " BEFORE TRUNCATE ON " + a.table +
		" FOR EACH STATEMENT EXECUTE FUNCTION " + ident(Schema) + "." + ident(w.trunc.Name) + "()"
	switch {
	case w.trunc.Name == "":
		if st.trunc.exists {
			a.add("TRUNCATE allowed", "DROP TRIGGER "+ident(TruncateTrigger)+" ON "+a.table)
		}
	case !st.trunc.exists || !st.trunc.ok || st.trunc.function != w.trunc.Name:
		what := ""
		if len(a.what) == 0 {
			what = "TRUNCATE trigger set"
		}
		a.add(what, createTrunc)
	case st.trunc.enabled != "O":
		a.add("TRUNCATE trigger enabled", createTrunc)
	}
	return a
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
		WHERE t.tgname::text ~ $1::text AND t.tgparentid = 0::oid AND NOT t.tgrelid::int8 = ANY($2) ORDER BY 1`, rowTriggerName, oids)
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
WHERE t.tgname::text ~ $1::text AND t.tgparentid = 0::oid AND pn.nspname = $2
ORDER BY 1, 2`

// Carriers returns the tables that carry the backstop (its row trigger of
// their own), each as a guard with its schema, table and epoch column. The
// trigger goes with its table when it is renamed or moved to another
// schema, so a table guarded by a name it no longer has is found here
// under its new one.
func Carriers(ctx context.Context, conn *pgx.Conn) ([]sqlrewrite.Guard, error) {
	rows, err := conn.Query(ctx, carriersQuery, rowTriggerName, Schema)
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
