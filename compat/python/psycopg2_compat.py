"""pgfence compatibility checks for psycopg2 (client-side parameters,
simple query protocol)."""
import io
import select
import threading
import time

import psycopg2
import psycopg2.errors

from compat_check import PROXY_URL, TABLE, PLAIN, CHANNEL, check, expect, finish

print("driver psycopg2", psycopg2.__version__.split()[0], flush=True)


def connect(token=None, autocommit=True):
    conn = psycopg2.connect(PROXY_URL)
    conn.autocommit = autocommit
    if token is not None:
        conn.cursor().execute("SET fence.token = %s", (str(token),))
    return conn


@check("tx_commit")
def _():
    conn = connect(token=10, autocommit=False)
    with conn:  # commits
        conn.cursor().execute(f"INSERT INTO {TABLE} (id, val) VALUES (%s, %s)", (100, "committed"))
    cur = conn.cursor()
    cur.execute(f"SELECT val FROM {TABLE} WHERE id = 100")
    expect(cur.fetchone() == ("committed",), "row 100 missing after commit")


@check("tx_rollback")
def _():
    conn = connect(token=10, autocommit=False)
    cur = conn.cursor()
    cur.execute(f"INSERT INTO {TABLE} (id, val) VALUES (%s, %s)", (101, "rolled back"))
    cur.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("rolled back", 3))
    expect(cur.rowcount == 1, f"UPDATE row 3: {cur.rowcount} rows")
    conn.rollback()
    cur.execute(f"SELECT id, val FROM {TABLE} WHERE id IN (3, 101)")
    expect(cur.fetchall() == [(3, "init")], "rolled-back changes are visible")


@check("params")
def _():
    cur = connect(token=10).cursor()
    cur.execute("SELECT %s::int + %s::int, %s::text", (1, 2, "x"))
    expect(cur.fetchone() == (3, "x"), "wrong SELECT result")
    cur.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("param", 4))
    expect(cur.rowcount == 1, f"UPDATE row 4: {cur.rowcount} rows")


@check("prepared_reuse")
def _():
    # psycopg2 has no prepared-statement API of its own: SQL PREPARE/EXECUTE.
    cur = connect(token=10).cursor()
    cur.execute(f"PREPARE bump(int) AS UPDATE {TABLE} SET n = n + 1 WHERE id = $1")
    for i in range(20):
        cur.execute("EXECUTE bump(%s)", (2,))
        expect(cur.rowcount == 1, f"execution {i + 1}: {cur.rowcount} rows")


@check("error_recovery")
def _():
    conn = connect(autocommit=False)
    cur = conn.cursor()
    try:
        cur.execute("SELECT 1/0")
        raise AssertionError("SELECT 1/0 did not fail")
    except psycopg2.errors.DivisionByZero as e:
        expect(e.pgcode == "22012", f"SQLSTATE {e.pgcode}")
    conn.rollback()
    cur.execute("SELECT 1")
    expect(cur.fetchone() == (1,), "SELECT 1 after the error")


@check("copy_in")
def _():
    cur = connect().cursor()
    cur.copy_expert(f"COPY {PLAIN} (id, val) FROM STDIN", io.StringIO("1\ta\n2\tb\n3\tc\n"))
    expect(cur.rowcount == 3, f"COPY reported {cur.rowcount} rows")


@check("copy_out")
def _():
    out = io.StringIO()
    connect().cursor().copy_expert(f"COPY {TABLE} (id, val) TO STDOUT", out)
    expect("5\tinit\n" in out.getvalue(), f"unexpected COPY output {out.getvalue()!r}")


@check("listen_notify")
def _():
    listener = connect()
    listener.cursor().execute(f"LISTEN {CHANNEL}")
    connect().cursor().execute(f"NOTIFY {CHANNEL}, 'hello'")
    deadline = time.monotonic() + 5
    while not listener.notifies and time.monotonic() < deadline:
        select.select([listener], [], [], 0.5)
        listener.poll()
    expect(listener.notifies, "no notification within 5 s")
    note = listener.notifies[0]
    expect((note.channel, note.payload) == (CHANNEL, "hello"), f"got {note}")


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
        conn.cursor().execute("SELECT pg_sleep(30)")
        raise AssertionError("pg_sleep(30) was not cancelled")
    except psycopg2.errors.QueryCanceled as e:
        expect(e.pgcode == "57014", f"SQLSTATE {e.pgcode}")
    elapsed = time.monotonic() - start
    expect(elapsed < 10, f"cancelled after {elapsed:.1f} s")
    canceller.join()
    conn.cursor().execute("SELECT 1")


@check("fenced_write")
def _():
    b, a = connect(token=43).cursor(), connect(token=42).cursor()
    b.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("B", 1))
    expect(b.rowcount == 1, f"writer B (token 43): {b.rowcount} rows, want 1")
    a.execute(f"UPDATE {TABLE} SET val = %s WHERE id = %s", ("A", 1))
    expect(a.rowcount == 0, f"writer A (token 42, stale): {a.rowcount} rows, want 0")
    a.execute(f"SELECT val FROM {TABLE} WHERE id = 1")
    expect(a.fetchone() == ("B",), "row 1 lost B's value")


@check("token_set")
def _():
    # Plain SETs, as an application sets its lease's token; pgfence
    # answers them itself when the session is idle.
    cur = connect().cursor()
    cur.execute("SET fence.token = '11'")
    cur.execute(f"INSERT INTO {TABLE} (id, val) VALUES (103, 'tokenset')")
    expect(cur.rowcount == 1, f"INSERT with token 11: {cur.rowcount} rows")
    cur.execute("SET fence.token = '9'")
    cur.execute(f"UPDATE {TABLE} SET val = 'stale' WHERE id = 103")
    expect(cur.rowcount == 0, f"UPDATE with the stale token 9: {cur.rowcount} rows, want 0")
    cur.execute("SET fence.token = '11'")
    cur.execute(f"UPDATE {TABLE} SET n = n + 1 WHERE id = 103")
    expect(cur.rowcount == 1, f"UPDATE with token 11 again: {cur.rowcount} rows")


@check("token_set_local")
def _():
    # SET LOCAL in each transaction (psycopg2 opens one before the first
    # statement); pgfence answers it itself in the open block.
    conn = connect(autocommit=False)
    cur = conn.cursor()
    for token, sql, rows in (
        ("12", f"INSERT INTO {TABLE} (id, val) VALUES (104, 'tokenlocal')", 1),
        ("9", f"UPDATE {TABLE} SET val = 'stale' WHERE id = 104", 0),
        ("12", f"UPDATE {TABLE} SET n = n + 1 WHERE id = 104", 1),
    ):
        cur.execute(f"SET LOCAL fence.token = '{token}'")
        cur.execute(sql)
        expect(cur.rowcount == rows, f"{sql} with token {token}: {cur.rowcount} rows, want {rows}")
        conn.commit()


finish()
