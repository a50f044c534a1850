// pgfence compatibility checks for postgres.js (postgres): extended
// protocol, every query prepared by default, pipelining of concurrent
// queries on one connection.
'use strict'

const postgres = require('postgres')
const { pipeline } = require('node:stream/promises')
const { Readable, Writable } = require('node:stream')
const { env, check, expect, finish } = require('./check')

const { version } = JSON.parse(require('node:fs').readFileSync(`${__dirname}/node_modules/postgres/package.json`))
console.log('driver postgres.js', version)

// proxy is where to connect, as postgres.js takes it: it would send an
// sslrootcert query parameter to Postgres as a setting, so the CA that
// names (PGFENCE_TEST_TLS) becomes its ssl option.
function proxy() {
  const u = new URL(env.proxyUrl)
  const ca = u.searchParams.get('sslrootcert')
  if (ca === null) return [env.proxyUrl, {}]
  u.searchParams.delete('sslrootcert')
  u.searchParams.delete('sslmode')
  return [u.toString(), { ssl: { ca: require('node:fs').readFileSync(ca) } }]
}

const pools = []
// connect returns a one-connection pool, so a session setting such as
// fence.token stays with the queries that follow it.
async function connect(token) {
  const [url, tls] = proxy()
  const sql = postgres(url, { max: 1, onnotice: () => {}, ...tls })
  pools.push(sql)
  if (token !== undefined) await sql`SELECT set_config('fence.token', ${String(token)}, false)`
  return sql
}

async function main() {
  const table = (sql) => sql(env.table) // an identifier

  await check('tx_commit', async () => {
    const sql = await connect(10)
    await sql.begin((tx) => tx`INSERT INTO ${table(tx)} (id, val) VALUES (${100}, ${'committed'})`)
    const rows = await sql`SELECT val FROM ${table(sql)} WHERE id = 100`
    expect(rows.length === 1 && rows[0].val === 'committed', 'row 100 missing after commit')
  })

  await check('tx_rollback', async () => {
    const sql = await connect(10)
    const rollback = new Error('roll back')
    const err = await sql.begin(async (tx) => {
      await tx`INSERT INTO ${table(tx)} (id, val) VALUES (${101}, ${'rolled back'})`
      const u = await tx`UPDATE ${table(tx)} SET val = ${'rolled back'} WHERE id = ${3}`
      expect(u.count === 1, `UPDATE row 3: ${u.count} rows`)
      throw rollback
    }).then(() => null, (e) => e)
    expect(err === rollback, `transaction ended with ${err}`)
    const rows = await sql`SELECT id, val FROM ${table(sql)} WHERE id IN (3, 101)`
    expect(JSON.stringify(rows) === '[{"id":3,"val":"init"}]', `rolled-back changes are visible: ${JSON.stringify(rows)}`)
  })

  await check('params', async () => {
    const sql = await connect(10)
    const [r] = await sql`SELECT ${1}::int + ${2}::int AS sum, ${'x'}::text AS s`
    expect(r.sum === 3 && r.s === 'x', 'wrong SELECT result')
    const u = await sql`UPDATE ${table(sql)} SET val = ${'param'} WHERE id = ${4}`
    expect(u.count === 1, `UPDATE row 4: ${u.count} rows`)
  })

  await check('prepared_reuse', async () => {
    // postgres.js prepares each distinct query text once per connection.
    const sql = await connect(10)
    for (let i = 1; i <= 20; i++) {
      const r = await sql`UPDATE ${table(sql)} SET n = n + 1 WHERE id = ${2}`
      expect(r.count === 1, `execution ${i}: ${r.count} rows`)
    }
  })

  await check('error_recovery', async () => {
    const sql = await connect()
    const err = await sql`SELECT 1/0`.then(() => null, (e) => e)
    expect(err && err.code === '22012', `SELECT 1/0: ${err && err.code}, want 22012`)
    const [r] = await sql`SELECT 1 AS one`
    expect(r.one === 1, 'SELECT 1 after the error')
  })

  await check('copy_in', async () => {
    const sql = await connect()
    const stream = await sql`COPY ${sql(env.plain)} (id, val) FROM STDIN`.writable()
    await pipeline(Readable.from(['1\ta\n', '2\tb\n', '3\tc\n']), stream)
    const [r] = await sql`SELECT count(*)::int AS n FROM ${sql(env.plain)}`
    expect(r.n === 3, `${r.n} rows after COPY`)
  })

  await check('copy_out', async () => {
    const sql = await connect()
    let out = ''
    await pipeline(await sql`COPY ${table(sql)} (id, val) TO STDOUT`.readable(), new Writable({
      write(chunk, _enc, done) { out += chunk; done() },
    }))
    expect(out.includes('5\tinit\n'), `unexpected COPY output ${JSON.stringify(out)}`)
  })

  await check('listen_notify', async () => {
    // listen() resolves once LISTEN has run (on a connection of its own).
    const listener = await connect()
    let notified
    const got = new Promise((resolve) => { notified = resolve })
    await listener.listen(env.channel, notified)
    await (await connect()).notify(env.channel, 'hello')
    let timer
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('no notification within 5 s')), 5000)
    })
    const payload = await Promise.race([got, timeout])
    clearTimeout(timer)
    expect(payload === 'hello', `got ${JSON.stringify(payload)}`)
  })

  await check('cancel', async () => {
    // postgres.js's cancel API: query.cancel() sends a CancelRequest.
    const sql = await connect()
    const query = sql`SELECT pg_sleep(30)`
    const start = Date.now()
    const done = query.then(() => null, (e) => e)
    // query.cancel() drops the promise of the CancelRequest it sends; the
    // canceller it calls returns it, resolved once Postgres closes the cancel
    // connection. Postgres signals the backend twice for one request (pid,
    // then process group), so the next statement waits for that close.
    const sent = new Promise((resolve) => setTimeout(() => resolve(query.canceller(query)), 500))
    const err = await done
    const elapsed = (Date.now() - start) / 1000
    expect(err && err.code === '57014', `pg_sleep(30): ${err ? err.code + ' ' + err.message : 'not cancelled'}`)
    expect(elapsed < 10, `cancelled after ${elapsed} s`)
    await sent
    const [r] = await sql`SELECT 1 AS one`
    expect(r.one === 1, 'SELECT 1 after the cancel')
  })

  await check('fenced_write', async () => {
    const b = await connect(43)
    const a = await connect(42)
    const rb = await b`UPDATE ${table(b)} SET val = ${'B'} WHERE id = ${1}`
    expect(rb.count === 1, `writer B (token 43): ${rb.count} rows, want 1`)
    const ra = await a`UPDATE ${table(a)} SET val = ${'A'} WHERE id = ${1}`
    expect(ra.count === 0, `writer A (token 42, stale): ${ra.count} rows, want 0`)
    const [r] = await a`SELECT val FROM ${table(a)} WHERE id = 1`
    expect(r.val === 'B', "row 1 lost B's value")
  })

  await check('token_set', async () => {
    // Plain SETs, as an application sets its lease's token. postgres.js
    // prepares each text as a named statement on first use, so pgfence
    // answers only a SET it has seen before (the third) itself.
    const sql = await connect()
    await sql`SET fence.token = '11'`
    const i = await sql`INSERT INTO ${table(sql)} (id, val) VALUES (103, 'tokenset')`
    expect(i.count === 1, `INSERT with token 11: ${i.count} rows`)
    await sql`SET fence.token = '9'`
    const s = await sql`UPDATE ${table(sql)} SET val = 'stale' WHERE id = 103`
    expect(s.count === 0, `UPDATE with the stale token 9: ${s.count} rows, want 0`)
    await sql`SET fence.token = '11'`
    const u = await sql`UPDATE ${table(sql)} SET n = n + 1 WHERE id = ${103}`
    expect(u.count === 1, `UPDATE with token 11 again: ${u.count} rows`)
  })

  await check('token_set_local', async () => {
    // SET LOCAL in each transaction. As above, pgfence answers only the
    // text postgres.js has prepared before (the third).
    const sql = await connect()
    await sql.begin(async (tx) => {
      await tx`SET LOCAL fence.token = '12'`
      const r = await tx`INSERT INTO ${table(tx)} (id, val) VALUES (104, 'tokenlocal')`
      expect(r.count === 1, `INSERT with token 12: ${r.count} rows`)
    })
    await sql.begin(async (tx) => {
      await tx`SET LOCAL fence.token = '9'`
      const r = await tx`UPDATE ${table(tx)} SET val = 'stale' WHERE id = 104`
      expect(r.count === 0, `UPDATE with the stale token 9: ${r.count} rows, want 0`)
    })
    await sql.begin(async (tx) => {
      await tx`SET LOCAL fence.token = '12'`
      const r = await tx`UPDATE ${table(tx)} SET n = n + 1 WHERE id = ${104}`
      expect(r.count === 1, `UPDATE with token 12 again: ${r.count} rows`)
    })
  })

  await check('pipeline', async () => {
    // Queries issued together on one connection are pipelined: all sent
    // before the first result is read.
    const b = await connect(43)
    await b`UPDATE ${table(b)} SET val = ${'B'} WHERE id = ${7}`
    const sql = await connect(10)
    const [r6, r7, r102, sel] = await Promise.all([
      sql`UPDATE ${table(sql)} SET val = ${'pipeline'} WHERE id = ${6}`,
      sql`UPDATE ${table(sql)} SET val = ${'pipeline'} WHERE id = ${7}`, // stale: B wrote it
      sql`INSERT INTO ${table(sql)} (id, val) VALUES (${102}, ${'pipeline'})`,
      sql`SELECT val FROM ${table(sql)} WHERE id = ${6}`,
    ])
    const counts = [r6.count, r7.count, r102.count]
    expect(JSON.stringify(counts) === '[1,0,1]', `rows affected ${JSON.stringify(counts)}, want [1,0,1]`)
    expect(sel[0].val === 'pipeline', 'SELECT in the pipeline')
  })

  await Promise.allSettled(pools.map((sql) => sql.end({ timeout: 1 })))
  finish()
}

main()
