package sqlrewrite

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

func TestParameterize(t *testing.T) {
	for _, tc := range []struct {
		sql    string
		writes bool
		want   string   // "" when not parameterized
		types  []uint32 // with want
		values []string
	}{
		{sql: "SELECT * FROM t WHERE id = 5", writes: false},
		{sql: "SELECT 'update', 1 -- delete", writes: false},
		{sql: "UPDATE t SET v = v + 5 WHERE id = 7", writes: true,
			want: "UPDATE t SET v = v + $1 WHERE id = $2", types: []uint32{oidInt4, oidInt4}, values: []string{"5", "7"}},
		{sql: "update t set a = -2147483647, b = 2147483647 where c = 9223372036854775807", writes: true,
			want: "update t set a = -$1, b = $2 where c = $3", types: []uint32{oidInt4, oidInt4, oidInt8},
			values: []string{"2147483647", "2147483647", "9223372036854775807"}},
		// Behind a minus, which Postgres folds into them, these two have a
		// narrower type than a parameter would: they stay in the text.
		{sql: "update t set a = -2147483648 where c = 1", writes: true},
		{sql: "update t set a = 1 where c = - 09223372036854775808", writes: true},
		{sql: "update t set a = 2147483648.5, b = 9223372036854775809 where c = 1", writes: true,
			want: "update t set a = $1, b = $2 where c = $3", types: []uint32{oidNumeric, oidNumeric, oidInt4},
			values: []string{"2147483648.5", "9223372036854775809", "1"}},
		{sql: "DELETE FROM t WHERE x IN (1.5, .5, 5., 1e3, 2E-7, 007)", writes: true,
			want:  "DELETE FROM t WHERE x IN ($1, $2, $3, $4, $5, $6)",
			types: []uint32{oidNumeric, oidNumeric, oidNumeric, oidNumeric, oidNumeric, oidInt4}, values: []string{"1.5", ".5", "5.", "1e3", "2E-7", "007"}},
		// Literals in strings, identifiers and comments stay; so does the
		// rest of the text, byte for byte.
		{sql: "INSERT INTO \"t1\" (a, b) VALUES ('5', 6) /* 7 */ -- 8\n", writes: true,
			want: "INSERT INTO \"t1\" (a, b) VALUES ('5', $1) /* 7 */ -- 8\n", types: []uint32{oidInt4}, values: []string{"6"}},
		{sql: "UPDATE t SET a = $$9$$ WHERE b = E'\\'1'", writes: true,
			want: "UPDATE t SET a = $$9$$ WHERE b = E'\\'1'", types: []uint32{}, values: []string{}},
		// Plain strings move, untyped, where nothing around them makes them
		// part of something else.
		{sql: "UPDATE t SET name = 'bob', note = 'it''s', empty = '' WHERE id = 7", writes: true,
			want: "UPDATE t SET name = $1, note = $2, empty = $3 WHERE id = $4", types: []uint32{0, 0, 0, oidInt4},
			values: []string{"bob", "it's", "", "7"}},
		{sql: "DELETE FROM t WHERE a IN ('x','y') AND b LIKE 'z%' AND c = 'é' AND 'w' = d", writes: true,
			want: "DELETE FROM t WHERE a IN ($1,$2) AND b LIKE $3 AND c = $4 AND $5 = d", types: []uint32{0, 0, 0, 0, 0},
			values: []string{"x", "y", "z%", "é", "w"}},
		// A typed literal, strings continued over a newline, other forms of
		// string, and a string touching a word stay.
		{sql: "UPDATE t SET d = DATE 'x1', i = interval 'x2' day, j = \"t\" 'x3' WHERE k = 'a'", writes: true,
			want: "UPDATE t SET d = DATE 'x1', i = interval 'x2' day, j = \"t\" 'x3' WHERE k = $1", types: []uint32{0}, values: []string{"a"}},
		{sql: "UPDATE t SET a = 'x'\n'y', b = 'z' -- c\n'w' WHERE c = 'v'", writes: true,
			want: "UPDATE t SET a = 'x'\n'y', b = 'z' -- c\n'w' WHERE c = $1", types: []uint32{0}, values: []string{"v"}},
		{sql: "UPDATE t SET a = E'x', b = $$y$$, c = U&'z', d = N'w', e = B'1' WHERE f='v'and g=1", writes: true,
			want: "UPDATE t SET a = E'x', b = $$y$$, c = U&'z', d = N'w', e = B'1' WHERE f='v'and g=$1", types: []uint32{oidInt4}, values: []string{"1"}},
		// What an interval could be read from stays, unless a cast says
		// what it is.
		{sql: "UPDATE t SET a = '5', b = '1 day 5', c = 'P1DT2H', d = '1-2', e = 'note 5', f = '1:30'::interval WHERE g = 'day'", writes: true,
			want:  "UPDATE t SET a = '5', b = '1 day 5', c = 'P1DT2H', d = '1-2', e = $1, f = $2::interval WHERE g = $3",
			types: []uint32{0, 0, 0}, values: []string{"note 5", "1:30", "day"}},
		// Not UTF-8: Postgres fails the Query as a whole.
		{sql: "UPDATE t SET a = 'x\xff' WHERE b = 'y'", writes: true,
			want: "UPDATE t SET a = 'x\xff' WHERE b = $1", types: []uint32{0}, values: []string{"y"}},
		// A date or timestamp, which no interval is read from.
		{sql: "UPDATE t SET a = '2024-01-31', b = ' 2024-01-31 10:00:00.5+01', c = '01/31/2024' WHERE d = '2024'", writes: true,
			want:  "UPDATE t SET a = $1, b = $2, c = $3 WHERE d = '2024'",
			types: []uint32{0, 0, 0}, values: []string{"2024-01-31", " 2024-01-31 10:00:00.5+01", "01/31/2024"}},
		{sql: "UPDATE t SET a = 1;", writes: true, want: "UPDATE t SET a = $1;", types: []uint32{oidInt4}, values: []string{"1"}},
		{sql: "UPDATE t SET a = 1 ; ; -- done", writes: true, want: "UPDATE t SET a = $1 ; ; -- done", types: []uint32{oidInt4}, values: []string{"1"}},
		// Where a parameter would not mean what the literal does, or not
		// one write: left as written.
		{sql: "UPDATE t SET a = 1; UPDATE t SET a = 2", writes: true},
		{sql: "UPDATE t SET a = $1 WHERE b = 2", writes: true},
		{sql: "DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY 1 LIMIT 5)", writes: true},
		{sql: "INSERT INTO t SELECT a, count(*) FROM s GROUP BY 1", writes: true},
		{sql: "INSERT INTO t SELECT DISTINCT ON (1) a FROM s", writes: true},
		// An upsert: the literals of its ON CONFLICT target stay (an
		// arbiter index's expressions and predicate are matched against
		// them); the others are parameters, in DO UPDATE too.
		{sql: "INSERT INTO t VALUES (1, 'x') ON CONFLICT (a) WHERE b > 0 DO NOTHING", writes: true,
			want: "INSERT INTO t VALUES ($1, $2) ON CONFLICT (a) WHERE b > 0 DO NOTHING", types: []uint32{oidInt4, 0}, values: []string{"1", "x"}},
		{sql: "insert into t (a, v) values (7, 2) on conflict ((a + 1)) where b = 'y' do update set v = t.v + 3 where t.c < 4", writes: true,
			want:  "insert into t (a, v) values ($1, $2) on conflict ((a + 1)) where b = 'y' do update set v = t.v + $3 where t.c < $4",
			types: []uint32{oidInt4, oidInt4, oidInt4, oidInt4}, values: []string{"7", "2", "3", "4"}},
		{sql: "INSERT INTO t VALUES (5) ON CONFLICT ON CONSTRAINT k DO UPDATE SET v = 6", writes: true,
			want: "INSERT INTO t VALUES ($1) ON CONFLICT ON CONSTRAINT k DO UPDATE SET v = $2", types: []uint32{oidInt4, oidInt4}, values: []string{"5", "6"}},
		// With no DO after it, every literal after CONFLICT stays.
		{sql: "INSERT INTO t (conflict) VALUES (8)", writes: true, want: "INSERT INTO t (conflict) VALUES (8)"},
		{sql: "UPDATE t SET a = 0x1F", writes: true},
		{sql: "UPDATE t SET a = 1_000", writes: true},
		{sql: "TRUNCATE t", writes: true},
		{sql: "EXECUTE p(1)", writes: true},
		{sql: "UPDATE t SET a = 'unterminated", writes: true},
	} {
		p, writes := Parameterize(tc.sql)
		if writes != tc.writes || p.SQL != tc.want {
			t.Errorf("%q: writes %v, template %q; want %v, %q", tc.sql, writes, p.SQL, tc.writes, tc.want)
			continue
		}
		if tc.want != "" && (!slices.Equal(p.Types, tc.types) || !slices.Equal(p.Values, tc.values)) {
			t.Errorf("%q: types %v values %q; want %v %q", tc.sql, p.Types, p.Values, tc.types, tc.values)
		}
	}
}

func TestRewriteTemplate(t *testing.T) {
	r, err := New(Config{Guards: []Guard{{Table: "t", Column: "fence_epoch"}, {Table: "o", Column: "fence_epoch", Rollout: Observe}}, TokenSetting: "fence.token"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sql string
		ok  bool
	}{
		{"UPDATE t SET a = 1 WHERE id = 2", true},
		{"DELETE FROM t WHERE id = 2", true},
		{"INSERT INTO t (id) VALUES (2)", true},
		{"UPDATE t SET a = 1 WHERE id = 2 RETURNING a", false},       // returns rows
		{"UPDATE u SET a = 1 WHERE id = 2", false},                   // not guarded
		{"UPDATE o SET a = 1 WHERE id = 2", false},                   // observed: sent as written
		{"UPDATE t SET a = 1.5::numeric(10, 2) WHERE id = 2", false}, // typmod
		{"UPDATE t SET a = CAST(1 AS varchar(3)) WHERE id = 2", false},
		{"UPDATE t SET fence_epoch = 1 WHERE id = 2", false}, // refused
		{"WITH x AS (DELETE FROM t WHERE id = 1) UPDATE t SET a = 1 WHERE id = 2", true},
		// Strings: compared with a column, assigned to one, or cast.
		{"UPDATE t SET a = 'x', b = 'y'::date WHERE name = 'z' AND c <> 'w'", true},
		{"INSERT INTO t (id, a) VALUES (1, 'x'), (2, 'y')", true},
		{"DELETE FROM t WHERE a IN ('x', 'y') OR b BETWEEN 'p' AND 'q' OR c LIKE 'r%' OR d >= 's'", true},
		{"UPDATE t SET a = upper('x') WHERE id = 1", false},           // a function's argument
		{"UPDATE t SET a = (SELECT 'x') WHERE id = 1", false},         // a SELECT list
		{"UPDATE t SET a = pg_typeof('x')::text WHERE id = 1", false}, // unknown as a literal, an error as a parameter
		{"UPDATE t SET d = '5'::interval hour WHERE id = 1", false},   // 5 hours as a literal, 5 seconds as a parameter
		{"UPDATE t SET (a, b) = ('x', 'y') WHERE id = 1", false},      // not a plain assignment
		{"INSERT INTO t (id, a) SELECT 1, 'x'", false},                // not VALUES
		{"UPDATE t SET a = 'x' WHERE id = ANY('{1,2}'::int[] || 'z')", false},
	} {
		p, _ := Parameterize(tc.sql)
		if p.SQL == "" {
			t.Fatalf("%q: not parameterized", tc.sql)
		}
		res, ok, err := r.RewriteTemplate(p)
		if err != nil || ok != tc.ok {
			t.Errorf("%q: ok %v, %v; want %v", tc.sql, ok, err, tc.ok)
			continue
		}
		if ok && (!res.NoRows || len(res.Probes) != 1 || !strings.Contains(res.SQL, "$1")) {
			t.Errorf("%q: %+v", tc.sql, res)
		}
	}
}

// FuzzParameterize checks that a template scans as its text did, token
// for token, but for a parameter $k in place of the k-th literal taken
// out, whose value is that literal (a string's without its quotes), typed
// as Postgres types it (a string untyped).
func FuzzParameterize(f *testing.F) {
	for _, s := range []string{
		"UPDATE t SET v = v + 5 WHERE id = 7",
		"DELETE FROM t WHERE x IN (1.5, .5, 5., 1e3, 2E-7, 007) -- 9",
		"INSERT INTO t VALUES (1, 'a''2', $$3$$, -4.0e+5, 99999999999999999999)",
		"update t set a=1;;",
		"INSERT.00",
		"UPDATE t SET v = E'\\'' || 'it''s' || U&'\\0041' || $a$ $ $b$ 1 $a$ || 2 /* 3 /* 4 */ 5 */ WHERE \"x\"\"1\" = 6",
		"UPDATE t SET a[1..2] = b[..3], c = 1e5, d = .5e-3 WHERE e = $1",
		"delete from t where x = 1; update t set y = 2",
		"UPDATE t SET v = 1 ORDER BY 1",
		"UPDATE t SET v = x'1F' || b'101' || n'x' WHERE y = 0x1F",
	} {
		f.Add(s)
	}
	for _, c := range lexCases {
		f.Add(c.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		// scanLiterals reads whatever it accepts as Postgres's scanner does.
		if fast, ok := scanLiterals(sql, nil); ok {
			if err := agreesWithPG(sql, fast); err != nil {
				t.Fatal(err)
			}
		}
		p, _ := Parameterize(sql)
		if p.SQL == "" {
			return
		}
		if len(p.Types) != len(p.Values) {
			t.Fatalf("%d types, %d values", len(p.Types), len(p.Values))
		}
		orig, err := pg_query.Scan(sql)
		if err != nil {
			t.Fatalf("%q was parameterized but does not scan: %v", sql, err)
		}
		tmpl, err := pg_query.Scan(p.SQL)
		if err != nil {
			t.Fatalf("template %q does not scan: %v", p.SQL, err)
		}
		if len(orig.Tokens) != len(tmpl.Tokens) {
			t.Fatalf("template %q has %d tokens, %q has %d", p.SQL, len(tmpl.Tokens), sql, len(orig.Tokens))
		}
		k := 0
		inTarget, seen := false, false // in the ON CONFLICT target, where literals stay
		for i, a := range orig.Tokens {
			b := tmpl.Tokens[i]
			at, bt := sql[a.Start:a.End], p.SQL[b.Start:b.End]
			switch {
			case a.Token == pg_query.Token_CONFLICT && !seen:
				inTarget, seen = true, true
			case a.Token == pg_query.Token_DO:
				inTarget = false
			}
			switch {
			case inTarget:
				if b.Token != a.Token || bt != at {
					t.Fatalf("template %q: %q in the ON CONFLICT target became %q", p.SQL, at, bt)
				}
			case a.Token == pg_query.Token_ICONST || a.Token == pg_query.Token_FCONST:
				k++
				if b.Token != pg_query.Token_PARAM || bt != "$"+strconv.Itoa(k) || p.Values[k-1] != at {
					t.Fatalf("template %q: literal %q became %q (value %q)", p.SQL, at, bt, p.Values[k-1])
				}
				if literalType(at) != p.Types[k-1] {
					t.Fatalf("%q typed %d", at, p.Types[k-1])
				}
			case a.Token == pg_query.Token_SCONST:
				if b.Token == a.Token && bt == at {
					break // it stays
				}
				k++
				value := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(at, "'"), "'"), "''", "'")
				if at[0] != '\'' || b.Token != pg_query.Token_PARAM || bt != "$"+strconv.Itoa(k) || p.Values[k-1] != value || p.Types[k-1] != 0 {
					t.Fatalf("template %q: string %q became %q (value %q, type %d)", p.SQL, at, bt, p.Values[k-1], p.Types[k-1])
				}
			default:
				if b.Token != a.Token || bt != at {
					t.Fatalf("template %q: token %q became %q", p.SQL, at, bt)
				}
			}
		}
		if k != len(p.Values) {
			t.Fatalf("%d literals, %d values", k, len(p.Values))
		}
	})
}

// scanLiterals reads the texts it accepts as pg_query's scanner does, and
// leaves the unusual to it.
func TestScanLiterals(t *testing.T) {
	for _, c := range lexCases {
		fast, ok := scanLiterals(c.sql, nil)
		if ok != c.handled {
			t.Errorf("scanLiterals(%q): ok = %v, want %v", c.sql, ok, c.handled)
			continue
		}
		if !ok {
			continue
		}
		if err := agreesWithPG(c.sql, fast); err != nil {
			t.Error(err)
		}
	}
}

// agreesWithPG reports how what scanLiterals read of sql differs from what
// pg_query's scanner reads, nil if it does not.
func agreesWithPG(sql string, fast lexed) error {
	pg, ok := scanLiteralsPG(sql)
	if !ok || fast.writes != pg.writes || fast.dml != pg.dml || fast.refuse != pg.refuse || !slices.Equal(fast.literals, pg.literals) {
		return fmt.Errorf("%q: scanLiterals %+v, pg_query %+v (scans: %v)", sql, fast, pg, ok)
	}
	return nil
}

// lexCases are texts for scanLiterals, and whether it reads them itself.
var lexCases = []struct {
	sql     string
	handled bool
}{
	{"UPDATE pgbench_accounts SET abalance = abalance + -1234 WHERE aid = 567890;", true},
	{"insert into t (a, b) values (1, 2.5), (.5, 1e3), (5., 2E-7) ;; -- 9", true},
	{"UPDATE t SET v = 'it''s 1' || E'2' || b'101' || x'1F' || N'3' || U&'4' || $$5$$ || $q$6 $$ 7$q$ WHERE id = 8", true},
	{`UPDATE "t 1" SET "v""2" = 3, U&"w" = 4 /* 5 /* 6 */ 7 */ WHERE a[1:2] = b[..3]::int[] AND c @-9`, true},
	{"UPDATE t SET v = 1 ORDER BY 1", true},
	{"UPDATE t SET v = $1 WHERE id = 2", true},
	{"UPDATE t SET v = 1; SELECT 2", true},
	{"MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", true},
	{"SELECT 1 FROM t\tWHERE x\r\n= 2\f", true},
	// Left to pg_query.
	{"UPDATE t SET v = 0x1F", false},
	{"UPDATE t SET v = 1_000", false},
	{"UPDATE t SET v = 1..2", false},
	{"UPDATE t SET v = 1e", false},
	{"UPDATE t SET v = 12abc", false},
	{"UPDATE t SET v = E'\\n'", false},
	{"UPDATE t SET v = 'unterminated", false},
	{"UPDATE t SET v = $$unterminated", false},
	{"UPDATE t SET v = 1 /* unterminated", false},
	{`UPDATE t SET "" = 1`, false},
	{"UPDATE t SET v = 1 \\ 2", false},
	{"UPDATE t SET v = 1\x00", false},
	{"UPDATE t SET v = $1x", false},
}

// Template takes strings out where a parameter means what they did, and
// falls back to numbers only where one does not.
func TestTemplate(t *testing.T) {
	r := mustNew(t, "fence.token", "t")
	for _, c := range []struct{ sql, want string }{
		{"UPDATE t SET a = 'x' WHERE id = 1", "UPDATE t SET a = $1 WHERE id = $2"},
		{"UPDATE t SET a = upper('x') WHERE id = 1", "UPDATE t SET a = upper('x') WHERE id = $1"},
		{"UPDATE t SET a = 'x', b = '5' WHERE id = 1", "UPDATE t SET a = $1, b = '5' WHERE id = $2"},
		// Only the strings where a parameter would not do stay.
		{"UPDATE t SET a = coalesce(a, 'x') || 'y', b = 'z' WHERE id = 1 AND c = upper('w')",
			"UPDATE t SET a = coalesce(a, 'x') || 'y', b = $1 WHERE id = $2 AND c = upper('w')"},
		{"UPDATE t SET d = DATE '2024-01-31', e = 'v' WHERE f = 'u'", "UPDATE t SET d = DATE '2024-01-31', e = $1 WHERE f = $2"},
		{"UPDATE u SET a = 'x' WHERE id = 1", ""}, // not fenced: sent as written
		{"UPDATE t SET a = 1 ORDER BY 1", ""},
	} {
		p, res, ok, err := r.Template(c.sql)
		if err != nil || ok != (c.want != "") || ok && (p.SQL != c.want || res == nil || !res.NoRows) {
			t.Errorf("%q: %q %v %v, want %q", c.sql, p.SQL, ok, err, c.want)
		}
	}
}
