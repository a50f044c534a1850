// pgfence compatibility checks for node-postgres (pg): extended protocol
// for queries with parameters, named prepared statements, pg-copy-streams.
'use strict'

const pg = require('pg')
const { from: copyFrom, to: copyTo } = require('pg-copy-streams')
const { pipeline } = require('node:stream/promises')
const { Readable, Writable } = require('node:stream')
const { env, check, expect, finish } = require('./check')
const T = env.table

console.log('driver pg', require('pg/package.json').version)

const clients = []
const clientErrors = [] // 'error' events of clients: none are expected
async function connect(token) {
  const client = new pg.Client({ connectionString: env.proxyUrl })
  clients.push(client)
  client.on('error', (e) => clientErrors.push(e))
  await client.connect()
  if (token !== undefined) await client.query("SELECT set_config('fence.token', $1, false)", [String(token)])
  return client
}

async function main() {
  await check('tx_commit', async () => {
    const c = await connect(10)
    await c.query('BEGIN')
    await c.query(`INSERT INTO ${T} (id, val) VALUES ($1, $2)`, [100, 'committed'])
    await c.query('COMMIT')
    const r = await c.query(`SELECT val FROM ${T} WHERE id = 100`)
    expect(r.rows.length === 1 && r.rows[0].val === 'committed', 'row 100 missing after commit')
  })

  await check('tx_rollback', async () => {
    const c = await connect(10)
    await c.query('BEGIN')
    await c.query(`INSERT INTO ${T} (id, val) VALUES ($1, $2)`, [101, 'rolled back'])
    const u = await c.query(`UPDATE ${T} SET val = $1 WHERE id = $2`, ['rolled back', 3])
    expect(u.rowCount === 1, `UPDATE row 3: ${u.rowCount} rows`)
    await c.query('ROLLBACK')
    const r = await c.query(`SELECT id, val FROM ${T} WHERE id IN (3, 101)`)
    expect(JSON.stringify(r.rows) === '[{"id":3,"val":"init"}]', `rolled-back changes are visible: ${JSON.stringify(r.rows)}`)
  })

  await check('params', async () => {
    const c = await connect(10)
    const r = await c.query('SELECT $1::int + $2::int AS sum, $3::text AS s', [1, 2, 'x'])
    expect(r.rows[0].sum === 3 && r.rows[0].s === 'x', 'wrong SELECT result')
    const u = await c.query(`UPDATE ${T} SET val = $1 WHERE id = $2`, ['param', 4])
    expect(u.rowCount === 1, `UPDATE row 4: ${u.rowCount} rows`)
  })

  await check('prepared_reuse', async () => {
    // A named query is parsed once per connection, then only bound and executed.
    const c = await connect(10)
    for (let i = 1; i <= 20; i++) {
      const r = await c.query({ name: 'bump', text: `UPDATE ${T} SET n = n + 1 WHERE id = $1`, values: [2] })
      expect(r.rowCount === 1, `execution ${i}: ${r.rowCount} rows`)
    }
  })

  await check('error_recovery', async () => {
    const c = await connect()
    const err = await c.query('SELECT 1/0').then(() => null, (e) => e)
    expect(err && err.code === '22012', `SELECT 1/0: ${err && err.code}, want 22012`)
    expect((await c.query('SELECT 1 AS one')).rows[0].one === 1, 'SELECT 1 after the error')
  })

  await check('copy_in', async () => {
    const c = await connect()
    const stream = c.query(copyFrom(`COPY ${env.plain} (id, val) FROM STDIN`))
    await pipeline(Readable.from(['1\ta\n', '2\tb\n', '3\tc\n']), stream)
    expect(stream.rowCount === 3, `COPY reported ${stream.rowCount} rows`)
  })

  await check('copy_out', async () => {
    const c = await connect()
    let out = ''
    await pipeline(c.query(copyTo(`COPY ${T} (id, val) TO STDOUT`)), new Writable({
      write(chunk, _enc, done) { out += chunk; done() },
    }))
    expect(out.includes('5\tinit\n'), `unexpected COPY output ${JSON.stringify(out)}`)
  })

  await check('listen_notify', async () => {
    const listener = await connect()
    const got = new Promise((resolve, reject) => {
      listener.on('notification', resolve)
      setTimeout(() => reject(new Error('no notification within 5 s')), 5000).unref()
    })
    await listener.query(`LISTEN ${env.channel}`)
    await (await connect()).query('SELECT pg_notify($1, $2)', [env.channel, 'hello'])
    const n = await got
    expect(n.channel === env.channel && n.payload === 'hello', `got ${JSON.stringify(n)}`)
  })

  await check('cancel', async () => {
    // pg's cancel API: Client#cancel(client, query) opens a new connection
    // and sends a CancelRequest with the client's backend key.
    const c = await connect()
    const query = new pg.Query('SELECT pg_sleep(30)')
    const done = new Promise((resolve) => {
      query.on('error', resolve)
      query.on('end', () => resolve(null))
    })
    const start = Date.now()
    c.query(query)
    // Postgres signals the backend twice for one CancelRequest (pid, then
    // process group); the cancel connection closes after both, so the next
    // statement waits for that close.
    const sent = new Promise((resolve) => setTimeout(() => {
      const canceller = new pg.Client({ connectionString: env.proxyUrl })
      canceller.connection.once('end', resolve)
      canceller.cancel(c, query)
    }, 500))
    const err = await done
    const elapsed = (Date.now() - start) / 1000
    expect(err && err.code === '57014', `pg_sleep(30): ${err ? err.code + ' ' + err.message : 'not cancelled'}`)
    expect(elapsed < 10, `cancelled after ${elapsed} s`)
    await sent
    expect((await c.query('SELECT 1 AS one')).rows[0].one === 1, 'SELECT 1 after the cancel')
  })

  await check('fenced_write', async () => {
    const b = await connect(43)
    const a = await connect(42)
    const rb = await b.query(`UPDATE ${T} SET val = $1 WHERE id = $2`, ['B', 1])
    expect(rb.rowCount === 1, `writer B (token 43): ${rb.rowCount} rows, want 1`)
    const ra = await a.query(`UPDATE ${T} SET val = $1 WHERE id = $2`, ['A', 1])
    expect(ra.rowCount === 0, `writer A (token 42, stale): ${ra.rowCount} rows, want 0`)
    const r = await a.query(`SELECT val FROM ${T} WHERE id = 1`)
    expect(r.rows[0].val === 'B', "row 1 lost B's value")
  })

  await check('token_set', async () => {
    // Plain SETs, as an application sets its lease's token; pgfence
    // answers them itself when the session is idle.
    const c = await connect()
    await c.query("SET fence.token = '11'")
    const i = await c.query(`INSERT INTO ${T} (id, val) VALUES (103, 'tokenset')`)
    expect(i.rowCount === 1, `INSERT with token 11: ${i.rowCount} rows`)
    await c.query("SET fence.token = '9'")
    const s = await c.query(`UPDATE ${T} SET val = 'stale' WHERE id = 103`)
    expect(s.rowCount === 0, `UPDATE with the stale token 9: ${s.rowCount} rows, want 0`)
    await c.query("SET fence.token = '11'")
    const u = await c.query(`UPDATE ${T} SET n = n + 1 WHERE id = $1`, [103])
    expect(u.rowCount === 1, `UPDATE with token 11 again: ${u.rowCount} rows`)
  })

  await check('token_set_local', async () => {
    // SET LOCAL in each transaction; pgfence answers it itself in the
    // open block.
    const c = await connect()
    for (const [token, text, args, rows] of [
      ['12', `INSERT INTO ${T} (id, val) VALUES (104, 'tokenlocal')`, [], 1],
      ['9', `UPDATE ${T} SET val = 'stale' WHERE id = 104`, [], 0],
      ['12', `UPDATE ${T} SET n = n + 1 WHERE id = $1`, [104], 1],
    ]) {
      await c.query('BEGIN')
      await c.query(`SET LOCAL fence.token = '${token}'`)
      const r = await c.query(text, args)
      expect(r.rowCount === rows, `${text} with token ${token}: ${r.rowCount} rows, want ${rows}`)
      await c.query('COMMIT')
    }
  })

  await check('clean_close', async () => {
    // Client#end() sends Terminate; nothing may come back but the close.
    const ends = await Promise.allSettled(clients.map((c) => c.end()))
    await new Promise((resolve) => setTimeout(resolve, 100))
    const bad = ends.filter((r) => r.status === 'rejected').map((r) => r.reason).concat(clientErrors)
    expect(bad.length === 0, `${bad.length} of ${clients.length} clients got an error: ` +
      bad.map((e) => `${e.code || ''} ${e.message}`).join('; '))
  })

  finish()
}

main()
