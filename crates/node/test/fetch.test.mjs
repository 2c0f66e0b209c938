// createFetch against real sockets: the workspace's test receiver (dedupes by key, counts
// effects, fails on script) and node:http servers for streamed and cut answers.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const ir = require('../index.js')
const native = require('../native.js')

/** Fast retries: the tests check behaviour, not waiting. */
const FAST = { baseDelayMs: 1, maxDelayMs: 5 }

/** A node:http server on a free loopback port, closed after the test. */
async function serve(t, handler) {
  const server = http.createServer(handler)
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => {
    server.closeAllConnections()
    server.close()
  })
  return `http://127.0.0.1:${server.address().port}`
}

test('the package exports what its types declare', () => {
  for (const name of [
    'createFetch',
    'derive',
    'forToolCall',
    'withIdempotencyKey',
    'currentIdempotencyKey',
    'reportOf',
    'IdempotentFetchError',
  ]) {
    assert.equal(typeof ir[name], 'function', name)
  }
})

test('a 503 then a reset after the charge: one key on every attempt, one effect, the report', async () => {
  const receiver = new native.Receiver()
  receiver.inject('status', { request: 1, status: 503 })
  receiver.inject('reset_after_commit', { request: 2 })
  const fetch = ir.createFetch(FAST)
  const response = await fetch(receiver.url('/charges'), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ amount: 100, currency: 'eur' }),
  })
  assert.ok(response instanceof Response)
  assert.equal(response.status, 200)
  assert.deepEqual(await response.json(), { effect: 1 })
  const keys = receiver.keys()
  assert.equal(keys.length, 3)
  assert.ok(keys[0], 'a POST without a key gets one minted')
  assert.ok(keys.every((key) => key === keys[0]), `one key on every attempt: ${keys}`)
  assert.equal(receiver.effects(), 1)
  const report = ir.reportOf(response)
  assert.equal(report.attempts, 3)
  assert.equal(report.key, keys[0])
  assert.equal(report.replayed, false)
  assert.deepEqual(
    report.history.map((attempt) => [attempt.status, attempt.failure]),
    [
      [503, 'server_error'],
      [null, 'connection_reset'],
      [200, null],
    ],
  )
  assert.equal(response.url, receiver.url('/charges'))
})

test('the key header on the request is the key', async () => {
  const receiver = new native.Receiver()
  receiver.inject('status', { request: 1, status: 503 })
  const fetch = ir.createFetch(FAST)
  const response = await fetch(receiver.url('/charges'), {
    method: 'POST',
    headers: { 'Idempotency-Key': 'order-42-charge' },
    body: 'amount=100',
  })
  assert.equal(response.status, 200)
  assert.deepEqual(receiver.keys(), ['order-42-charge', 'order-42-charge'])
  assert.equal(response.report.key, 'order-42-charge')
})

test('withIdempotencyKey keys the requests made inside it, in place of a key header they carry', async () => {
  const receiver = new native.Receiver()
  const fetch = ir.createFetch(FAST)
  await ir.withIdempotencyKey('run-7-step-2', async () => {
    assert.equal(ir.currentIdempotencyKey(), 'run-7-step-2')
    await fetch(receiver.url('/a'), { method: 'POST', body: 'a' })
    await fetch(receiver.url('/b'), { method: 'POST', body: 'b', headers: { 'idempotency-key': 'own' } })
  })
  assert.equal(ir.currentIdempotencyKey(), undefined)
  assert.deepEqual(receiver.keys(), ['run-7-step-2', 'run-7-step-2'])
})

test('derive and forToolCall give the Rust crate\'s keys (its golden vectors)', () => {
  assert.equal(
    ir.derive('agent.send_email', ['conv_42', '7']),
    'c773f371188e7c30df068e84cff87cf4102e2ebe19bc21c186155202b0a911ac',
  )
  assert.equal(ir.derive('stripe.charge', []), 'b0f423ac270e41fb773183f83c1db0480ae2fc248c7d7aec1dde2038addc7d4a')
  assert.equal(ir.derive('stripe.charge'), ir.derive('stripe.charge', []))
  assert.equal(ir.derive('', ['']), 'ef688f0c3d8b083f0e7a04cafa44544e4cd4d4ad44961c9221c6a6ed99945b9b')
  assert.equal(
    ir.derive('caf\u00e9.\u00fcn\u00efc\u00f6d\u00e9', ['\u65e5\u672c\u8a9e', '\u{1f600}']),
    '5bbf276a9b9c65a1e9db1c3f238f3670c43d21c5eaf70efc155e089cd0c77f7c',
  )
  assert.equal(
    ir.forToolCall('send_email', { to: 'a@example.com', subject: 'hi' }),
    '279044b9ab0b0cf79c8744562eeb1f4d99ab999a0d602a5448a5205a1b42ff42',
  )
  assert.equal(
    ir.forToolCall('translate', { text: 'Gr\u00fc\u00dfe \u{1f600}', '\ue000': 1 }),
    'a53c276a9bab1ac3d5b865425ccb1c274ddb4fe64641d15f6fa2e8db95f494ff',
  )
  assert.equal(ir.forToolCall('t', { a: 1, b: [1.0, 'x'] }), ir.forToolCall('t', { b: [1, 'x'], a: 1 }))
  assert.throws(() => ir.forToolCall('t', { a: NaN }), TypeError)
  assert.throws(() => ir.derive('s', [1]), TypeError)
})

test('every kind of replayable body is sent again byte for byte', async (t) => {
  const form = new FormData()
  form.append('amount', '100')
  form.append('file', new Blob(['receipt'], { type: 'text/plain' }), 'r.txt')
  const bodies = {
    string: 'amount=100',
    arrayBuffer: new TextEncoder().encode('{"amount":100}').buffer,
    typedArray: new Uint8Array([1, 2, 3, 255]),
    dataView: new DataView(new Uint8Array([9, 8, 7]).buffer),
    urlSearchParams: new URLSearchParams({ amount: '100', currency: 'eur' }),
    blob: new Blob(['{"amount":100}'], { type: 'application/json' }),
    formData: form,
  }
  for (const [name, body] of Object.entries(bodies)) {
    await t.test(name, async () => {
      const receiver = new native.Receiver()
      receiver.inject('status', { request: 1, status: 503 })
      const fetch = ir.createFetch(FAST)
      const response = await fetch(receiver.url('/charges'), { method: 'POST', body })
      // The receiver answers 422 to a key sent again with another body: 200 means the same bytes.
      assert.equal(response.status, 200, receiver.log().join('\n'))
      assert.equal(receiver.arrivals(), 2)
      assert.equal(receiver.effects(), 1)
    })
  }
})

test('a ReadableStream body is sent once; a retry it would need is refused, the 503 leaving the outcome unknown', async () => {
  const receiver = new native.Receiver()
  receiver.inject('status', { request: 1, status: 503 })
  const fetch = ir.createFetch(FAST)
  const body = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode('chunk-1,'))
      controller.enqueue(new TextEncoder().encode('chunk-2'))
      controller.close()
    },
  })
  const err = await fetch(receiver.url('/upload'), { method: 'POST', body, duplex: 'half' }).then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.ok(err instanceof ir.IdempotentFetchError, String(err))
  assert.ok(err instanceof TypeError)
  assert.equal(err.kind, 'body_not_replayable')
  assert.equal(err.outcome, 'unknown')
  assert.match(err.message, /cannot be sent again/)
  assert.equal(receiver.arrivals(), 1)
  assert.equal(err.response?.status, 503, 'the last attempt\'s response is attached')
})

test('a streamed body that arrives whole is the request body', async (t) => {
  let received = null
  const url = await serve(t, (req, res) => {
    const parts = []
    req.on('data', (part) => parts.push(part))
    req.on('end', () => {
      received = Buffer.concat(parts).toString()
      res.end('ok')
    })
  })
  const fetch = ir.createFetch(FAST)
  const body = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode('a,'))
      controller.enqueue(new TextEncoder().encode('b'))
      controller.close()
    },
  })
  const response = await fetch(`${url}/upload`, { method: 'POST', body, duplex: 'half' })
  assert.equal(await response.text(), 'ok')
  assert.equal(received, 'a,b')
})

test('resets after the charge on every attempt: rejects, outcome unknown, with the key and history', async () => {
  const receiver = new native.Receiver()
  receiver.inject('reset_after_commit', { request: 1 })
  receiver.inject('reset_after_commit', { request: 2 })
  const fetch = ir.createFetch({ ...FAST, attempts: 2 })
  const err = await fetch(receiver.url('/charges'), { method: 'POST', body: 'x' }).then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.ok(err instanceof ir.IdempotentFetchError)
  assert.ok(err instanceof TypeError, 'a network error, as fetch gives one')
  assert.equal(err.outcome, 'unknown')
  assert.equal(err.isOutcomeUnknown, true)
  assert.equal(err.key, receiver.keys()[0])
  assert.match(err.message, new RegExp(err.key))
  assert.equal(err.attempts, 2)
  assert.deepEqual(
    err.history.map((attempt) => attempt.failure),
    ['connection_reset', 'connection_reset'],
  )
  assert.equal(err.response, null)
  assert.ok(err.cause instanceof Error)
  assert.equal(receiver.effects(), 1)
})

test('503 to the end: rejects, outcome unknown, with the last response attached', async () => {
  const receiver = new native.Receiver()
  for (const request of [1, 2, 3]) receiver.inject('status', { request, status: 503 })
  const fetch = ir.createFetch({ ...FAST, attempts: 3 })
  const err = await fetch(receiver.url('/charges'), { method: 'POST', body: 'x' }).then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.equal(err.outcome, 'unknown')
  assert.equal(err.kind, 'attempts_exhausted')
  assert.equal(err.response.status, 503)
  assert.equal(err.response.report.attempts, 3)
})

test('nothing listening: rejects, outcome not_done', async () => {
  const fetch = ir.createFetch({ ...FAST, attempts: 2 })
  const err = await fetch('http://127.0.0.1:1/charges', { method: 'POST', body: 'x' }).then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.ok(err instanceof TypeError)
  assert.equal(err.outcome, 'not_done')
  assert.equal(err.failure, 'connect')
})

test('a final 4xx resolves, as fetch does: the receiver answered', async () => {
  const receiver = new native.Receiver()
  receiver.inject('status', { request: 1, status: 400 })
  const fetch = ir.createFetch(FAST)
  const response = await fetch(receiver.url('/charges'), { method: 'POST', body: 'x' })
  assert.equal(response.status, 400)
  assert.equal(response.report.attempts, 1)
})

test('a body cut midway with a Content-Length is retried with the key: the whole answer, one effect', async () => {
  const receiver = new native.Receiver()
  receiver.inject('cut_body_after_commit', { request: 1, keepBytes: 3 })
  const fetch = ir.createFetch(FAST)
  const response = await fetch(receiver.url('/charges'), { method: 'POST', body: 'x' })
  assert.deepEqual(await response.json(), { effect: 1 })
  assert.equal(receiver.arrivals(), 2)
  assert.equal(receiver.effects(), 1)
  assert.equal(response.report.attempts, 2)
})

test('an answer without a length streams as it arrives (server-sent events)', async (t) => {
  let finish
  const finished = new Promise((resolve) => (finish = resolve))
  const url = await serve(t, async (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: first\n\n')
    await finished
    res.end('data: last\n\n')
  })
  const fetch = ir.createFetch(FAST)
  const response = await fetch(`${url}/events`, { method: 'POST', body: '{}' })
  assert.equal(response.headers.get('content-type'), 'text/event-stream')
  const reader = response.body.getReader()
  const decoder = new TextDecoder()
  // The first event is read while the server still holds the rest back.
  const first = await reader.read()
  assert.equal(decoder.decode(first.value), 'data: first\n\n')
  finish()
  let rest = ''
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    rest += decoder.decode(value)
  }
  assert.equal(rest, 'data: last\n\n')
})

test('a streamed answer cut midway errors with the key and how to have the answer again; sent again, it comes whole', async (t) => {
  // The receiver's store: the first arrival runs the operation and its answer is cut; a later
  // one with the same key is answered whole from the store, nothing run again.
  const ran = new Map()
  const url = await serve(t, (req, res) => {
    const key = req.headers['idempotency-key']
    res.writeHead(200, { 'content-type': 'text/plain' })
    if (ran.has(key)) {
      res.end(ran.get(key))
      return
    }
    ran.set(key, 'partial and the rest')
    res.write('partial')
    setImmediate(() => res.socket.destroy())
  })
  const fetch = ir.createFetch(FAST)
  const send = () =>
    fetch(`${url}/download`, { method: 'POST', body: 'x', headers: { 'idempotency-key': 'download-1' } })
  const response = await send()
  const err = await response.text().then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.ok(err instanceof ir.IdempotentFetchError, String(err))
  assert.equal(err.key, 'download-1')
  assert.equal(err.outcome, 'done')
  assert.match(err.message, /download-1/)
  assert.match(err.message, /answered 200/)
  assert.match(err.message, /send the same request again/)
  const again = await send()
  assert.equal(await again.text(), 'partial and the rest')
  assert.equal(ran.size, 1)
})

test('an abort drops the operation and gives its lease back: the same key then goes through at once', async () => {
  const receiver = new native.Receiver()
  receiver.inject('slow_handler', { request: 1, ms: 1500 })
  const ledger = join(mkdtempSync(join(tmpdir(), 'ir-node-')), 'ledger.db')
  const fetch = ir.createFetch({ ...FAST, ledger, leaseWaitMs: 0 })
  const controller = new AbortController()
  const pending = fetch(receiver.url('/charges'), {
    method: 'POST',
    body: 'x',
    headers: { 'idempotency-key': 'abort-1' },
    signal: controller.signal,
  })
  assert.equal(await receiver.waitForArrivals(1, 10_000), 1)
  controller.abort()
  const err = await pending.then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.equal(err.name, 'AbortError')
  // With no wait for a lease held elsewhere, a lease still held would refuse this at once.
  const response = await fetch(receiver.url('/charges'), {
    method: 'POST',
    body: 'x',
    headers: { 'idempotency-key': 'abort-1' },
  })
  assert.equal(response.status, 200)
  assert.equal(receiver.effectsFor('abort-1'), 1)
  fetch.close()
})

test('an aborted signal rejects before anything is sent', async () => {
  const receiver = new native.Receiver()
  const fetch = ir.createFetch(FAST)
  const err = await fetch(receiver.url('/x'), { method: 'POST', body: 'x', signal: AbortSignal.abort() }).then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.equal(err.name, 'AbortError')
  assert.equal(receiver.arrivals(), 0)
})

test('with a ledger, a later run of the same key is replayed from it: nothing sent', async () => {
  const receiver = new native.Receiver()
  const ledger = join(mkdtempSync(join(tmpdir(), 'ir-node-')), 'ledger.db')
  const first = ir.createFetch({ ...FAST, ledger })
  const one = await first('' + receiver.url('/charges'), {
    method: 'POST',
    body: 'x',
    headers: { 'idempotency-key': 'ledger-1' },
  })
  assert.deepEqual(await one.json(), { effect: 1 })
  first.close()
  const second = ir.createFetch({ ...FAST, ledger })
  const two = await second(receiver.url('/charges'), {
    method: 'POST',
    body: 'x',
    headers: { 'idempotency-key': 'ledger-1' },
  })
  assert.deepEqual(await two.json(), { effect: 1 })
  assert.equal(two.report.replayed, true)
  assert.equal(two.report.attempts, 0)
  assert.equal(receiver.arrivals(), 1)
  second.close()
})

test('a bad option is a TypeError naming it; a ledger that cannot open says why', () => {
  assert.throws(() => ir.createFetch({ atempts: 3 }), (err) => err instanceof TypeError && /atempts/.test(err.message))
  assert.throws(() => ir.createFetch({ redirect: 'sometimes' }), /redirect/)
  assert.throws(() => ir.createFetch({ baseDelayMs: -1 }), (err) => err instanceof TypeError && /baseDelayMs/.test(err.message))
  assert.throws(() => ir.createFetch({ keyHeader: 'not a header' }), TypeError)
  assert.throws(() => ir.createFetch({ ledger: '/nonexistent-dir/x/ledger.db' }), /cannot open the ledger/)
})

test('a PostgreSQL ledger: a later run of the key is replayed from it', async (t) => {
  const url = process.env.IDEMPOTENT_RETRY_PG_URL
  if (!url) {
    t.skip('IDEMPOTENT_RETRY_PG_URL is not set (bash .ci/run starts a server and sets it)')
    return
  }
  const receiver = new native.Receiver()
  const key = `pg-${process.pid}-${Date.now()}`
  const first = ir.createFetch({ ...FAST, ledger: url })
  const one = await first(receiver.url('/charges'), { method: 'POST', body: 'x', headers: { 'idempotency-key': key } })
  assert.deepEqual(await one.json(), { effect: 1 })
  const second = ir.createFetch({ ...FAST, ledger: url })
  const two = await second(receiver.url('/charges'), { method: 'POST', body: 'x', headers: { 'idempotency-key': key } })
  assert.deepEqual(await two.json(), { effect: 1 })
  assert.equal(two.report.replayed, true)
  assert.equal(receiver.arrivals(), 1)
})

test('a request the engine refuses rejects before anything is sent: a TypeError, not_done', async () => {
  const receiver = new native.Receiver()
  const fetch = ir.createFetch(FAST)
  const err = await fetch(receiver.url('/x'), { method: 'POST', body: 'x', headers: { 'idempotency-key': 'caf\u00e9 key' } }).then(
    () => assert.fail('resolved'),
    (err) => err,
  )
  assert.ok(err instanceof ir.IdempotentFetchError, String(err))
  assert.ok(err instanceof TypeError)
  assert.equal(err.outcome, 'not_done')
  assert.equal(err.kind, 'invalid_request')
  assert.match(err.message, /idempotency key/)
  assert.equal(receiver.arrivals(), 0)
})
