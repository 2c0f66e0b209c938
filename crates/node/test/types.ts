// Compiled by `tsc --strict` (tsconfig.json), never run: the package's types as a user writes them.
import {
  createFetch,
  derive,
  forToolCall,
  withIdempotencyKey,
  reportOf,
  IdempotentFetchError,
  type Fetch,
  type IdempotentFetch,
  type Report,
  type Outcome,
} from '../index.js'

const idempotentFetch: IdempotentFetch = createFetch({
  attempts: 5,
  baseDelayMs: 200,
  windowMs: 24 * 3600_000,
  budget: { capacity: 100 },
  redirect: 'follow',
  ledger: './ledger.db',
})
// An SDK's `fetch` option takes it as it is.
const asFetch: Fetch = idempotentFetch
void asFetch

async function charge(): Promise<string> {
  const key = forToolCall('charge', { amount: 100, currency: 'eur' })
  const response = await withIdempotencyKey(key, () =>
    idempotentFetch('https://api.example/charges', { method: 'POST', body: '{}' }),
  )
  const report: Report = response.report
  const again: Report | undefined = reportOf(response)
  void again
  return `${report.key ?? derive('charges', ['order-1'])}: ${report.attempts}`
}

async function handle(): Promise<Outcome | null> {
  try {
    await charge()
    return null
  } catch (err) {
    if (err instanceof IdempotentFetchError) {
      const status: number | undefined = err.response?.status
      void status
      return err.outcome
    }
    throw err
  }
}
void handle
idempotentFetch.close()
