// Requests per second of this package's fetch against Node's own `fetch` (no retries), and
// against fetch-retry and ky around that same `fetch` (each told to retry POSTs, so that it
// would), over loopback keep-alive connections to a Rust server that answers every request
// `200` at once (the native module's `KeepAliveServer`, so the server's cost is small and the
// same for all). Each round sends the same keyed JSON POSTs through each client in turn, one
// after another and then 64 in flight; the clients' order rotates round by round. One after
// another, the clients also take turns request by request (`paired`), each request timed on
// its own, so a machine that gets busier or quieter mid-run weighs on all of them alike. Needs the
// module built with the `testing` feature, best with `--release`:
//
//     npx napi build --platform --release --js native.js --dts native.d.ts --features testing
//     node bench/fetch_rps.mjs [--requests N] [--rounds R]
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const ir = require('../index.js')
const native = require('../native.js')
const fetchRetry = require('fetch-retry')

const args = process.argv.slice(2)
function flag(name, fallback) {
  const at = args.indexOf(name)
  return at === -1 ? fallback : Number(args[at + 1])
}
const REQUESTS = flag('--requests', 3000)
const ROUNDS = flag('--rounds', 5)
// `--only NAME` (`node fetch`, `idempotent-retry`, `fetch-retry`, `ky`) and `--in-flight N`
// run one client at one concurrency, for a profiler (`perf stat`, `node --cpu-prof`).
const ONLY = args.includes('--only') ? args[args.indexOf('--only') + 1] : null
const IN_FLIGHT = args.includes('--in-flight') ? [flag('--in-flight', 1)] : [1, 64]

const server = new native.KeepAliveServer()
const url = server.url('/charges')
// Held to the end: an object nothing reads any more may be collected, and the server with it.
process.on('exit', () => server.url('/'))
const { default: ky } = await import('ky')

/** One keyed JSON POST through `send`, checked. */
async function post(send, n) {
  const response = await send(n)
  if (response.status !== 200) throw new Error(`unexpected status ${response.status}`)
  await response.arrayBuffer()
}

const body = (n) => JSON.stringify({ amount: 100, currency: 'eur', n })
const headers = (n) => ({ 'content-type': 'application/json', 'idempotency-key': `op-${n}` })

const ours = ir.createFetch()
const retrying = fetchRetry(fetch, {
  retries: 3,
  retryDelay: (attempt) => 2 ** attempt * 500,
  retryOn: (attempt, error, response) => error !== null || (response !== null && response.status >= 500),
})
const kyClient = ky.create({ retry: { limit: 3, methods: ['post'] }, timeout: 30_000, throwHttpErrors: false })

const clients = {
  'node fetch': (n) => fetch(url, { method: 'POST', headers: headers(n), body: body(n) }),
  'idempotent-retry': (n) => ours(url, { method: 'POST', headers: headers(n), body: body(n) }),
  'fetch-retry': (n) => retrying(url, { method: 'POST', headers: headers(n), body: body(n) }),
  ky: (n) => kyClient.post(url, { headers: headers(n), body: body(n) }),
}

/** Requests per second of `REQUESTS` POSTs through `send`, `inFlight` at a time. */
async function measure(send, inFlight) {
  await post(send, -1)
  let next = 0
  const started = performance.now()
  async function worker() {
    while (next < REQUESTS) {
      const n = next++
      await post(send, n)
    }
  }
  await Promise.all(Array.from({ length: inFlight }, worker))
  return REQUESTS / ((performance.now() - started) / 1000)
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2
}

/** Requests per second of each client, taking turns request by request, one at a time. */
async function paired(names) {
  const spent = Object.fromEntries(names.map((name) => [name, 0]))
  for (const name of names) await post(clients[name], -1)
  for (let n = 0; n < REQUESTS; n++) {
    for (let i = 0; i < names.length; i++) {
      const name = names[(i + n) % names.length]
      const started = performance.now()
      await post(clients[name], n)
      spent[name] += performance.now() - started
    }
  }
  return Object.fromEntries(names.map((name) => [name, REQUESTS / (spent[name] / 1000)]))
}

const names = ONLY === null ? Object.keys(clients) : [ONLY]
if (ONLY !== null && !(ONLY in clients)) throw new Error(`--only takes one of ${Object.keys(clients).join(', ')}`)
for (const inFlight of IN_FLIGHT) {
  const rates = Object.fromEntries(names.map((name) => [name, []]))
  for (let round = 0; round < ROUNDS; round++) {
    const order = names.map((_, i) => names[(i + round) % names.length])
    for (const name of order) {
      rates[name].push(await measure(clients[name], inFlight))
    }
  }
  if (ONLY !== null) {
    console.log(`${ONLY}, ${inFlight} in flight: ${rates[ONLY].map((r) => r.toFixed(0)).join(' ')} req/s`)
    continue
  }
  const base = median(rates['node fetch'])
  console.log(`\n${inFlight} in flight, ${REQUESTS} keyed POSTs a round, ${ROUNDS} rounds (median req/s, ratio to node fetch):`)
  for (const name of names) {
    const rate = median(rates[name])
    console.log(`  ${name.padEnd(18)} ${rate.toFixed(0).padStart(7)} req/s  ${(rate / base).toFixed(2)}x   rounds: ${rates[name].map((r) => r.toFixed(0)).join(' ')}`)
  }
  if (inFlight === 1) {
    const turns = Object.fromEntries(names.map((name) => [name, []]))
    for (let round = 0; round < ROUNDS; round++) {
      const rates = await paired(names)
      for (const name of names) turns[name].push(rates[name])
    }
    const base = median(turns['node fetch'])
    console.log(`  taking turns request by request (median of ${ROUNDS} rounds, ratio to node fetch):`)
    for (const name of names) {
      console.log(`  ${name.padEnd(18)} ${median(turns[name]).toFixed(0).padStart(7)} req/s  ${(median(turns[name]) / base).toFixed(2)}x`)
    }
  }
  const ourRate = median(rates['idempotent-retry'])
  console.log(`  ours / fetch-retry ${(ourRate / median(rates['fetch-retry'])).toFixed(2)}x, ours / ky ${(ourRate / median(rates.ky)).toFixed(2)}x`)
}
