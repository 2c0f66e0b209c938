//! The decision after each attempt: the [`RetryPolicy`](crate::RetryPolicy) it reads
//! (`policy.rs`), the pure `decide` (`decide.rs`) that every front end shares, and the
//! [`RetryBudget`](crate::RetryBudget) that admits or refuses a retry (`budget.rs`). Pure
//! apart from the budget's shared counter: no clock, no I/O.
//!
//! May import: time, keys, rules, message, outcome.

pub(crate) mod budget;
pub(crate) mod decide;
pub(crate) mod policy;
