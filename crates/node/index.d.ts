// The public types of the npm package `idempotent-retry` (checked with `tsc --strict`).

/** `fetch`'s signature: what openai-node, stripe-node and the MCP SDK take as `fetch`. */
export type Fetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>

/** The options of `createFetch`; each one absent keeps its default. Durations in milliseconds. */
export interface CreateFetchOptions {
  /** Attempts in all, the first included. Default 5. */
  attempts?: number
  /** The backoff's base delay (full jitter, doubled per retry). Default 500. */
  baseDelayMs?: number
  /** The backoff's cap. Default 30 000. */
  maxDelayMs?: number
  /** One attempt's timeout. Default 30 000. */
  attemptTimeoutMs?: number
  /** The reconcile window: how long the receiver keeps a key; no attempt after it. Default a day. */
  windowMs?: number
  /** The longest `Retry-After` honoured; a longer one ends the operation. Default 60 000. */
  maxRetryAfterMs?: number
  /** How long a receiver's "in progress" (a keyed 409) is waited out. Default 60 000. */
  maxInProgressWaitMs?: number
  /** The retry budget: `false` turns it off; the numbers size it. Default on, 500 tokens. */
  budget?: boolean | RetryBudgetOptions
  /** `'follow'` (default): redirects are followed, the key kept on the same origin; `'manual'`: a redirect is the answer. */
  redirect?: 'follow' | 'manual'
  /** Origins besides a request's own that its key may go to on a redirect. Default none. */
  allowKeyTo?: string[]
  /** The key header's name. Default `Idempotency-Key`. */
  keyHeader?: string
  /**
   * The operation ledger: an SQLite file's path (created if missing) or a `postgres://` URL,
   * the same rows Rust, Python and idemcurl use. Default none (keys live as long as the call).
   */
  ledger?: string
  /** The ledger's lease on an operation in flight, renewed while it runs. Default 10 000. */
  leaseMs?: number
  /** How long a request whose key another live run holds waits for it. Default 240 000. */
  leaseWaitMs?: number
  /** This process's name in the ledger's rows. Default host name and process id. */
  worker?: string
  /** Every operation filed under this scope in the ledger. Default the URL's host. */
  scope?: string
  /** `false`: no certificate is verified. Default `true`. */
  rejectUnauthorized?: boolean
  /** A PEM file of the only roots trusted. Default the platform's. */
  caFile?: string
  /** A PEM file with a client certificate (and its key, without `keyFile`). */
  certFile?: string
  /** A PEM file with the client certificate's key. */
  keyFile?: string
  /** Every request through this `http://` or `https://` proxy. Default none. */
  proxy?: string
  /** Bytes up to which an answer with a `Content-Length` is read inside its attempt (a cut one is retried). Default 1 MiB. */
  answerReadLimit?: number
  /** The longest answer body the ledger keeps, in bytes. Default 64 KiB. */
  maxSavedBody?: number
  /** Whether a succeeded operation whose answer was not saved is sent again with its key. Default `true`. */
  fetchUnsavedAnswers?: boolean
  /**
   * Keys that seal saved answers at rest, each `'ID:HEX'` (an id, a colon, 64 hex digits of
   * secret). The first seals; every key opens the rows sealed under its id (rotation: new key
   * first, old ones kept until their rows expire). An answer no key opens is refused, never
   * replayed. Default none (answers stored as they came).
   */
  sealKeys?: string[]
  /** Query parameters whose values a ledger row's URL keeps; every other is stored as `…`. Default none. */
  keepQueryParams?: string[]
}

/** The retry budget's numbers (the AWS SDKs' standard ones by default). */
export interface RetryBudgetOptions {
  /** Tokens in all. Default 500. */
  capacity?: number
  /** Tokens a retry after a failure costs. Default 5. */
  retryCost?: number
  /** Tokens a retry after a timeout costs. Default 10. */
  timeoutCost?: number
  /** Tokens a first-attempt success gives back. Default 1. */
  successReward?: number
}

/** One attempt of an operation. */
export interface Attempt {
  /** 1 for the first. */
  readonly number: number
  /** When it started, in milliseconds from the first attempt's start. */
  readonly startedMs: number
  /** Its response's status, when it had one. */
  readonly status: number | null
  /** How it failed (`connect`, `timeout`, `connection_reset`, `server_error`, ...) when it was not final. */
  readonly failure: string | null
  /** Milliseconds waited after it, when another attempt followed. */
  readonly waitMs: number | null
}

/** What every response of this package's fetch carries as `response.report`. */
export interface Report {
  /** Attempts sent by this run (0 when replayed from the ledger). */
  readonly attempts: number
  /** The operation's key, `null` when it went without one. */
  readonly key: string | null
  /** Whether the answer was replayed from the ledger, nothing sent. */
  readonly replayed: boolean
  /** Whether the answer was fetched again with its key, the ledger not having kept its body. */
  readonly refetched: boolean
  /** From the first attempt's start to the last's end, plus `leaseWaitMs`. */
  readonly elapsedMs: number
  /** How long the ledger's claim waited for another run holding the key. */
  readonly leaseWaitMs: number
  /** Keyed 409s ("in progress") waited out. */
  readonly inProgressWaits: number
  /** Why the answer was not recorded as this run's outcome, when it was not. */
  readonly unrecorded: string | null
  /** `'done'` for every response. */
  readonly outcome: 'done'
  readonly history: readonly Attempt[]
}

/** A response of this package's fetch: Node's own `Response`, with the report. */
export interface IdempotentResponse extends Response {
  readonly report: Report
}

/** What an operation ended as: done, certainly not done, or perhaps done. */
export type Outcome = 'done' | 'not_done' | 'unknown'

/**
 * Why an operation ended without an answer to give: a `TypeError`, as `fetch`'s network errors
 * are. `outcome` is `'not_done'` when it certainly did not happen (send it again freely),
 * `'unknown'` when it may have (reconcile by `key` before anything else), `'done'` when it
 * happened and its answer cannot be had (a body cut while streamed; an unsaved answer).
 */
export declare class IdempotentFetchError extends TypeError {
  readonly outcome: Outcome
  readonly key: string | null
  readonly attempts: number
  readonly history: readonly Attempt[]
  /** Why it stopped: `attempts_exhausted`, `transport`, `key_reuse`, `body_not_replayable`, `lease_held`, `body`, ... */
  readonly kind: string | null
  /** How the last attempt failed. */
  readonly failure: string | null
  /** The last attempt's response, when the operation stopped on one. */
  readonly response: IdempotentResponse | null
  readonly isOutcomeUnknown: boolean
}

/** A fetch over the engine, with the key header's name and a way to close its ledger. */
export interface IdempotentFetch extends Fetch {
  (input: string | URL | Request, init?: RequestInit): Promise<IdempotentResponse>
  /** The key header's name, lowercase. */
  readonly keyHeader: string
  /** Closes the ledger (an SQLite file checkpoints its log, up to 5 s); later requests still go out. */
  close(): void
}

/**
 * A `fetch` over the engine. Throws a `TypeError` for an option it does not know or a bad
 * value, and an `Error` when the ledger cannot be opened (the cause in its message).
 */
export declare function createFetch(options?: CreateFetchOptions): IdempotentFetch

/** A key derived from a scope and parts that survive a restart: the Rust crate's `IdempotencyKey::derive`. */
export declare function derive(scope: string, parts?: string[]): string

/** A key for one tool call (RFC 8785 canonical arguments): the Rust crate's `IdempotencyKey::for_tool_call`. Throws a `TypeError` for arguments JSON cannot say. */
export declare function forToolCall(name: string, args: unknown): string

/** Runs `fn` with `key` as the key of every request made inside it, in place of a key header the request carries (an SDK's own). */
export declare function withIdempotencyKey<T>(key: string, fn: () => T): T

/** The key `withIdempotencyKey` set here, or `undefined`. */
export declare function currentIdempotencyKey(): string | undefined

/** The report of a response this package's fetch gave, or `undefined` for another. */
export declare function reportOf(response: Response): Report | undefined
