package fence_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// epochs returns id:val:epoch of every row, in id order.
func epochs(t *testing.T, tbl string) string {
	t.Helper()
	rows, err := pgtest.Direct(t).Query(ctx, "SELECT id, coalesce(val, ''), fence_epoch FROM "+tbl+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var id int
		var v string
		var e int64
		rows.Scan(&id, &v, &e)
		out = append(out, fmt.Sprintf("%d:%s:%d", id, v, e))
	}
	return strings.Join(out, " ")
}

func TestInsertStampsToken(t *testing.T) {
	tbl := table(t)
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '7'")
	for _, sql := range []string{
		"INSERT INTO " + tbl + " (id, val) VALUES (1, 'a'), (2, DEFAULT)",
		"INSERT INTO " + tbl + " (id, val) SELECT 3, 'c'",
		"INSERT INTO " + tbl + " (id, val) SELECT 4, 'd' UNION ALL SELECT 5, 'e'",
		"INSERT INTO " + tbl + " (id) VALUES ($1)",
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = append(args, 6)
		}
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if got, want := epochs(t, tbl), "1:a:7 2::7 3:c:7 4:d:7 5:e:7 6::7"; got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
	// An INSERT without a column list cannot be stamped: refused.
	_, err := c.Exec(ctx, "INSERT INTO "+tbl+" VALUES (9, 'x', 0)")
	if pe := pgErr(t, err); pe.Code != "0A000" || !strings.Contains(pe.Message, "column list") {
		t.Fatalf("INSERT without columns: %s %q", pe.Code, pe.Message)
	}
	// A write without a token inserts nothing.
	c2 := p.Connect(t)
	_, err = c2.Exec(ctx, "INSERT INTO "+tbl+" (id, val) VALUES (10, 'no token')")
	if pe := pgErr(t, err); pe.Code != "55000" {
		t.Fatalf("INSERT without token: %v", pe)
	}
}

func TestDefaultValuesInsert(t *testing.T) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, "DROP TABLE IF EXISTS dv_t; CREATE TABLE dv_t (id serial PRIMARY KEY, fence_epoch bigint NOT NULL)")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE dv_t") })
	p := pgtest.StartProxy(t, []string{"dv_t"})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '3'")
	if tag := pgtest.Exec(t, c, "INSERT INTO dv_t DEFAULT VALUES"); tag != "INSERT 0 1" {
		t.Fatal(tag)
	}
	var e int64
	db.QueryRow(ctx, "SELECT fence_epoch FROM dv_t").Scan(&e)
	if e != 3 {
		t.Fatalf("epoch %d, want 3", e)
	}
}

func TestUpsertIsFenced(t *testing.T) {
	tbl := table(t, [3]any{1, "B", 43})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	upsert := "INSERT INTO " + tbl + " AS t (id, val) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val"
	pgtest.Exec(t, c, "SET fence.token = '42'")
	if tag := pgtest.Exec(t, c, upsert, 1, "A"); tag != "INSERT 0 0" {
		t.Fatalf("stale upsert: %s, want INSERT 0 0", tag)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("stale upsert not counted: %v", got)
	}
	if tag := pgtest.Exec(t, c, upsert, 2, "new"); tag != "INSERT 0 1" {
		t.Fatalf("upsert of a new row: %s", tag)
	}
	pgtest.Exec(t, c, "SET fence.token = '44'")
	if tag := pgtest.Exec(t, c, upsert, 1, "C"); tag != "INSERT 0 1" {
		t.Fatalf("fresh upsert: %s", tag)
	}
	pgtest.Exec(t, c, "INSERT INTO "+tbl+" (id, val) VALUES (3, 'n') ON CONFLICT DO NOTHING")
	if got, want := epochs(t, tbl), "1:C:44 2:new:42 3:n:44"; got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
	_, err := c.Exec(ctx, "INSERT INTO "+tbl+" (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET fence_epoch = 0")
	if pe := pgErr(t, err); pe.Code != "42501" {
		t.Fatalf("forged epoch in DO UPDATE: %v", pe)
	}
}

// Writes nested in other statements are fenced where they are.
func TestNestedWrites(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 50}, [3]any{2, "y", 1})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '10'")

	var n int
	if err := c.QueryRow(ctx, "WITH u AS (UPDATE "+tbl+" SET val = 'cte' WHERE id = 1 RETURNING id) SELECT count(*) FROM u").Scan(&n); err != nil || n != 0 {
		t.Fatalf("stale CTE update: %d rows, %v", n, err)
	}
	if got := rejects(t, p, tbl); got != 1 {
		t.Fatalf("CTE reject not counted: %v", got)
	}
	if err := c.QueryRow(ctx, "WITH d AS (DELETE FROM "+tbl+" WHERE id = 2 RETURNING id), i AS (INSERT INTO "+tbl+" (id, val) SELECT id + 10, 'moved' FROM d RETURNING id) SELECT count(*) FROM i").Scan(&n); err != nil || n != 1 {
		t.Fatalf("CTE delete+insert: %d %v", n, err)
	}

	pgtest.Exec(t, c, "PREPARE bump(text) AS UPDATE "+tbl+" SET val = $1 WHERE id = 1")
	if tag := pgtest.Exec(t, c, "EXECUTE bump('stale')"); tag != "UPDATE 0" {
		t.Fatalf("EXECUTE with stale token: %s", tag)
	}
	if got := rejects(t, p, tbl); got != 2 {
		t.Fatalf("EXECUTE reject not counted: %v", got)
	}
	pgtest.Exec(t, c, "SET fence.token = '60'")
	if tag := pgtest.Exec(t, c, "EXECUTE bump('fresh')"); tag != "UPDATE 1" {
		t.Fatalf("EXECUTE after the token rose: %s", tag)
	}
	pgtest.Exec(t, c, "SET fence.token = '55'")
	rows, err := c.Query(ctx, "EXPLAIN ANALYZE UPDATE "+tbl+" SET val = 'explained' WHERE id = 1", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if got := rejects(t, p, tbl); got != 3 {
		t.Fatalf("EXPLAIN ANALYZE reject not counted: %v", got)
	}
	if got, want := epochs(t, tbl), "1:fresh:60 12:moved:10"; got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
}

// Reads of a guarded table pass untouched.
func TestReadsPassUntouched(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	for _, sql := range []string{
		"SELECT val FROM " + tbl + " WHERE id = 1",
		"CREATE TEMP TABLE copy_of AS SELECT * FROM " + tbl,
		"SELECT * FROM " + tbl + " FOR UPDATE",
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var out strings.Builder
	if _, err := c.PgConn().CopyTo(ctx, &out, "COPY "+tbl+" TO STDOUT"); err != nil || out.String() != "1\tx\t5\n" {
		t.Fatalf("COPY TO: %q %v", out.String(), err)
	}
	if got := p.Counter(t, "pgfence_queries_total", "action=fenced"); got != 0 {
		t.Fatalf("reads were fenced: %v", got)
	}
}

func TestUnfenceableForms(t *testing.T) {
	tbl := table(t, [3]any{1, "x", 5})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '5'")
	for sql, code := range map[string]string{
		"TRUNCATE " + tbl: "0A000",
		"MERGE INTO " + tbl + " t USING (SELECT 1 AS id) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET val = 'm'": "0A000",
		"COPY " + tbl + " (id, val) FROM STDIN": "0A000",
	} {
		_, err := c.Exec(ctx, sql)
		if pe := pgErr(t, err); pe.Code != code || pe.Hint == "" {
			t.Errorf("%s: %s %q hint %q, want %s with a hint", sql, pe.Code, pe.Message, pe.Hint, code)
		}
	}
	pgtest.Exec(t, c, "BEGIN")
	pgtest.Exec(t, c, "DECLARE cur CURSOR FOR SELECT * FROM "+tbl+" FOR UPDATE")
	pgtest.Exec(t, c, "FETCH cur")
	_, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'c' WHERE CURRENT OF cur")
	if pe := pgErr(t, err); pe.Code != "0A000" {
		t.Errorf("CURRENT OF: %v", pe)
	}
	pgtest.Exec(t, c, "ROLLBACK")

	// Allowed by configuration: they pass and are counted.
	pa := pgtest.StartProxy(t, []string{tbl}, func(_ *proxy.Config, fc *fence.Config) {
		fc.Allow = sqlrewrite.Allow{Truncate: true, CopyFrom: true, CurrentOf: true}
	})
	ca := pa.Connect(t)
	if _, err := ca.PgConn().CopyFrom(ctx, strings.NewReader("2\tcopied\t0\n"), "COPY "+tbl+" FROM STDIN"); err != nil {
		t.Fatalf("allowed COPY FROM: %v", err)
	}
	pgtest.Exec(t, ca, "TRUNCATE "+tbl)
	if got := pa.Counter(t, "pgfence_unfenced_writes_total", "table="+tbl, "form=TRUNCATE"); got != 1 {
		t.Fatalf("allowed TRUNCATE not counted: %v", got)
	}
}

// A write naming a partition or inheritance child of a guarded table, which
// the catalog's read guards too (internal/catalog's TestDiscover), is
// fenced through the proxy.
func TestDiscovery(t *testing.T) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS disc_parted, disc_parent CASCADE;
		CREATE TABLE disc_parted (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
		CREATE TABLE disc_parted_1 PARTITION OF disc_parted FOR VALUES FROM (0) TO (100);
		CREATE TABLE disc_parent (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0);
		CREATE TABLE disc_child () INHERITS (disc_parent);
		INSERT INTO disc_parted VALUES (1, 'p', 50); INSERT INTO disc_child VALUES (1, 'c', 50)`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS disc_parted, disc_parent CASCADE")
	})
	explicit := []sqlrewrite.Guard{{Table: "disc_parted", Column: "fence_epoch"}, {Table: "disc_parent", Column: "fence_epoch"}}
	d, err := catalog.Discover(ctx, db, explicit, false, "fence_epoch", func(g sqlrewrite.Guard) sqlrewrite.Guard { return g })
	if err != nil {
		t.Fatal(err)
	}
	p := pgtest.StartProxy(t, nil, func(_ *proxy.Config, fc *fence.Config) { fc.Guards = d.Guards })
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '10'")
	for _, tbl := range []string{"disc_parted_1", "disc_child", "disc_parted", "ONLY disc_parent"} {
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
			t.Errorf("stale write to %s: %s", tbl, tag)
		}
	}
}

// A table partitioned by its epoch column: a fenced write moves the row to
// the partition of its new epoch (Postgres runs a cross-partition UPDATE as
// a delete and an insert), and stale writes are still refused and counted,
// through the parent or naming a partition.
func TestPartitionedByEpoch(t *testing.T) {
	db := pgtest.Direct(t)
	pgtest.Exec(t, db, `DROP TABLE IF EXISTS part_epoch CASCADE;
		CREATE TABLE part_epoch (id int, val text, fence_epoch bigint NOT NULL DEFAULT 0, PRIMARY KEY (id, fence_epoch)) PARTITION BY RANGE (fence_epoch);
		CREATE TABLE part_epoch_old PARTITION OF part_epoch FOR VALUES FROM (MINVALUE) TO (100);
		CREATE TABLE part_epoch_new PARTITION OF part_epoch FOR VALUES FROM (100) TO (MAXVALUE);
		INSERT INTO part_epoch VALUES (1, 'a', 5), (2, 'b', 5)`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.Direct(t), "DROP TABLE IF EXISTS part_epoch CASCADE") })
	d, err := catalog.Discover(ctx, db, []sqlrewrite.Guard{{Table: "part_epoch", Column: "fence_epoch"}}, false, "fence_epoch",
		func(g sqlrewrite.Guard) sqlrewrite.Guard { return g })
	if err != nil {
		t.Fatal(err)
	}
	p := pgtest.StartProxy(t, nil, func(_ *proxy.Config, fc *fence.Config) { fc.Guards = d.Guards })
	c := p.Connect(t)
	// where lists each row as id:val:epoch@partition.
	where := func() string {
		t.Helper()
		rows, err := pgtest.Direct(t).Query(ctx, "SELECT id, val, fence_epoch, tableoid::regclass::text FROM part_epoch ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id int
			var val, part string
			var epoch int64
			if err := rows.Scan(&id, &val, &epoch, &part); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%d:%s:%d@%s", id, val, epoch, part))
		}
		return strings.Join(out, " ")
	}
	steps := []struct{ token, sql, tag, rows string }{
		{"150", "UPDATE part_epoch SET val = 'x' WHERE id = 1", "UPDATE 1", "1:x:150@part_epoch_new 2:b:5@part_epoch_old"},
		{"50", "UPDATE part_epoch SET val = 'stale' WHERE id = 1", "UPDATE 0", "1:x:150@part_epoch_new 2:b:5@part_epoch_old"},
		{"50", "UPDATE part_epoch_new SET val = 'stale' WHERE id = 1", "UPDATE 0", "1:x:150@part_epoch_new 2:b:5@part_epoch_old"},
		{"50", "UPDATE part_epoch SET val = 'y' WHERE id = 2", "UPDATE 1", "1:x:150@part_epoch_new 2:y:50@part_epoch_old"},
		{"200", "INSERT INTO part_epoch (id, val) VALUES (3, 'z')", "INSERT 0 1", "1:x:150@part_epoch_new 2:y:50@part_epoch_old 3:z:200@part_epoch_new"},
		{"40", "DELETE FROM part_epoch WHERE id = 2", "DELETE 0", "1:x:150@part_epoch_new 2:y:50@part_epoch_old 3:z:200@part_epoch_new"},
		{"40", "DELETE FROM part_epoch_old WHERE id = 2", "DELETE 0", "1:x:150@part_epoch_new 2:y:50@part_epoch_old 3:z:200@part_epoch_new"},
		{"120", "UPDATE part_epoch SET val = 'w' WHERE id IN (1, 2)", "UPDATE 1", "1:x:150@part_epoch_new 2:w:120@part_epoch_new 3:z:200@part_epoch_new"},
	}
	for _, st := range steps {
		pgtest.Exec(t, c, "SET fence.token = '"+st.token+"'")
		if tag := pgtest.Exec(t, c, st.sql); tag != st.tag {
			t.Fatalf("token %s, %s: %s, want %s", st.token, st.sql, tag, st.tag)
		}
		if got := where(); got != st.rows {
			t.Fatalf("token %s, %s:\n rows %s\n want %s", st.token, st.sql, got, st.rows)
		}
	}
	var total float64
	// The unqualified guard is labelled with the one table it stands for.
	for _, tbl := range []string{"public.part_epoch", "public.part_epoch_old", "public.part_epoch_new"} {
		total += rejects(t, p, tbl)
	}
	if total != 5 {
		t.Fatalf("fencing_reject_total over the table and its partitions = %v, want 5", total)
	}
}

// Rollout modes: observe counts, shadow counts what enforce would reject
// without blocking and without lowering epochs; a missing token can be
// allowed.
func TestRollouts(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 50})
	withRollout := func(r sqlrewrite.Rollout, allowMissing bool) func(*proxy.Config, *fence.Config) {
		return func(_ *proxy.Config, fc *fence.Config) {
			for i := range fc.Guards {
				fc.Guards[i].Rollout, fc.Guards[i].AllowMissingToken = r, allowMissing
			}
		}
	}
	t.Run("observe", func(t *testing.T) {
		p := pgtest.StartProxy(t, []string{tbl}, withRollout(sqlrewrite.Observe, false))
		c := p.Connect(t)
		pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'no token' WHERE id = 1")
		pgtest.Exec(t, c, "SET fence.token = '1'")
		pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'observed' WHERE id = 1")
		if got, want := epochs(t, tbl), "1:observed:50"; got != want {
			t.Fatalf("observe changed the write: %s", got)
		}
		if p.Counter(t, "pgfence_guarded_writes_total", "table="+tbl, "mode=observe", "token=missing") != 1 ||
			p.Counter(t, "pgfence_guarded_writes_total", "table="+tbl, "mode=observe", "token=set") != 1 {
			t.Fatal("observe did not count writes with and without a token")
		}
	})
	t.Run("shadow", func(t *testing.T) {
		p := pgtest.StartProxy(t, []string{tbl}, withRollout(sqlrewrite.Shadow, false))
		c := p.Connect(t)
		pgtest.Exec(t, c, "SET fence.token = '40'")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'shadowed' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("shadow blocked a write: %s", tag)
		}
		if got, want := epochs(t, tbl), "1:shadowed:50"; got != want {
			t.Fatalf("shadow lowered the epoch: %s", got)
		}
		if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "mode=shadow"); got != 1 {
			t.Fatalf("shadow reject not counted: %v", got)
		}
		if got := p.Counter(t, "fencing_reject_total", "table="+tbl, "mode=enforce"); got != 0 {
			t.Fatalf("shadow counted as an enforced reject: %v", got)
		}
		if !strings.Contains(p.Logs.String(), "would have been fenced") {
			t.Fatal("shadow reject not logged")
		}
	})
	t.Run("enforce, missing token allowed", func(t *testing.T) {
		p := pgtest.StartProxy(t, []string{tbl}, withRollout(sqlrewrite.Enforce, true))
		c := p.Connect(t)
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'tokenless' WHERE id = 1"); tag != "UPDATE 1" {
			t.Fatalf("allowed missing token: %s", tag)
		}
		if got := p.Counter(t, "critical_write_without_token_total", "table="+tbl, "action=allowed"); got != 1 {
			t.Fatalf("critical_write_without_token_total{action=allowed} = %v", got)
		}
		pgtest.Exec(t, c, "SET fence.token = '3'")
		if tag := pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'stale' WHERE id = 1"); tag != "UPDATE 0" {
			t.Fatalf("a stale token is still fenced: %s", tag)
		}
		pgtest.Exec(t, c, "SET fence.token = 'x'")
		if _, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'bad' WHERE id = 1"); pgErr(t, err).Code != "22023" {
			t.Fatal("a malformed token must still fail")
		}
	})
}

// With NotifyStale, the stale writer gets a WARNING after its statement.
func TestStaleWriterNotice(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 50})
	p := pgtest.StartProxy(t, []string{tbl}, func(_ *proxy.Config, fc *fence.Config) { fc.NotifyStale = true })
	cfg, _ := pgx.ParseConfig(p.URL())
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Severity+" "+n.Message) }
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	pgtest.Exec(t, c, "SET fence.token = '42'")
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		notices = nil
		if tag, err := c.Exec(ctx, "UPDATE "+tbl+" SET val = 'x' WHERE id = 1", mode); err != nil || tag.String() != "UPDATE 0" {
			t.Fatalf("%v: %v %v", mode, tag, err)
		}
		if len(notices) != 1 || !strings.Contains(notices[0], "WARNING pgfence: stale write fenced") || !strings.Contains(notices[0], "42") {
			t.Fatalf("%v: notices %q", mode, notices)
		}
	}
}

func TestRewriteCache(t *testing.T) {
	tbl := table(t, [3]any{1, "v", 0})
	p := pgtest.StartProxy(t, []string{tbl})
	c := p.Connect(t)
	pgtest.Exec(t, c, "SET fence.token = '1'")
	for i := 0; i < 3; i++ {
		pgtest.Exec(t, c, "UPDATE "+tbl+" SET val = 'x' WHERE id = 1", pgx.QueryExecModeSimpleProtocol)
	}
	if hits, misses := p.Counter(t, "pgfence_rewrite_cache_hits_total"), p.Counter(t, "pgfence_rewrite_cache_misses_total"); hits != 2 || misses != 1 {
		t.Fatalf("cache hits %v misses %v, want 2 and 1", hits, misses)
	}
}
