"""pgfence compatibility checks for psycopg 3 (server-side parameters,
extended query protocol, automatic prepared statements, pipeline mode)."""
import os
import select
import threading
import time

import psycopg
import psycopg.errors

from compat_check import PROXY_URL, TABLE, PLAIN, CHANNEL, check, expect, finish

print("driver psycopg", psycopg.__version__, "libpq", psycopg.pq.version(), flush=True)


def connect(token=None, autocommit=True):
    conn = psycopg.connect(PROXY_URL, autocommit=autocommit)
    if token is not None:
        conn.execute("SELECT set_config('fence.token', %s, false)", (str(token),))
    return conn


@check("tx_commit")
def _():
    conn = connect(token=10)
    with conn.transaction():
        conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES (%s, %s)", (100, "committed"))
    row = conn.execute(f"SELECT val FROM {TABLE} WHERE id = 100").fetchone()
    expect(row == ("committed",), "row 100 missing after commit")


@check("tx_rollback")
def _():
    conn = connect(token=10)
    try:
        with conn.transaction():
            conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES (%s, %s)", (101, "rolled back"))
            cur = conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("rolled back", 3))
            expect(cur.rowcount == 1, f"UPDATE row 3: {cur.rowcount} rows")
            raise psycopg.Rollback()
    finally:
        rows = conn.execute(f"SELECT id, val FROM {TABLE} WHERE id IN (3, 101)").fetchall()
    expect(rows == [(3, "init")], "rolled-back changes are visible")


@check("params")
def _():
    conn = connect(token=10)
    expect(conn.execute("SELECT %s::int + %s::int, %s::text", (1, 2, "x")).fetchone() == (3, "x"), "wrong SELECT result")
    cur = conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("param", 4))
    expect(cur.rowcount == 1, f"UPDATE row 4: {cur.rowcount} rows")


@check("prepared_reuse")
def _():
    # psycopg prepares a query on the server after prepare_threshold (5)
    # executions; prepare=True does it from the first.
    conn = connect(token=10)
    for i in range(20):
        cur = conn.execute(f"UPDATE {TABLE} SET n = n + 1 WHERE id = %s", (2,), prepare=i % 2 == 0 or None)
        expect(cur.rowcount == 1, f"execution {i + 1}: {cur.rowcount} rows")


@check("error_recovery")
def _():
    conn = connect(autocommit=False)
    try:
        conn.execute("SELECT 1/0")
        raise AssertionError("SELECT 1/0 did not fail")
    except psycopg.errors.DivisionByZero as e:
        expect(e.sqlstate == "22012", f"SQLSTATE {e.sqlstate}")
    conn.rollback()
    expect(conn.execute("SELECT 1").fetchone() == (1,), "SELECT 1 after the error")


@check("copy_in")
def _():
    cur = connect().cursor()
    with cur.copy(f"COPY {PLAIN} (id, val) FROM STDIN") as copy:
        for row in [(1, "a"), (2, "b"), (3, "c")]:
            copy.write_row(row)
    expect(cur.rowcount == 3, f"COPY reported {cur.rowcount} rows")


@check("copy_out")
def _():
    cur = connect().cursor()
    with cur.copy(f"COPY {TABLE} (id, val) TO STDOUT") as copy:
        rows = list(copy.rows())
    expect(("5", "init") in rows, f"unexpected COPY output {rows!r}")


@check("listen_notify")
def _():
    listener, got = connect(), []
    listener.add_notify_handler(got.append)
    listener.execute(f"LISTEN {CHANNEL}")
    connect().execute("SELECT pg_notify(%s, %s)", (CHANNEL, "hello"))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        select.select([listener.fileno()], [], [], 0.5)
        listener.execute("SELECT 1")  # notifications are read with the next result
    expect(got, "no notification within 5 s")
    expect((got[0].channel, got[0].payload) == (CHANNEL, "hello"), f"got {got[0]}")


@check("cancel")
def _():
    conn = connect()
    # conn.cancel() returns once Postgres has closed the cancel connection;
    # joining it before the next statement keeps Postgres's second SIGINT
    # for the same request (pid, then process group) off that statement.
    canceller = threading.Timer(0.5, conn.cancel)
    canceller.start()
    start = time.monotonic()
    try:
        conn.execute("SELECT pg_sleep(%s)", (30,))
        raise AssertionError("pg_sleep(30) was not cancelled")
    except psycopg.errors.QueryCanceled as e:
        expect(e.sqlstate == "57014", f"SQLSTATE {e.sqlstate}")
    elapsed = time.monotonic() - start
    expect(elapsed < 10, f"cancelled after {elapsed:.1f} s")
    canceller.join()
    conn.execute("SELECT 1")


@check("fenced_write")
def _():
    b, a = connect(token=43), connect(token=42)
    cur = b.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("B", 1))
    expect(cur.rowcount == 1, f"writer B (token 43): {cur.rowcount} rows, want 1")
    cur = a.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("A", 1))
    expect(cur.rowcount == 0, f"writer A (token 42, stale): {cur.rowcount} rows, want 0")
    expect(a.execute(f"SELECT val FROM {TABLE} WHERE id = 1").fetchone() == ("B",), "row 1 lost B's value")


@check("pipeline")
def _():
    connect(token=43).execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("B", 7))
    conn = connect(token=10)
    with conn.pipeline():
        c6 = conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("pipeline", 6))
        c7 = conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("pipeline", 7))  # stale: B wrote it
        c102 = conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES (%s, %s)", (102, "pipeline"))
        sel = conn.execute(f"SELECT val FROM {TABLE} WHERE id = %s", (6,))
    expect([c6.rowcount, c7.rowcount, c102.rowcount] == [1, 0, 1],
           f"rows affected {[c6.rowcount, c7.rowcount, c102.rowcount]}, want [1, 0, 1]")
    expect(sel.fetchone() == ("pipeline",), "SELECT in the pipeline")


@check("hold_batch")
def _():
    # DDL, SET client_encoding and guarded writes in one pipeline, which
    # psycopg sends before its Sync: pgfence holds the statement after
    # the DDL until Postgres has answered it (see compat/hold_test.go).
    # A hold that deadlocks would block here for ever: run the pipeline in
    # a thread and give up after 15 s.
    result = {}

    def run():
        try:
            conn = connect(token=10)
            with conn.pipeline():
                conn.execute(f"CREATE TABLE {TABLE}_ddl (id bigint)")
                ins = conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES (%s, %s)", (105, "hold"))
                conn.execute(f"DROP TABLE {TABLE}_ddl")
                conn.execute("SET client_encoding = 'UTF8'")
                upd = conn.execute(f"UPDATE {TABLE} SET val = %s, n = n + 1 WHERE id = %s", ("hold", 5))
            result["counts"] = [ins.rowcount, upd.rowcount]
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported by the check
            result["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(15)
    if th.is_alive():
        print("FAIL hold_batch: the pipeline did not complete within 15 s", flush=True)
        os._exit(1)
    if "error" in result:
        raise result["error"]
    expect(result["counts"] == [1, 1], f"rows affected {result['counts']}, want [1, 1]")


@check("token_set")
def _():
    # Plain SETs, as an application sets its lease's token; psycopg sends
    # each as a Parse of the unnamed statement, which pgfence answers
    # itself when the session is idle.
    conn = connect()
    expect(conn.execute(f"SET fence.token = '11'").statusmessage == "SET", "SET")
    cur = conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES (103, 'tokenset')")
    expect(cur.rowcount == 1, f"INSERT with token 11: {cur.rowcount} rows")
    conn.execute("SET fence.token = '9'")
    cur = conn.execute(f"UPDATE {TABLE} SET val = 'stale' WHERE id = 103")
    expect(cur.rowcount == 0, f"UPDATE with the stale token 9: {cur.rowcount} rows, want 0")
    conn.execute("SET fence.token = '11'")
    cur = conn.execute(f"UPDATE {TABLE} SET n = n + 1 WHERE id = 103")
    expect(cur.rowcount == 1, f"UPDATE with token 11 again: {cur.rowcount} rows")


@check("token_set_local")
def _():
    # SET LOCAL in each transaction; pgfence answers it itself in the
    # open block.
    conn = connect()
    for token, sql, rows in (
        ("12", f"INSERT INTO {TABLE} (id, val) VALUES (104, 'tokenlocal')", 1),
        ("9", f"UPDATE {TABLE} SET val = 'stale' WHERE id = 104", 0),
        ("12", f"UPDATE {TABLE} SET n = n + 1 WHERE id = 104", 1),
    ):
        with conn.transaction():
            conn.execute(f"SET LOCAL fence.token = '{token}'")
            cur = conn.execute(sql)
            expect(cur.rowcount == rows, f"{sql} with token {token}: {cur.rowcount} rows, want {rows}")


finish()
