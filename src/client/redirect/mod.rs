//! Redirects, followed by the crate itself so the key goes only where the caller sends it.
//!
//! The [`Client`](crate::Client) builds its inner `reqwest::Client` with
//! `redirect::Policy::none()` and follows hops here, inside one attempt (why reqwest's own
//! support cannot keep the key on its origin: `docs/redirects.md`), by these rules:
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
//! caller is told of the hops, `follow.rs` the loop, `answered.rs` the redirects a caller above
//! the client followed itself before the operation
//! ([`RequestBuilder::after_redirect`](crate::RequestBuilder::after_redirect)).

mod answered;
mod chain;
mod follow;
mod policy;

pub(crate) use answered::AnsweredRedirect;
#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) use chain::warn_if_inner_redirected;
pub use chain::{RedirectChain, RedirectHop};
pub(crate) use follow::follow;
pub use policy::{RedirectPolicy, RedirectStop};
