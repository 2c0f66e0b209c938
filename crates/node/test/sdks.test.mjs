// The package under the SDKs people call it through: openai-node, stripe-node and the MCP
// TypeScript SDK, each with its own retries off, against local fakes that count effects per
// idempotency key and answer a completed key from their store; and a plain agent tool whose
// key comes from its call, answered again from an SQLite ledger by a new client.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'

import OpenAI from 'openai'
import Stripe from 'stripe'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { z } from 'zod'

const require = createRequire(import.meta.url)
const { createFetch, forToolCall, withIdempotencyKey, reportOf, IdempotentFetchError } =
  require('../index.js')
const { Receiver } = require('../native.js')

/** Short backoff, so that retries do not slow the suite down. */
const QUICK = { baseDelayMs: 10, maxDelayMs: 50 }

/** A request's whole body, as text. */
async function readBody(req) {
  const chunks = []
  for await (const chunk of req) chunks.push(chunk)
  return Buffer.concat(chunks).toString('utf8')
}

/** Starts `server` on a free loopback port, closed when the test ends; resolves to its origin. */
async function listen(t, server) {
  await new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', resolve)
  })
  t.after(() => {
    server.closeAllConnections()
    server.close()
  })
  return `http://127.0.0.1:${server.address().port}`
}

/**
 * A fake API that dedupes by `Idempotency-Key` as Stripe and OpenAI document it: the first
 * completed request with a key runs (one effect) and its answer is stored; a later one with
 * that key gets the stored answer and runs nothing. `fault(n)` decides what the `n`th
 * arrival meets before any of that: `'reset'` (the socket is reset once the request was read),
 * a status answered without running anything, or `null` to go on.
 */
function fakeApi(answer, fault = () => null) {
  const arrivals = []
  const effects = new Map()
  const stored = new Map()
  const server = http.createServer(async (req, res) => {
    const body = await readBody(req)
    const key = req.headers['idempotency-key'] ?? null
    arrivals.push({ method: req.method, url: req.url, key, body })
    const what = fault(arrivals.length)
    if (what === 'reset') {
      req.socket.resetAndDestroy()
      return
    }
    if (typeof what === 'number') {
      res.writeHead(what, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ error: { type: 'api_error', message: 'overloaded, try again' } }))
      return
    }
    let result = key === null ? undefined : stored.get(key)
    if (result === undefined) {
      const count = (effects.get(key) ?? 0) + 1
      effects.set(key, count)
      result = answer(body, req)
      if (key !== null) stored.set(key, result)
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify(result))
  })
  return {
    server,
    arrivals,
    /** Effects run under `key`. */
    effectsFor: (key) => effects.get(key) ?? 0,
    /** Effects run in all. */
    effects: () => [...effects.values()].reduce((a, b) => a + b, 0),
  }
}

/** The chain of `.cause`s from `error` down, `error` first. */
function causes(error) {
  const chain = []
  for (let e = error; e != null && !chain.includes(e); e = e.cause) chain.push(e)
  return chain
}

function completion(text) {
  return {
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1700000000,
    model: 'gpt-4o-mini',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: text, refusal: null },
        logprobs: null,
        finish_reason: 'stop',
      },
    ],
    usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 },
  }
}

/** Two POSTs to `path` arrived, the same key and body on both, and the fake ran it once. */
function assertOneOperation(api, path) {
  assert.deepEqual(
    api.arrivals.map((a) => [a.method, a.url]),
    [
      ['POST', path],
      ['POST', path],
    ],
  )
  const [first, second] = api.arrivals
  assert.ok(first.key, 'the first arrival carries a key')
  assert.equal(second.key, first.key)
  assert.equal(second.body, first.body)
  assert.equal(api.effectsFor(first.key), 1)
  assert.equal(api.effects(), 1)
}

test('openai-node: a 503 then the completion is one key on both arrivals and one effect', async (t) => {
  const api = fakeApi(() => completion('Paris'), (n) => (n === 1 ? 503 : null))
  const origin = await listen(t, api.server)
  const client = new OpenAI({
    apiKey: 'sk-test',
    baseURL: `${origin}/v1`,
    fetch: createFetch(QUICK),
    maxRetries: 0,
  })

  const result = await client.chat.completions.create({
    model: 'gpt-4o-mini',
    messages: [{ role: 'user', content: 'The capital of France?' }],
  })

  assert.equal(result.choices[0].message.content, 'Paris')
  assertOneOperation(api, '/v1/chat/completions')
})

test('openai-node: when every attempt is reset, the SDK throws and the outcome and key are in its causes', async (t) => {
  const api = fakeApi(() => completion('never'), () => 'reset')
  const origin = await listen(t, api.server)
  const client = new OpenAI({
    apiKey: 'sk-test',
    baseURL: `${origin}/v1`,
    fetch: createFetch({ ...QUICK, attempts: 2 }),
    maxRetries: 0,
  })

  const thrown = await client.chat.completions
    .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Hello' }] })
    .then(
      () => assert.fail('the call cannot succeed'),
      (error) => error,
    )

  assert.ok(thrown instanceof OpenAI.APIConnectionError, `the SDK threw ${thrown}`)
  const ours = causes(thrown).find((e) => e instanceof IdempotentFetchError)
  assert.ok(ours, 'an IdempotentFetchError is among the causes of what the SDK threw')
  assert.equal(ours.outcome, 'unknown')
  assert.equal(ours.isOutcomeUnknown, true)
  assert.equal(ours.attempts, 2)
  assert.equal(api.arrivals.length, 2)
  assert.ok(ours.key, 'the error names the key')
  assert.deepEqual(
    api.arrivals.map((a) => a.key),
    [ours.key, ours.key],
  )
  assert.equal(api.effects(), 0)
})

function charge(body) {
  const form = new URLSearchParams(body)
  return {
    id: 'ch_1',
    object: 'charge',
    amount: Number(form.get('amount')),
    currency: form.get('currency'),
    source: form.get('source'),
    status: 'succeeded',
    paid: true,
  }
}

function stripeClient(port) {
  return new Stripe('sk_test_x', {
    httpClient: Stripe.createFetchHttpClient(createFetch(QUICK)),
    maxNetworkRetries: 0,
    host: '127.0.0.1',
    port,
    protocol: 'http',
  })
}

test('stripe-node: a 503 then the charge, with the SDK choosing the key, is one key and one effect', async (t) => {
  const api = fakeApi(charge, (n) => (n === 1 ? 503 : null))
  const origin = await listen(t, api.server)
  const stripe = stripeClient(new URL(origin).port)

  const result = await stripe.charges.create({ amount: 500, currency: 'eur', source: 'tok_visa' })

  assert.equal(result.id, 'ch_1')
  assert.equal(result.amount, 500)
  assertOneOperation(api, '/v1/charges')
})

test('stripe-node: a 503 then the charge, with the caller giving the key, sends that key on both arrivals', async (t) => {
  const api = fakeApi(charge, (n) => (n === 1 ? 503 : null))
  const origin = await listen(t, api.server)
  const stripe = stripeClient(new URL(origin).port)

  const result = await stripe.charges.create(
    { amount: 700, currency: 'usd', source: 'tok_visa' },
    { idempotencyKey: 'order-17-charge' },
  )

  assert.equal(result.id, 'ch_1')
  assert.equal(result.amount, 700)
  assert.deepEqual(
    api.arrivals.map((a) => a.key),
    ['order-17-charge', 'order-17-charge'],
  )
  assert.equal(api.effectsFor('order-17-charge'), 1)
  assert.equal(api.effects(), 1)
})

test(
  'stripe-node: withIdempotencyKey gives the charge its key in place of the random one the SDK puts on every POST',
  async (t) => {
    const api = fakeApi(charge, (n) => (n === 1 ? 503 : null))
    const origin = await listen(t, api.server)
    const stripe = stripeClient(new URL(origin).port)

    const result = await withIdempotencyKey('order-17-charge', () =>
      stripe.charges.create({ amount: 900, currency: 'eur', source: 'tok_visa' }),
    )

    assert.equal(result.id, 'ch_1')
    assert.deepEqual(
      api.arrivals.map((a) => a.key),
      ['order-17-charge', 'order-17-charge'],
    )
    assert.equal(api.effects(), 1)
  },
)

/**
 * A stateless MCP server over node:http with one tool, `charge`, that runs once per
 * idempotency key and answers a key it already ran from its store. The first `tools/call`
 * that reaches it has its connection reset once the tool ran, so its answer is lost.
 */
function mcpServer() {
  const toolCalls = []
  const effects = new Map()
  const stored = new Map()
  const server = http.createServer(async (req, res) => {
    if (req.method !== 'POST') {
      res.writeHead(405, { allow: 'POST' }).end()
      return
    }
    const body = JSON.parse(await readBody(req))
    const messages = Array.isArray(body) ? body : [body]
    const calling = messages.some((m) => m.method === 'tools/call')
    if (calling) toolCalls.push({ key: req.headers['idempotency-key'] ?? null })
    const arrival = toolCalls.length
    const mcp = new McpServer({ name: 'payments', version: '1.0.0' })
    mcp.registerTool(
      'charge',
      {
        description: 'Charges an order',
        inputSchema: { order: z.string(), amount: z.number() },
      },
      async ({ order, amount }, extra) => {
        const key = extra.requestInfo?.headers['idempotency-key'] ?? null
        let result = key === null ? undefined : stored.get(key)
        if (result === undefined) {
          const count = (effects.get(key) ?? 0) + 1
          effects.set(key, count)
          result = { content: [{ type: 'text', text: `charged ${amount} for ${order}` }] }
          if (key !== null) stored.set(key, result)
        }
        if (calling && arrival === 1) {
          // The charge is made; its answer never leaves.
          req.socket.resetAndDestroy()
        }
        return result
      },
    )
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: true,
    })
    res.on('close', () => {
      transport.close()
      mcp.close()
    })
    res.on('error', () => {})
    await mcp.connect(transport)
    await transport.handleRequest(req, res, body)
  })
  return {
    server,
    toolCalls,
    effectsFor: (key) => effects.get(key) ?? 0,
    effects: () => [...effects.values()].reduce((a, b) => a + b, 0),
  }
}

test('MCP SDK: a tool call whose answer is lost is sent again with its key and runs once', async (t) => {
  const payments = mcpServer()
  const origin = await listen(t, payments.server)
  const client = new Client({ name: 'checkout', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${origin}/mcp`), {
    fetch: createFetch(QUICK),
  })
  await client.connect(transport)
  t.after(() => client.close())

  const args = { order: 'order-17', amount: 500 }
  const key = forToolCall('charge', args)
  const result = await withIdempotencyKey(key, () =>
    client.callTool({ name: 'charge', arguments: args }),
  )

  assert.equal(result.isError ?? false, false)
  assert.deepEqual(result.content, [{ type: 'text', text: 'charged 500 for order-17' }])
  assert.deepEqual(
    payments.toolCalls.map((c) => c.key),
    [key, key],
  )
  assert.equal(payments.effectsFor(key), 1)
  assert.equal(payments.effects(), 1)
})

/** An agent's tool: sends an email, keyed by the tool call, so a repeated call sends once. */
async function sendEmail(fetch, url, args) {
  return withIdempotencyKey(forToolCall('send_email', args), async () => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(args),
    })
    return { response, body: await response.json() }
  })
}

test('a plain agent tool: a lost answer is sent again with the call key, and a new client replays it from the ledger', async (t) => {
  const dir = await mkdtemp(path.join(tmpdir(), 'idempotent-retry-sdks-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const ledger = path.join(dir, 'ledger.sqlite3')
  const receiver = new Receiver()
  const url = receiver.url('/v1/send')
  const args = { to: 'ada@example.com', subject: 'Your receipt', conversation: 'c-42', step: 3 }
  const key = forToolCall('send_email', args)
  // The first arrival sends the email, then its connection is reset: the answer is lost.
  receiver.inject('reset_after_commit', { request: 1 })

  const first = createFetch({ ...QUICK, ledger })
  const sent = await sendEmail(first, url, args)
  first.close()

  assert.equal(sent.response.status, 200)
  assert.deepEqual(sent.body, { effect: 1 })
  assert.equal(reportOf(sent.response).key, key)
  assert.equal(reportOf(sent.response).attempts, 2)
  assert.equal(reportOf(sent.response).replayed, false)
  assert.deepEqual(receiver.keys(), [key, key])
  assert.equal(receiver.effectsFor(key), 1)

  // The same tool call again, by a new client on the same ledger: answered from the ledger.
  const second = createFetch({ ...QUICK, ledger })
  const again = await sendEmail(second, url, args)
  second.close()

  assert.equal(again.response.status, 200)
  assert.deepEqual(again.body, { effect: 1 })
  assert.equal(reportOf(again.response).replayed, true)
  assert.equal(reportOf(again.response).attempts, 0)
  assert.equal(reportOf(again.response).key, key)
  assert.equal(receiver.arrivals(), 2)
  assert.equal(receiver.effects(), 1)
})
