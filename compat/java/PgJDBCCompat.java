// pgfence compatibility checks for pgJDBC: extended protocol, unnamed
// statements that become server-prepared after prepareThreshold (5)
// executions, batches (pipelined Bind/Execute), CopyManager, cancel().
// Prints "ok NAME" or "FAIL NAME: why" per check; exits 1 if any failed.

import java.io.StringReader;
import java.io.StringWriter;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.PGStatement;
import org.postgresql.util.DriverInfo;

public class PgJDBCCompat {
    static final String URL = "jdbc:postgresql://" + System.getenv("COMPAT_PROXY_HOST") + ":" + System.getenv("COMPAT_PROXY_PORT")
            + "/" + System.getenv("COMPAT_DB") + "?user=" + System.getenv("COMPAT_USER") + "&" + System.getenv("COMPAT_PROXY_SSL");
    static final String T = System.getenv("COMPAT_TABLE"); // guarded: id, val, n, fence_epoch; rows 1..10 'init'
    static final String PLAIN = System.getenv("COMPAT_PLAIN_TABLE");
    static final String CHANNEL = System.getenv("COMPAT_CHANNEL");
    static final List<String> failed = new ArrayList<>();

    interface Check { void run() throws Exception; }

    static void check(String name, Check c) {
        String only = System.getenv("COMPAT_ONLY"); // the checks to run, comma-separated
        if (only != null && !only.isEmpty() && !java.util.Arrays.asList(only.split(",")).contains(name)) {
            return;
        }
        try {
            c.run();
            System.out.println("ok " + name);
        } catch (Throwable e) {
            failed.add(name);
            System.out.println("FAIL " + name + ": " + e);
            e.printStackTrace();
        }
    }

    static void expect(boolean cond, String what) {
        if (!cond) throw new AssertionError(what);
    }

    static Connection connect(Integer token) throws SQLException {
        Connection c = DriverManager.getConnection(URL);
        if (token != null) {
            try (PreparedStatement ps = c.prepareStatement("SELECT set_config('fence.token', ?, false)")) {
                ps.setString(1, token.toString());
                ps.execute();
            }
        }
        return c;
    }

    static int update(Connection c, String sql, Object... args) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) ps.setObject(i + 1, args[i]);
            return ps.executeUpdate();
        }
    }

    static String queryString(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            return rs.next() ? rs.getString(1) : null;
        }
    }

    public static void main(String[] args) throws Exception {
        System.out.println("driver pgJDBC " + DriverInfo.DRIVER_VERSION);

        check("tx_commit", () -> {
            try (Connection c = connect(10)) {
                c.setAutoCommit(false);
                update(c, "INSERT INTO " + T + " (id, val) VALUES (?, ?)", 100, "committed");
                c.commit();
                expect("committed".equals(queryString(c, "SELECT val FROM " + T + " WHERE id = 100")), "row 100 missing after commit");
            }
        });

        check("tx_rollback", () -> {
            try (Connection c = connect(10)) {
                c.setAutoCommit(false);
                update(c, "INSERT INTO " + T + " (id, val) VALUES (?, ?)", 101, "rolled back");
                int n = update(c, "UPDATE " + T + " SET val = ? WHERE id = ?", "rolled back", 3);
                expect(n == 1, "UPDATE row 3: " + n + " rows");
                c.rollback();
                expect("3:init".equals(queryString(c, "SELECT string_agg(id || ':' || val, ',') FROM " + T + " WHERE id IN (3, 101)")),
                        "rolled-back changes are visible");
            }
        });

        check("params", () -> {
            try (Connection c = connect(10);
                 PreparedStatement ps = c.prepareStatement("SELECT ?::int + ?::int, ?::text")) {
                ps.setInt(1, 1);
                ps.setInt(2, 2);
                ps.setString(3, "x");
                try (ResultSet rs = ps.executeQuery()) {
                    expect(rs.next() && rs.getInt(1) == 3 && "x".equals(rs.getString(2)), "wrong SELECT result");
                }
                int n = update(c, "UPDATE " + T + " SET val = ? WHERE id = ?", "param", 4);
                expect(n == 1, "UPDATE row 4: " + n + " rows");
            }
        });

        check("prepared_reuse", () -> {
            try (Connection c = connect(10);
                 PreparedStatement ps = c.prepareStatement("UPDATE " + T + " SET n = n + 1 WHERE id = ?")) {
                for (int i = 1; i <= 20; i++) {
                    ps.setInt(1, 2);
                    int n = ps.executeUpdate();
                    expect(n == 1, "execution " + i + ": " + n + " rows");
                }
            }
        });

        check("server_prepared", () -> {
            // Past prepareThreshold the statement is a named server-side one;
            // a stale execution of it must still be fenced.
            try (Connection c = connect(10); Connection b = connect(43);
                 PreparedStatement ps = c.prepareStatement("UPDATE " + T + " SET n = n + 1 WHERE id = ?")) {
                for (int i = 1; i <= 10; i++) {
                    ps.setInt(1, 7);
                    expect(ps.executeUpdate() == 1, "execution " + i + " did not update row 7");
                }
                expect(ps.unwrap(PGStatement.class).isUseServerPrepare(), "not server-prepared after 10 executions");
                expect(update(b, "UPDATE " + T + " SET val = ? WHERE id = ?", "B", 7) == 1, "writer B (token 43) did not update row 7");
                ps.setInt(1, 7);
                int n = ps.executeUpdate();
                expect(n == 0, "stale execution (token 10): " + n + " rows, want 0");
            }
        });

        check("batch", () -> {
            try (Connection c = connect(10); Connection b = connect(43);
                 PreparedStatement ps = c.prepareStatement("UPDATE " + T + " SET val = ? WHERE id = ?")) {
                for (int id : new int[] {8, 9, 10}) {
                    ps.setString(1, "batch");
                    ps.setInt(2, id);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                expect(Arrays.equals(counts, new int[] {1, 1, 1}), "first batch: " + Arrays.toString(counts) + ", want [1, 1, 1]");
                expect(update(b, "UPDATE " + T + " SET val = ? WHERE id = ?", "B", 9) == 1, "writer B (token 43) did not update row 9");
                for (int id : new int[] {8, 9, 10}) {
                    ps.setString(1, "batch2");
                    ps.setInt(2, id);
                    ps.addBatch();
                }
                counts = ps.executeBatch();
                expect(Arrays.equals(counts, new int[] {1, 0, 1}), "stale batch: " + Arrays.toString(counts) + ", want [1, 0, 1]");
            }
        });

        check("hold_batch", () -> {
            // DDL, SET client_encoding and guarded writes in one Statement
            // batch, which pgJDBC pipelines with one Sync: pgfence holds
            // the statement after the DDL until Postgres has answered it
            // (see compat/hold_test.go). socketTimeout turns a deadlock
            // into an error after 15 s.
            try (Connection c = DriverManager.getConnection(URL + "&socketTimeout=15")) {
                try (PreparedStatement ps = c.prepareStatement("SELECT set_config('fence.token', '10', false)")) {
                    ps.execute();
                }
                try (Statement st = c.createStatement()) {
                    st.addBatch("CREATE TABLE " + T + "_ddl (id bigint)");
                    st.addBatch("INSERT INTO " + T + " (id, val) VALUES (105, 'hold')");
                    st.addBatch("DROP TABLE " + T + "_ddl");
                    st.addBatch("SET client_encoding = 'UTF8'");
                    st.addBatch("UPDATE " + T + " SET val = 'hold', n = n + 1 WHERE id = 5");
                    int[] counts = st.executeBatch();
                    expect(Arrays.equals(counts, new int[] {0, 1, 0, 0, 1}), "batch: " + Arrays.toString(counts) + ", want [0, 1, 0, 0, 1]");
                }
            }
        });

        check("error_recovery", () -> {
            try (Connection c = connect(null)) {
                try {
                    queryString(c, "SELECT 1/0");
                    throw new AssertionError("SELECT 1/0 did not fail");
                } catch (SQLException e) {
                    expect("22012".equals(e.getSQLState()), "SQLSTATE " + e.getSQLState());
                }
                expect("1".equals(queryString(c, "SELECT 1")), "SELECT 1 after the error");
            }
        });

        check("copy_in", () -> {
            try (Connection c = connect(null)) {
                long n = c.unwrap(PGConnection.class).getCopyAPI()
                        .copyIn("COPY " + PLAIN + " (id, val) FROM STDIN", new StringReader("1\ta\n2\tb\n3\tc\n"));
                expect(n == 3, "COPY reported " + n + " rows");
            }
        });

        check("copy_out", () -> {
            try (Connection c = connect(null)) {
                StringWriter out = new StringWriter();
                c.unwrap(PGConnection.class).getCopyAPI().copyOut("COPY " + T + " (id, val) TO STDOUT", out);
                expect(out.toString().contains("5\tinit\n"), "unexpected COPY output " + out);
            }
        });

        check("listen_notify", () -> {
            try (Connection listener = connect(null); Connection notifier = connect(null)) {
                try (Statement st = listener.createStatement()) {
                    st.execute("LISTEN " + CHANNEL);
                }
                try (PreparedStatement ps = notifier.prepareStatement("SELECT pg_notify(?, ?)")) {
                    ps.setString(1, CHANNEL);
                    ps.setString(2, "hello");
                    ps.execute();
                }
                PGNotification[] got = listener.unwrap(PGConnection.class).getNotifications(5000);
                expect(got != null && got.length == 1, "no notification within 5 s");
                expect(CHANNEL.equals(got[0].getName()) && "hello".equals(got[0].getParameter()), "got " + got[0].getName() + " " + got[0].getParameter());
            }
        });

        check("cancel", () -> {
            try (Connection c = connect(null); Statement st = c.createStatement()) {
                Thread canceller = new Thread(() -> {
                    try {
                        Thread.sleep(500);
                        st.cancel();
                    } catch (Exception e) {
                        e.printStackTrace();
                    }
                });
                long start = System.nanoTime();
                canceller.start();
                try {
                    st.execute("SELECT pg_sleep(30)");
                    throw new AssertionError("pg_sleep(30) was not cancelled");
                } catch (SQLException e) {
                    expect("57014".equals(e.getSQLState()), "SQLSTATE " + e.getSQLState() + ": " + e.getMessage());
                }
                double elapsed = (System.nanoTime() - start) / 1e9;
                expect(elapsed < 10, "cancelled after " + elapsed + " s");
                canceller.join();
                expect("1".equals(queryString(c, "SELECT 1")), "SELECT 1 after the cancel");
            }
        });

        check("fenced_write", () -> {
            try (Connection b = connect(43); Connection a = connect(42)) {
                int n = update(b, "UPDATE " + T + " SET val = ? WHERE id = ?", "B", 1);
                expect(n == 1, "writer B (token 43): " + n + " rows, want 1");
                n = update(a, "UPDATE " + T + " SET val = ? WHERE id = ?", "A", 1);
                expect(n == 0, "writer A (token 42, stale): " + n + " rows, want 0");
                expect("B".equals(queryString(a, "SELECT val FROM " + T + " WHERE id = 1")), "row 1 lost B's value");
            }
        });

        check("token_set", () -> {
            // Plain SETs, as an application sets its lease's token: pgJDBC
            // sends each as a Parse of the unnamed statement (a text seen
            // fewer than prepareThreshold times), which pgfence answers
            // itself when the session is idle.
            try (Connection c = connect(null); Statement st = c.createStatement()) {
                st.execute("SET fence.token = '11'");
                int n = st.executeUpdate("INSERT INTO " + T + " (id, val) VALUES (103, 'tokenset')");
                expect(n == 1, "INSERT with token 11: " + n + " rows");
                st.execute("SET fence.token = '9'");
                n = st.executeUpdate("UPDATE " + T + " SET val = 'stale' WHERE id = 103");
                expect(n == 0, "UPDATE with the stale token 9: " + n + " rows, want 0");
                st.execute("SET fence.token = '11'");
                n = update(c, "UPDATE " + T + " SET n = n + 1 WHERE id = ?", 103);
                expect(n == 1, "UPDATE with token 11 again: " + n + " rows");
            }
        });

        check("token_set_local", () -> {
            // SET LOCAL in each transaction. pgJDBC sends a transaction's
            // BEGIN in one batch with its first statement, here the SET,
            // so Postgres answers it, not pgfence.
            try (Connection c = connect(null); Statement st = c.createStatement()) {
                c.setAutoCommit(false);
                st.execute("SET LOCAL fence.token = '12'");
                int n = st.executeUpdate("INSERT INTO " + T + " (id, val) VALUES (104, 'tokenlocal')");
                expect(n == 1, "INSERT with token 12: " + n + " rows");
                c.commit();
                st.execute("SET LOCAL fence.token = '9'");
                n = st.executeUpdate("UPDATE " + T + " SET val = 'stale' WHERE id = 104");
                expect(n == 0, "UPDATE with the stale token 9: " + n + " rows, want 0");
                c.commit();
                st.execute("SET LOCAL fence.token = '12'");
                n = update(c, "UPDATE " + T + " SET n = n + 1 WHERE id = ?", 104);
                expect(n == 1, "UPDATE with token 12 again: " + n + " rows");
                c.commit();
            }
        });

        System.exit(failed.isEmpty() ? 0 : 1);
    }
}
