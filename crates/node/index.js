'use strict'
// The npm package `idempotent-retry`: `createFetch(options)` gives a function with `fetch`'s
// signature over the engine of the Rust crate (native.js, built by napi-rs): one key per
// operation, sent on every attempt; retries only of what is transient; the outcome told
// (done, not done, unknown); the durable ledger shared with Rust, Python and idemcurl.

const { AsyncLocalStorage } = require('node:async_hooks')
const native = require('./native.js')

/** The key set by `withIdempotencyKey` for the requests made inside its function. */
const keys = new AsyncLocalStorage()

/** Statuses whose response has no body (the Response constructor refuses one). */
const NULL_BODY = new Set([101, 103, 204, 205, 304])

/** Each option `createFetch` takes, and the engine's name for it. */
const OPTIONS = {
  attempts: 'attempts',
  baseDelayMs: 'baseDelayMs',
  maxDelayMs: 'maxDelayMs',
  attemptTimeoutMs: 'attemptTimeoutMs',
  windowMs: 'windowMs',
  maxRetryAfterMs: 'maxRetryAfterMs',
  maxInProgressWaitMs: 'maxInProgressWaitMs',
  keyHeader: 'keyHeader',
  ledger: 'ledger',
  leaseMs: 'leaseMs',
  leaseWaitMs: 'leaseWaitMs',
  worker: 'worker',
  scope: 'scope',
  rejectUnauthorized: 'rejectUnauthorized',
  caFile: 'caFile',
  certFile: 'certFile',
  keyFile: 'keyFile',
  proxy: 'proxy',
  answerReadLimit: 'answerReadLimit',
  maxSavedBody: 'maxSavedBody',
  fetchUnsavedAnswers: 'fetchUnsavedAnswers',
  redirect: 'redirect',
  allowKeyTo: 'allowKeyTo',
  sealKeys: 'sealKeys',
  keepQueryParams: 'keepQueryParams',
}
const BUDGET = {
  capacity: 'budgetCapacity',
  retryCost: 'budgetRetryCost',
  timeoutCost: 'budgetTimeoutCost',
  successReward: 'budgetSuccessReward',
}

/**
 * Why an operation ended without an answer to give: a `TypeError`, as `fetch`'s network
 * errors are, with the outcome.
 */
class IdempotentFetchError extends TypeError {
  constructor(message, details) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause })
    this.name = 'IdempotentFetchError'
    /** `'not_done'`, `'unknown'`, or `'done'` (it happened, and its answer cannot be had). */
    this.outcome = details.outcome
    /** The operation's idempotency key, `null` when it went without one. */
    this.key = details.key ?? null
    /** Attempts sent. */
    this.attempts = details.attempts ?? 0
    /** One entry per attempt: `{ number, startedMs, status, failure, waitMs }`. */
    this.history = details.history ?? []
    /** Why it stopped: `attempts_exhausted`, `transport`, `key_reuse`, `aborted`, ... */
    this.kind = details.kind ?? null
    /** How the last attempt failed (`connect`, `timeout`, `connection_reset`, ...). */
    this.failure = details.failure ?? null
    /** The last attempt's response, when the operation stopped on one. */
    this.response = details.response ?? null
  }

  /** Whether the operation may have happened: reconcile it by its key before sending anew. */
  get isOutcomeUnknown() {
    return this.outcome === 'unknown'
  }
}

/** The attempts of an answer, as the error and the report give them. */
function history(answer) {
  return answer.history.map((attempt) => ({
    number: attempt.number,
    startedMs: attempt.startedMs,
    status: attempt.status ?? null,
    failure: attempt.failure ?? null,
    waitMs: attempt.waitMs ?? null,
  }))
}

/** The report every response carries (`response.report`, or `reportOf(response)`). */
function report(answer) {
  return Object.freeze({
    attempts: answer.attempts,
    key: answer.key ?? null,
    replayed: answer.replayed,
    refetched: answer.refetched,
    elapsedMs: answer.elapsedMs,
    leaseWaitMs: answer.leaseWaitMs,
    inProgressWaits: answer.inProgressWaits,
    unrecorded: answer.unrecorded ?? null,
    outcome: answer.outcome,
    history: Object.freeze(history(answer)),
  })
}

/** A chunk from the engine as the bytes a body stream yields. */
function bytes(buffer) {
  return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength)
}

/** The error a streamed body's read gives when its connection fails midway. */
function cutError(answer, err, keyHeader) {
  const key = answer.key ?? null
  // The engine's own note (a keyed operation's) names the key and how to have the answer
  // again; without one, say what is known.
  const message = err.message.includes('send the same request again')
    ? err.message
    : `${err.message}. The operation was answered with status ${answer.status} at the ` +
      `receiver, so its effect may stand` +
      (key === null
        ? ''
        : `: send the same request again with the key ${key} (the header ${keyHeader} or ` +
          `withIdempotencyKey) to have the answer again from the ledger or the receiver's store`)
  return new IdempotentFetchError(message, {
    outcome: 'done',
    key,
    attempts: answer.attempts,
    history: history(answer),
    kind: 'body',
    failure: 'connection_closed',
    cause: err,
  })
}

/** Node's `Response` of an answer, its body whole or streamed from the operation. */
function toResponse(answer, operation, requestUrl, keyHeader) {
  let body = null
  if (!NULL_BODY.has(answer.status)) {
    if (answer.streamed) {
      body = new ReadableStream(
        {
          async pull(controller) {
            try {
              const chunk = await operation.readChunk()
              if (chunk === null) {
                controller.close()
              } else {
                controller.enqueue(bytes(chunk))
              }
            } catch (err) {
              controller.error(cutError(answer, err, keyHeader))
            }
          },
          cancel() {
            operation.cancel()
          },
        },
        { highWaterMark: 0 },
      )
    } else {
      body = bytes(answer.body)
    }
  }
  // The Response constructor takes 200 to 599 only: a final 1xx cannot be one.
  const response = new Response(body, { status: answer.status, headers: answer.headers })
  const url = answer.url ?? requestUrl
  Object.defineProperty(response, 'url', { value: url, enumerable: true })
  Object.defineProperty(response, 'redirected', { value: url !== requestUrl, enumerable: true })
  // Made when first read: most callers never look.
  let made
  Object.defineProperty(response, 'report', {
    get() {
      made ??= report(answer)
      return made
    },
    enumerable: false,
  })
  return response
}

/** The error of an operation that ended without an answer to give. */
function toError(answer, operation, requestUrl, keyHeader) {
  let response = null
  if (answer.status != null && answer.status >= 200 && answer.status <= 599) {
    response = toResponse(answer, operation, requestUrl, keyHeader)
  }
  const cause = new Error(answer.message ?? 'the operation failed')
  cause.code = answer.failure ?? answer.errorKind ?? undefined
  return new IdempotentFetchError(answer.message ?? 'the operation failed', {
    outcome: answer.outcome,
    key: answer.key,
    attempts: answer.attempts,
    history: history(answer),
    kind: answer.errorKind,
    failure: answer.failure,
    response,
    cause,
  })
}

/** Whether `body` (an `init.body`) is a stream, sent once. */
function isStream(body) {
  return (
    body != null &&
    (body instanceof ReadableStream ||
      (typeof body === 'object' &&
        typeof body[Symbol.asyncIterator] === 'function' &&
        !(body instanceof Blob) &&
        !(body instanceof FormData)))
  )
}

/** Pushes `stream`'s chunks into the engine's body stream, ending it either way. */
async function pump(stream, sink) {
  try {
    for await (const chunk of stream) {
      sink.push(Buffer.from(typeof chunk === 'string' ? Buffer.from(chunk) : chunk))
    }
    sink.finish()
  } catch (err) {
    sink.fail(String(err && err.message ? err.message : err))
  }
}

/** The engine's settings from `createFetch`'s options; a name it does not know is refused. */
function settings(options) {
  const out = {}
  for (const [name, value] of Object.entries(options ?? {})) {
    if (value === undefined) continue
    if (name === 'budget') {
      if (value === false) {
        out.retryBudget = false
      } else if (value === true) {
        out.retryBudget = true
      } else if (typeof value === 'object' && value !== null) {
        for (const [part, amount] of Object.entries(value)) {
          if (!(part in BUDGET)) {
            throw new TypeError(
              `budget.${part} is not an option; the budget takes ${Object.keys(BUDGET).join(', ')}`,
            )
          }
          out[BUDGET[part]] = amount
        }
      } else {
        throw new TypeError('budget is false (off), true, or { capacity, retryCost, ... }')
      }
      continue
    }
    if (!(name in OPTIONS)) {
      throw new TypeError(
        `${name} is not an option of createFetch; it takes ${[...Object.keys(OPTIONS), 'budget'].join(', ')}`,
      )
    }
    out[OPTIONS[name]] = value
  }
  return out
}

/** Methods fetch writes in capitals whatever their case (the Fetch standard's "normalize"). */
const NORMALIZED = new Set(['DELETE', 'GET', 'HEAD', 'OPTIONS', 'POST', 'PUT'])

/** Leading and trailing HTTP whitespace, which fetch strips from header values. */
const EDGES = /^[\t\n\r ]+|[\t\n\r ]+$/g

/** A method as fetch normalizes it. */
function method(given) {
  if (given === undefined) return 'GET'
  const upper = String(given).toUpperCase()
  return NORMALIZED.has(upper) ? upper : String(given)
}

/**
 * The request's parts without building a `Request`, for the common shapes: a string or `URL`
 * and a body that is absent, a string, bytes or `URLSearchParams`, with headers as an object,
 * pairs or `Headers`. `undefined` for anything else (a `Request`, a `Blob`, `FormData`, a
 * stream), which takes the `Request` path. The result is what fetch itself would send: the
 * same method, header names in lower case, values stripped, and a string's or form's
 * `Content-Type` when none is given.
 */
function direct(input, init) {
  if (typeof input !== 'string' && !(input instanceof URL)) return undefined
  const given = init?.body
  let body
  let type
  if (given === undefined || given === null) {
    body = undefined
  } else if (typeof given === 'string') {
    body = Buffer.from(given)
    type = 'text/plain;charset=UTF-8'
  } else if (given instanceof ArrayBuffer) {
    body = Buffer.from(given)
  } else if (ArrayBuffer.isView(given)) {
    body = Buffer.from(given.buffer, given.byteOffset, given.byteLength)
  } else if (given instanceof URLSearchParams) {
    body = Buffer.from(given.toString())
    type = 'application/x-www-form-urlencoded;charset=UTF-8'
  } else {
    return undefined
  }
  const verb = method(init?.method)
  if (body !== undefined && (verb === 'GET' || verb === 'HEAD')) {
    throw new TypeError('Request with GET/HEAD method cannot have body.')
  }
  let url
  try {
    url = new URL(input).href
  } catch (err) {
    throw new TypeError(`Failed to parse URL from ${input}`, { cause: err })
  }
  const headers = []
  let typed = false
  const source = init?.headers
  if (source !== undefined && source !== null) {
    const plain = typeof source === 'object' && !Array.isArray(source) && !(source instanceof Headers) &&
      typeof source[Symbol.iterator] !== 'function'
    const entries = plain ? Object.entries(source) : new Headers(source)
    for (const [name, value] of entries) {
      const lower = name.toLowerCase()
      if (lower === 'content-type') typed = true
      headers.push([lower, String(value).replace(EDGES, '')])
    }
  }
  if (type !== undefined && !typed) headers.push(['content-type', type])
  return { method: verb, url, headers, body, signal: init?.signal ?? undefined, sink: undefined }
}

/** The request's parts through a `Request`, as fetch builds one: any input, any body. */
async function viaRequest(input, init) {
  const streamed = isStream(init?.body)
  const request = new Request(input, streamed ? { ...init, duplex: 'half' } : init)
  const headers = []
  for (const pair of request.headers) headers.push(pair)
  let body
  let sink
  let stream
  if (streamed) {
    sink = new native.BodyStream()
    stream = request.body
  } else if (request.body !== null) {
    body = Buffer.from(await request.arrayBuffer())
  }
  return { method: request.method, url: request.url, headers, body, signal: request.signal, sink, stream }
}

/**
 * A `fetch` over the engine: `(input, init?) => Promise<Response>`. Every option is
 * optional; see index.d.ts for each one's meaning and default.
 */
function createFetch(options) {
  let engine
  try {
    engine = new native.Engine(settings(options))
  } catch (err) {
    // A bad value is a TypeError, as the option's own checks give; a ledger or TLS file that
    // cannot be opened an Error, with the cause in its message.
    if (err instanceof TypeError || err.code === 'InvalidArg') throw new TypeError(err.message)
    const error = new Error(err.message)
    error.code = err.code
    throw error
  }
  const keyHeader = engine.keyHeader

  async function idempotentFetch(input, init) {
    const request = direct(input, init) ?? (await viaRequest(input, init))
    const { signal, sink } = request
    signal?.throwIfAborted()
    // withIdempotencyKey's key comes first, as the Python package's `idempotency_key` block
    // does: it replaces a key header already there (an SDK's own random one, as stripe-node
    // puts on every POST, which a restart would forget).
    const contextKey = keys.getStore()
    let headers = request.headers
    if (contextKey !== undefined) {
      headers = headers.filter((pair) => pair[0] !== keyHeader)
      headers.push([keyHeader, contextKey])
    }
    let operation
    try {
      operation = engine.start({ method: request.method, url: request.url, headers, body: request.body }, sink)
    } catch (err) {
      // A method, header or key the engine refuses: nothing was sent.
      throw new IdempotentFetchError(err.message, {
        outcome: 'not_done',
        key: contextKey ?? null,
        kind: 'invalid_request',
        cause: err,
      })
    }
    if (sink !== undefined) {
      pump(request.stream, sink)
    }
    let answer
    if (signal === undefined) {
      answer = await operation.wait()
    } else {
      // An abort drops the operation where it stands; `wait` rejects once it is dropped (its
      // lease's release registered, so a send of the same key right after waits for it),
      // unless it ended first, and then its answer stands, as fetch's does.
      const onAbort = () => operation.cancel()
      signal.addEventListener('abort', onAbort, { once: true })
      try {
        answer = await operation.wait()
      } catch (err) {
        if (signal.aborted) throw signal.reason
        throw err
      } finally {
        signal.removeEventListener('abort', onAbort)
      }
    }
    if (answer.outcome === 'done' && answer.errorKind == null && answer.status != null) {
      if (answer.status < 200 || answer.status > 599) {
        throw toError(
          { ...answer, outcome: 'done', message: `the final answer's status ${answer.status} cannot be a Response` },
          operation,
          request.url,
          keyHeader,
        )
      }
      const response = toResponse(answer, operation, request.url, keyHeader)
      if (answer.streamed && signal !== undefined) {
        // An abort after the head stops the body, as fetch's does.
        signal.addEventListener('abort', () => operation.cancel(), { once: true })
      }
      return response
    }
    throw toError(answer, operation, request.url, keyHeader)
  }

  Object.defineProperty(idempotentFetch, 'keyHeader', { value: keyHeader, enumerable: true })
  /** Closes the ledger (an SQLite file checkpoints its log); later requests still go out. */
  idempotentFetch.close = () => engine.close()
  return idempotentFetch
}

/** A key derived from a scope and parts that survive a restart: the Rust crate's derivation. */
function derive(scope, parts = []) {
  if (typeof scope !== 'string' || !Array.isArray(parts) || parts.some((p) => typeof p !== 'string')) {
    throw new TypeError('derive(scope, parts) takes a string and an array of strings')
  }
  return native.derive(scope, parts)
}

/** JSON text of `args`, refusing what JSON cannot say (NaN, the infinities). */
function json(args) {
  return JSON.stringify(args, (_, value) => {
    if (typeof value === 'number' && !Number.isFinite(value)) {
      throw new TypeError(`a tool call's arguments hold ${value}, which JSON cannot say`)
    }
    return value
  })
}

/** A key for one tool call: the Rust crate's `for_tool_call` (RFC 8785 canonical JSON). */
function forToolCall(name, args) {
  if (typeof name !== 'string') throw new TypeError('forToolCall(name, args): name is a string')
  const text = json(args)
  if (text === undefined) throw new TypeError("a tool call's arguments must be JSON")
  return native.forToolCall(name, text)
}

/**
 * Runs `fn` with `key` as the idempotency key of every request made inside it, an SDK's
 * included: it takes the place of a key header the request carries (stripe-node puts a random
 * one on every POST).
 */
function withIdempotencyKey(key, fn) {
  if (typeof key !== 'string' || key.length === 0) {
    throw new TypeError('withIdempotencyKey(key, fn): key is a non-empty string')
  }
  return keys.run(key, fn)
}

/** The key `withIdempotencyKey` set here, or `undefined`. */
function currentIdempotencyKey() {
  return keys.getStore()
}

/** The report of a response this package's fetch gave, or `undefined` for another. */
function reportOf(response) {
  return response?.report
}

module.exports = {
  createFetch,
  derive,
  forToolCall,
  withIdempotencyKey,
  currentIdempotencyKey,
  reportOf,
  IdempotentFetchError,
}
