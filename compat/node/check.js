// Shared by the Node driver checks: where things are, and a tiny runner.
// Each check prints "ok NAME" or "FAIL NAME: why"; finish() exits 1 if any
// check failed. The Go test (compat/drivers_test.go) sets the environment.
'use strict'

const env = {
  proxyUrl: process.env.COMPAT_PROXY_URL, // through pgfence
  table: process.env.COMPAT_TABLE, // guarded: id, val, n, fence_epoch; rows 1..10 'init'
  plain: process.env.COMPAT_PLAIN_TABLE, // unguarded: id, val
  channel: process.env.COMPAT_CHANNEL,
}

// COMPAT_ONLY, if set, names the checks to run (comma-separated).
const only = (process.env.COMPAT_ONLY || '').split(',').filter(Boolean)
const failed = []

async function check(name, fn) {
  if (only.length && !only.includes(name)) return
  try {
    await fn()
    console.log(`ok ${name}`)
  } catch (e) {
    failed.push(name)
    console.log(`FAIL ${name}: ${e && e.message}`)
    console.error(e)
  }
}

function expect(cond, what) {
  if (!cond) throw new Error(what)
}

function finish() {
  process.exit(failed.length ? 1 : 0)
}

module.exports = { env, check, expect, finish }
