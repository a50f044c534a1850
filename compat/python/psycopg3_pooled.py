"""pgfence behind a transaction pooler (--upstream-pooling=transaction,
PgBouncer with pool_mode = transaction and one server connection) with
psycopg 3: no server-side prepared statements (prepare_threshold=None, as
PgBouncer 1.18 needs), tokens set with a plain SET or SET LOCAL."""
import psycopg
import psycopg.errors

from compat_check import PROXY_URL, TABLE, check, expect, finish

print("driver psycopg", psycopg.__version__, "libpq", psycopg.pq.version(), flush=True)


def connect(token=None):
    conn = psycopg.connect(PROXY_URL, autocommit=True, prepare_threshold=None)
    if token is not None:
        conn.execute(f"SET fence.token = '{token}'")
    return conn


def epoch(conn, row):
    return conn.execute(f"SELECT fence_epoch FROM {TABLE} WHERE id = %s", (row,)).fetchone()[0]


@check("pooled_interleaved")
def _():
    # Two clients, one server connection: each write carries its own
    # client's token, never the other's.
    a, b = connect(token=30), connect(token=25)
    for i in range(5):
        cur = a.execute(f"UPDATE {TABLE} SET val = %s WHERE id = 1", (f"a{i}",))
        expect(cur.rowcount == 1, f"A (token 30), round {i}: {cur.rowcount} rows")
        expect(epoch(a, 1) == 30, f"A's write stamped {epoch(a, 1)}, want 30")
        cur = b.execute(f"UPDATE {TABLE} SET val = %s WHERE id = 1", (f"b{i}",))
        expect(cur.rowcount == 0, f"B (stale token 25), round {i}: {cur.rowcount} rows")
        cur = b.execute(f"UPDATE {TABLE} SET val = %s WHERE id = 2", (f"b{i}",))
        expect(cur.rowcount == 1 and epoch(b, 2) == 25, f"B's own row: {cur.rowcount} rows, epoch {epoch(b, 2)}")


@check("pooled_set_local")
def _():
    conn = connect(token=30)
    with conn.transaction():
        conn.execute("SET LOCAL fence.token = '40'")
        cur = conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = 3", ("local",))
        expect(cur.rowcount == 1, f"UPDATE in the block: {cur.rowcount} rows")
    expect(epoch(conn, 3) == 40, f"row 3 stamped {epoch(conn, 3)}, want 40")
    cur = conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = 3", ("session",))
    expect(cur.rowcount == 0, f"after the block the session's token 30 is stale on row 3: {cur.rowcount} rows")


@check("pooled_no_token")
def _():
    conn = connect()
    try:
        conn.execute(f"UPDATE {TABLE} SET val = %s WHERE id = 4", ("none",))
    except psycopg.errors.ObjectNotInPrerequisiteState:
        pass
    else:
        raise AssertionError("a write without a token went through")
    row = conn.execute(f"SELECT val, fence_epoch FROM {TABLE} WHERE id = 4").fetchone()
    expect(row == ("init", 0), f"row 4 is {row}")


finish()
