//! The outbox: an operation committed with the caller's own data. [`Enqueue`] describes it;
//! [`sqlite::enqueue`] (feature `sqlite`) or [`postgres::enqueue`] (feature `postgres`) writes
//! it into the caller's open transaction (or [`sqlx::enqueue`], feature `sqlx-postgres`, for
//! a `sqlx::Transaction<'_, Postgres>`), as a row of the ledger with the status `queued`; a
//! [`Dispatcher`] sends it under its key once that transaction has committed. A rollback
//! leaves nothing; a commit makes the send certain, across any crash, and the ledger makes it
//! happen once. What is guaranteed and what is not: `docs/outbox.md`.
//!
//! This folder sits on top: it drives the client (`client/`) and reads the ledger.
//!
//! May import: time, keys, rules, message, outcome, decision, telemetry, ledger, engine, client.

mod dispatch;
mod enqueue;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlx-postgres")]
pub mod sqlx;

pub use crate::ledger::outbox::{Backlog, DueQuery, Enqueued, QueuedOperation};
pub use dispatch::{Delivery, DispatchPass, Dispatcher};
pub use enqueue::Enqueue;
