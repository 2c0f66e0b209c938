//! What the caller is told: the one [`Error`](crate::Error) type (`error.rs`), the three-way
//! [`Outcome`](crate::Outcome) (`operation_outcome.rs`), the [`RetryReport`](crate::RetryReport)
//! (`report.rs`), the rule for whether an operation may have run (`exposure.rs`), what the
//! ledger holds under a reused key (`held.rs`), and the [`Observer`](crate::Observer) hook
//! (`observe.rs`). These are the words every layer above speaks; nothing here decides or sends.
//!
//! May import: time, keys, rules, message.

pub(crate) mod error;
pub(crate) mod exposure;
pub(crate) mod held;
pub mod observe;
pub(crate) mod operation_outcome;
pub mod report;
