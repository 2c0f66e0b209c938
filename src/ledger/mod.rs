//! The durable operation ledger: what must outlive the process that sends a request.
//!
//! It keeps when an operation started, whether it completed, and whether a worker is sending
//! it now, so that the window spans restarts, a finished operation is replayed instead of
//! sent, and two workers never race (why: `docs/ledger.md`).
//!
//! A [`Ledger`] keeps one row per idempotency key; the client claims the row before the
//! first attempt, records every attempt that a retry follows, and writes the outcome at the
//! end. The contract, the records, the row transitions and [`MemoryLedger`] come from
//! `idempotent-retry-ledger` (for implementers of a ledger of their own); the backends are
//! features: `SqliteLedger` (feature `sqlite`, one machine) and `PostgresLedger` (feature
//! `postgres`, a fleet of workers sharing one table). [`LedgerOptions`] is how the client
//! uses a ledger: leases, what a response keeps, how long a call may take.
//!
//! ```
//! use idempotent_retry::Client;
//! use idempotent_retry::ledger::{LedgerOptions, MemoryLedger};
//!
//! let client = Client::builder()
//!     .ledger(MemoryLedger::new())
//!     .ledger_options(LedgerOptions::default())
//!     .build()?;
//! # drop(client);
//! # Ok::<(), idempotent_retry::Error>(())
//! ```
//!
//! May import: time, keys, rules, message, outcome, decision, telemetry.

mod bounded;
mod offset;
mod options;
pub(crate) mod reconcile;
mod release;
mod renewal;
pub(crate) mod seal;
mod session;

pub use idempotent_retry_ledger::*;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use idempotent_retry_postgres::{PostgresLedger, PostgresLedgerBuilder};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use idempotent_retry_sqlite::SqliteLedger;
pub use options::{LeaseHeldPolicy, LedgerOptions};
pub use seal::{InvalidSealKey, SealKey};

pub(crate) use bounded::Bounded;
pub(crate) use renewal::{kept, renew_every, wait_unless_lost};
pub(crate) use session::{
    Begin, HeldRow, LedgerHandle, LedgerRun, Operation, can_replay, claim, resume,
};
