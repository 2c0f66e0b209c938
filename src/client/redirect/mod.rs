//! Redirects, followed by the crate itself so the key goes only where the caller sends it.
//!
//! `reqwest`'s own redirect support cannot do this: its policy sees neither the method nor the
//! headers, and across origins it strips only credentials, so an idempotency key would travel
//! to any origin a server names, and along on the `GET` that follows a 303. The
//! [`Client`](crate::Client) therefore builds its inner `reqwest::Client` with
//! `redirect::Policy::none()` and follows hops here, inside one attempt, by these rules:
//!
//! | status | next request | body and payload headers | key |
//! |---|---|---|---|
//! | 301, 302 on a `POST` | `GET` | dropped | dropped |
//! | 301, 302 on any other method | same method | kept | kept |
//! | 303 | `GET` (`HEAD` stays `HEAD`) | dropped | dropped |
//! | 307, 308 | same method | kept | kept |
//!
//! A hop that keeps the key (the operation itself is resent) is followed to the original
//! request's origin, and to another origin only when the [`RedirectPolicy`] allows it; a hop
//! that drops the key is a plain read and is followed anywhere. Credentials (`Authorization`,
//! `Cookie`, `Proxy-Authorization`, `WWW-Authenticate`) are removed as soon as a hop leaves the
//! origin it was sent to, as reqwest does. The pure parts (origins, `Location`, the method
//! rewrite) are plain functions with unit tests in `policy.rs`; `chain.rs` holds what the
//! caller is told of the hops, `follow.rs` the loop.

mod chain;
mod follow;
mod policy;

#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) use chain::warn_if_inner_redirected;
pub use chain::{RedirectChain, RedirectHop};
pub(crate) use follow::follow;
pub use policy::{RedirectPolicy, RedirectStop};
