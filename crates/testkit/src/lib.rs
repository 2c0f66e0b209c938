//! Test your sender, or your handler, by replaying deliveries through real faults and counting
//! side effects. The crate `idempotent-retry-testkit`, a dev-dependency.
//!
//! - [`Receiver`]: an HTTP/1.1 server on `127.0.0.1` that behaves like a Stripe-style
//!   idempotent receiver (per key: scope, SHA-256 fingerprint, `in_progress` / `completed` /
//!   `failed`, the saved response; an atomic claim), counts side effects per key and in total,
//!   and fails on script: [`Fault`] (resets before the handler or after the commit, stalls,
//!   closes, any status with retry hints, a slow handler) at a [`When`] (request number or key
//!   attempt).
//! - Your handler as the code under test ([`ReceiverBuilder::handler`]): it gets a
//!   [`Delivery`], performs its effect, calls [`Delivery::record_effect`], returns a [`Reply`];
//!   batched events, deduplicated per event id: [`ReceiverBuilder::batch`].
//! - [`Receiver::forget`] keeps a committed key unless given a [`Compensation`];
//!   [`Reply::release_key`] on one is refused and kept as a [`Violation`].
//! - Deterministic helpers: [`RecordingSleeper`], [`fixed_key`], [`loopback_http`].
//!
//! A test double, not a server to deploy: HTTP/1.1 only, one request per connection,
//! everything in memory.
//!
//! # Testing your own handler
//!
//! Put the handler's logic behind the receiver and replay deliveries at it: the receiver does
//! the idempotency bookkeeping a real deployment does in its database, and the counts say
//! whether the handler's effect ran once.
//!
//! ```
//! use idempotent_retry_testkit::{self as testkit, Delivery, Fault, Receiver, Reply, When};
//! use idempotent_retry::{Client, RetryPolicy};
//! use std::time::Duration;
//!
//! /// The code under test: send a welcome email for a signup.
//! async fn welcome(delivery: Delivery) -> Reply {
//!     let Ok(signup) = delivery.json::<serde_json::Value>() else {
//!         return Reply::status(400);
//!     };
//!     // ... the real email call would go here ...
//!     let n = delivery.record_effect();
//!     Reply::json(200, &serde_json::json!({ "email": n, "to": signup["email"] }))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let receiver = Receiver::builder()
//!     .scope("signup.welcome")
//!     .handler(welcome)
//!     .start()
//!     .await?;
//! let key = testkit::fixed_key(1);
//! // The first delivery sends the email, then the answer is lost.
//! receiver.inject(When::key_attempt(&key, 1), Fault::ResetAfterCommit);
//!
//! let client = Client::builder()
//!     .http(testkit::loopback_http()?)
//!     .policy(RetryPolicy::default().with_base_delay(Duration::from_millis(5)))
//!     .rng_seed(1)
//!     .build()?;
//! let response = client
//!     .post(receiver.url("/signups"))
//!     .idempotency_key(key.clone())
//!     .json(&serde_json::json!({ "email": "ada@example.com" }))
//!     .send()
//!     .await?;
//!
//! assert_eq!(response.status(), 200);
//! assert_eq!(receiver.effects_for(key.as_str()), 1); // one email, two deliveries
//! assert_eq!(receiver.arrivals(), 2);
//! # Ok(()) }
//! ```
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod conformance;
mod deterministic;
mod fault;
mod handler;
mod receiver;
mod records;
mod state;
#[doc(hidden)]
pub mod wire;

pub use conformance::{ConformanceFailure, ConformanceReport, ledger_conformance};
pub use deterministic::{RecordingSleeper, fixed_key, loopback_http};
pub use fault::{Canned, Fault, RetryAfter, When};
pub use handler::{Delivery, Reply};
pub use receiver::{REPLAYED_HEADER, Receiver, ReceiverBuilder};
pub use records::{
    Arrival, Compensated, Compensation, ForgetError, Handling, KeyRecord, KeyStatus,
    ReplayableResponse, Violation,
};
