"""pgfence compatibility checks for asyncpg (binary extended protocol,
named prepared statements for every query)."""
import asyncio
import io
import time

import asyncpg

from compat_check import PROXY_URL, TABLE, PLAIN, CHANNEL, check, expect, finish

print("driver asyncpg", asyncpg.__version__, flush=True)


async def connect(token=None):
    conn = await asyncpg.connect(PROXY_URL)
    if token is not None:
        await conn.execute("SELECT set_config('fence.token', $1, false)", str(token))
    return conn


def rows_affected(status):  # "UPDATE 1" -> 1
    return int(status.split()[-1])


@check("tx_commit")
async def _():
    conn = await connect(token=10)
    async with conn.transaction():
        await conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES ($1, $2)", 100, "committed")
    expect(await conn.fetchval(f"SELECT val FROM {TABLE} WHERE id = 100") == "committed", "row 100 missing")


@check("tx_rollback")
async def _():
    conn = await connect(token=10)
    tx = conn.transaction()
    await tx.start()
    await conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES ($1, $2)", 101, "rolled back")
    status = await conn.execute(f"UPDATE {TABLE} SET val = $1 WHERE id = $2", "rolled back", 3)
    expect(rows_affected(status) == 1, f"UPDATE row 3: {status}")
    await tx.rollback()
    rows = await conn.fetch(f"SELECT id, val FROM {TABLE} WHERE id IN (3, 101)")
    expect([tuple(r) for r in rows] == [(3, "init")], "rolled-back changes are visible")


@check("params")
async def _():
    conn = await connect(token=10)
    expect(tuple(await conn.fetchrow("SELECT $1::int + $2::int, $3::text", 1, 2, "x")) == (3, "x"), "wrong SELECT result")
    status = await conn.execute(f"UPDATE {TABLE} SET val = $1 WHERE id = $2", "param", 4)
    expect(rows_affected(status) == 1, f"UPDATE row 4: {status}")


@check("prepared_reuse")
async def _():
    conn = await connect(token=10)
    stmt = await conn.prepare(f"UPDATE {TABLE} SET n = n + 1 WHERE id = $1")
    for i in range(20):
        await stmt.fetch(2)
        expect(stmt.get_statusmsg() == "UPDATE 1", f"execution {i + 1}: {stmt.get_statusmsg()}")


@check("error_recovery")
async def _():
    conn = await connect()
    try:
        await conn.fetchval("SELECT 1/0")
        raise AssertionError("SELECT 1/0 did not fail")
    except asyncpg.DivisionByZeroError as e:
        expect(e.sqlstate == "22012", f"SQLSTATE {e.sqlstate}")
    expect(await conn.fetchval("SELECT 1") == 1, "SELECT 1 after the error")


@check("copy_in")
async def _():
    conn = await connect()
    status = await conn.copy_records_to_table(PLAIN, records=[(1, "a"), (2, "b"), (3, "c")], columns=["id", "val"])
    expect(status == "COPY 3", f"COPY reported {status}")


@check("copy_out")
async def _():
    conn, out = await connect(), io.BytesIO()
    await conn.copy_from_table(TABLE, columns=["id", "val"], output=out)
    expect(b"5\tinit\n" in out.getvalue(), f"unexpected COPY output {out.getvalue()!r}")


@check("listen_notify")
async def _():
    listener, got = await connect(), asyncio.Queue()
    await listener.add_listener(CHANNEL, lambda conn, pid, channel, payload: got.put_nowait((channel, payload)))
    await (await connect()).execute(f"NOTIFY {CHANNEL}, 'hello'")
    expect(await asyncio.wait_for(got.get(), 5) == (CHANNEL, "hello"), "wrong notification")


@check("cancel")
async def _():
    # asyncpg's cancel API is cancelling the awaiting task (here by its
    # timeout): it sends a CancelRequest and waits for the server to end the
    # query, swallowing the server's 57014. So the check is that the same
    # session answers again long before pg_sleep(30) could have finished.
    conn = await connect()
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    start = time.monotonic()
    try:
        await conn.fetchval("SELECT pg_sleep(30)", timeout=0.5)
        raise AssertionError("pg_sleep(30) was not cancelled")
    except asyncio.TimeoutError:
        pass
    expect(await conn.fetchval("SELECT pg_backend_pid()") == pid, "not the same session after the cancel")
    elapsed = time.monotonic() - start
    expect(elapsed < 10, f"the session was busy for {elapsed:.1f} s")


@check("fenced_write")
async def _():
    b, a = await connect(token=43), await connect(token=42)
    status = await b.execute(f"UPDATE {TABLE} SET val = $1 WHERE id = $2", "B", 1)
    expect(rows_affected(status) == 1, f"writer B (token 43): {status}, want UPDATE 1")
    status = await a.execute(f"UPDATE {TABLE} SET val = $1 WHERE id = $2", "A", 1)
    expect(rows_affected(status) == 0, f"writer A (token 42, stale): {status}, want UPDATE 0")
    expect(await a.fetchval(f"SELECT val FROM {TABLE} WHERE id = 1") == "B", "row 1 lost B's value")


@check("token_set")
async def _():
    # Plain SETs, as an application sets its lease's token; pgfence
    # answers them itself when the session is idle.
    conn = await connect()
    await conn.execute("SET fence.token = '11'")
    status = await conn.execute(f"INSERT INTO {TABLE} (id, val) VALUES (103, 'tokenset')")
    expect(rows_affected(status) == 1, f"INSERT with token 11: {status}")
    await conn.execute("SET fence.token = '9'")
    status = await conn.execute(f"UPDATE {TABLE} SET val = 'stale' WHERE id = 103")
    expect(rows_affected(status) == 0, f"UPDATE with the stale token 9: {status}, want UPDATE 0")
    await conn.execute("SET fence.token = '11'")
    status = await conn.execute(f"UPDATE {TABLE} SET n = n + 1 WHERE id = $1", 103)
    expect(rows_affected(status) == 1, f"UPDATE with token 11 again: {status}")


@check("token_set_local")
async def _():
    # SET LOCAL in each transaction; pgfence answers it itself in the
    # open block.
    conn = await connect()
    for token, sql, args, rows in (
        ("12", f"INSERT INTO {TABLE} (id, val) VALUES (104, 'tokenlocal')", (), 1),
        ("9", f"UPDATE {TABLE} SET val = 'stale' WHERE id = 104", (), 0),
        ("12", f"UPDATE {TABLE} SET n = n + 1 WHERE id = $1", (104,), 1),
    ):
        async with conn.transaction():
            await conn.execute(f"SET LOCAL fence.token = '{token}'")
            status = await conn.execute(sql, *args)
            expect(rows_affected(status) == rows, f"{sql} with token {token}: {status}, want {rows} rows")


finish()
