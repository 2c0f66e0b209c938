// One ledger across processes and languages, on one SQLite file: a charge sent from Node is
// answered from the ledger to idemcurl (Rust) and to Python; a Node process killed with
// SIGKILL mid-request and restarted charges once; a Node process and a Python process racing
// on one key charge once.
//
// idemcurl is the binary at $IDEMCURL (`cargo build -p idempotent-retry-curl`), Python the
// interpreter at $IDEMPOTENT_RETRY_PYTHON with the package `idempotent_retry` installed
// (`bash .ci/python`); the tests that need one are skipped when it is not given.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const { createFetch, derive, reportOf } = require('../index.js')
const { Receiver } = require('../native.js')

const IDEMCURL = process.env.IDEMCURL
const PYTHON = process.env.IDEMPOTENT_RETRY_PYTHON
const CHARGE = fileURLToPath(new URL('./fixtures/charge.mjs', import.meta.url))

/** Every process and every wait gets this long before the test fails instead of hanging. */
const LIMIT_MS = 60_000

/** The charge every language sends: one request, so one fingerprint in the ledger. */
const BODY = '{"amount":500}'
const SCOPE = 'charges'

/** Sends one charge through the Python package and prints how it ended, as one JSON line. */
const PYTHON_CHARGE = `
import json, sys
import httpx
import idempotent_retry as ir

ledger, url, key = sys.argv[1:4]
transport = ir.Transport(ledger=ledger, ledger_scope="charges", base_delay=0.01, max_delay=0.05,
                         lease_wait=${LIMIT_MS / 1000})
with httpx.Client(transport=transport) as client:
    response = client.post(
        url,
        content=b'${BODY}',
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
report = response.extensions["idempotent_retry"]
print(json.dumps({"status": response.status_code, "body": response.text,
                  "attempts": report.attempts, "replayed": report.replayed, "key": report.key}))
transport.close()
`

/** A temporary directory, removed when the test ends; resolves to the ledger's path in it. */
async function ledgerFile(t) {
  const dir = await mkdtemp(path.join(tmpdir(), 'idempotent-retry-ledger-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  return path.join(dir, 'ledger.sqlite3')
}

/**
 * Starts `command`; `done` resolves to `{ code, signal, stdout, stderr }` once it exits, or
 * rejects (after killing it) if it has not within LIMIT_MS.
 */
function start(command, args) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (chunk) => (stdout += chunk))
  child.stderr.setEncoding('utf8').on('data', (chunk) => (stderr += chunk))
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`${command} ${args.join(' ')} did not end within ${LIMIT_MS} ms\n${stderr}`))
    }, LIMIT_MS)
    child.once('error', (err) => {
      clearTimeout(timer)
      reject(err)
    })
    child.once('close', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr })
    })
  })
  return { child, done }
}

/** The JSON line a charge script printed last. */
function printed(run) {
  assert.equal(run.code, 0, `exit ${run.code} (${run.signal}): ${run.stdout}\n${run.stderr}`)
  const lines = run.stdout.trim().split('\n')
  return JSON.parse(lines[lines.length - 1])
}

function nodeCharge(ledger, url, key, options = {}) {
  return start(process.execPath, [CHARGE, ledger, url, key, JSON.stringify(options)])
}

function pythonCharge(ledger, url, key) {
  return start(PYTHON, ['-c', PYTHON_CHARGE, ledger, url, key])
}

function idemcurlCharge(ledger, url, key) {
  return start(IDEMCURL, [
    '--silent',
    '--report',
    'json',
    '--ledger',
    ledger,
    '--scope',
    SCOPE,
    '--key',
    key,
    '-H',
    'Content-Type: application/json',
    '--data-binary',
    BODY,
    url,
  ])
}

test('a charge sent from Node is answered from the ledger to idemcurl and to Python', async (t) => {
  if (!IDEMCURL || !PYTHON) {
    t.skip('IDEMCURL and IDEMPOTENT_RETRY_PYTHON are not both set')
    return
  }
  const ledger = await ledgerFile(t)
  const receiver = new Receiver()
  const url = receiver.url('/v1/charges')
  const key = derive('test.ledger', ['order-17'])

  const idempotentFetch = createFetch({ ledger, scope: SCOPE })
  const response = await idempotentFetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: BODY,
  })
  const body = await response.text()
  idempotentFetch.close()
  assert.equal(response.status, 200)
  assert.equal(reportOf(response).replayed, false)
  assert.equal(receiver.arrivals(), 1)

  const curl = await idemcurlCharge(ledger, url, key).done
  assert.equal(curl.code, 0, curl.stderr)
  const curlReport = JSON.parse(curl.stderr.trim().split('\n').pop())
  assert.equal(curlReport.replayed, true)
  assert.equal(curlReport.sent, false)
  assert.equal(curlReport.key, key)
  assert.equal(curlReport.status, 200)
  assert.equal(curl.stdout, body)

  const python = printed(await pythonCharge(ledger, url, key).done)
  assert.equal(python.status, 200)
  assert.equal(python.replayed, true)
  assert.equal(python.key, key)
  assert.equal(python.body, body)

  assert.equal(receiver.arrivals(), 1)
  assert.equal(receiver.effectsFor(key), 1)
  assert.equal(receiver.effects(), 1)
})

test('a Node process killed with SIGKILL mid-request and restarted charges once', async (t) => {
  const ledger = await ledgerFile(t)
  const receiver = new Receiver()
  const url = receiver.url('/v1/charges')
  const key = derive('test.kill', ['order-17'])
  // The first arrival makes the charge, then holds its answer back: the process dies waiting.
  receiver.inject('stall_after_commit', { key, attempt: 1, ms: 30_000 })
  // A short lease, so that the dead process's claim on the key lapses soon.
  const options = { leaseMs: 2000 }

  const first = nodeCharge(ledger, url, key, options)
  t.after(() => first.child.kill('SIGKILL'))
  assert.equal(await receiver.waitForArrivals(1, LIMIT_MS), 1, 'the request reached the receiver')
  first.child.kill('SIGKILL')
  const killed = await first.done
  assert.equal(killed.signal, 'SIGKILL')

  // The restart finds the dead run's claim, waits for its lease to lapse, and sends the
  // charge again under the same key: the receiver answers it from its store.
  const again = printed(await nodeCharge(ledger, url, key, options).done)
  assert.equal(again.status, 200)
  assert.deepEqual(JSON.parse(again.body), { effect: 1 })
  assert.equal(again.key, key)
  assert.equal(again.replayed, false)
  assert.deepEqual(receiver.keys(), [key, key])
  assert.equal(receiver.effectsFor(key), 1)
  assert.equal(receiver.effects(), 1)
})

test('a Node process and a Python process racing on one key charge once', async (t) => {
  if (!PYTHON) {
    t.skip('IDEMPOTENT_RETRY_PYTHON is not set')
    return
  }
  const ledger = await ledgerFile(t)
  const receiver = new Receiver()
  const url = receiver.url('/v1/charges')
  const key = derive('test.race', ['order-17'])
  // Whoever claims the key first holds it while the receiver works; the other waits for it.
  receiver.inject('slow_handler', { key, attempt: 1, ms: 1000 })

  const node = nodeCharge(ledger, url, key)
  const python = pythonCharge(ledger, url, key)
  t.after(() => {
    node.child.kill('SIGKILL')
    python.child.kill('SIGKILL')
  })
  const [fromNode, fromPython] = (await Promise.all([node.done, python.done])).map(printed)

  assert.equal(fromNode.status, 200)
  assert.equal(fromPython.status, 200)
  assert.equal(fromNode.body, fromPython.body)
  assert.deepEqual(JSON.parse(fromNode.body), { effect: 1 })
  // One of them sent the charge; the other was answered from the ledger.
  assert.equal([fromNode.replayed, fromPython.replayed].filter(Boolean).length, 1)
  assert.deepEqual(receiver.keys(), [key])
  assert.equal(receiver.effectsFor(key), 1)
})
