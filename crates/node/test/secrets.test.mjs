// Secrets at rest through createFetch: a ledger row's URL keeps no query value
// (`?api_key=…`), and with `sealKeys` the saved answer is encrypted in the file yet replayed
// byte for byte; keys rotate; a key that does not open it is refused, nothing sent.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const { createFetch, reportOf } = require('../index.js')
const { Receiver } = require('../native.js')

const OLD = 'k1:' + '11'.repeat(32)
const NEW = 'k2:' + '22'.repeat(32)
const FAST = { baseDelayMs: 10, maxDelayMs: 50 }

async function ledgerFile(t) {
  const dir = await mkdtemp(path.join(tmpdir(), 'idempotent-retry-secrets-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  return path.join(dir, 'ledger.sqlite3')
}

/** One charge under `key`, through a fetch made with `options`: status, report and body. */
async function charge(ledger, receiver, key, options) {
  const idempotentFetch = createFetch({ ledger, ...FAST, ...options })
  try {
    const response = await idempotentFetch(
      receiver.url('/v1/charges?api_key=QUERYSECRET9&page=2'),
      {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'idempotency-key': key,
          authorization: 'Bearer BEARERSECRET',
        },
        body: '{"amount":500,"card":"BODYSECRET"}',
      },
    )
    return { status: response.status, report: reportOf(response), body: await response.text() }
  } finally {
    idempotentFetch.close()
  }
}

/** The file and its WAL, as one buffer. */
async function stored(ledger) {
  const wal = await readFile(`${ledger}-wal`).catch(() => Buffer.alloc(0))
  return Buffer.concat([await readFile(ledger), wal])
}

test('the row URL is redacted and a sealed answer replays whole, after a rotation too', async (t) => {
  const ledger = await ledgerFile(t)
  const receiver = new Receiver()
  const first = await charge(ledger, receiver, 'k-sealed', { sealKeys: [OLD] })
  const again = await charge(ledger, receiver, 'k-sealed', { sealKeys: [NEW, OLD] })
  assert.equal(again.report.replayed, true)
  assert.deepEqual([again.status, again.body], [first.status, first.body])
  assert.equal(receiver.effectsFor('k-sealed'), 1)

  const raw = await stored(ledger)
  assert.ok(raw.includes('/v1/charges?api_key=…&page=…'), 'the redacted URL is stored')
  for (const secret of ['QUERYSECRET9', 'BEARERSECRET', 'BODYSECRET', first.body]) {
    assert.ok(!raw.includes(secret), `${secret} is in the ledger file`)
  }
})

test('a key that does not open a sealed answer is refused and nothing is sent', async (t) => {
  const ledger = await ledgerFile(t)
  const receiver = new Receiver()
  await charge(ledger, receiver, 'k-locked', { sealKeys: [OLD] })
  for (const [keys, says] of [
    [[NEW], 'key id "k1"'],
    [[], 'none is configured'],
  ]) {
    await assert.rejects(charge(ledger, receiver, 'k-locked', { sealKeys: keys }), (err) => {
      assert.equal(err.kind, 'ledger')
      assert.equal(err.attempts, 0)
      assert.ok(err.message.includes(says), err.message)
      return true
    })
  }
  assert.equal(receiver.effectsFor('k-locked'), 1)
  assert.throws(() => createFetch({ sealKeys: ['k1:short'] }), /invalid seal key/)
})
