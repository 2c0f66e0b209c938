//! The request and the answer as every front end hands them to the engine: the
//! [`RetryRequest`](crate::RetryRequest) and [`RetryResponse`](crate::RetryResponse) traits
//! and their implementations (`exchange.rs`), a body read up to a cap (`body.rs`), a streamed
//! body whose failure names the key (`noted_body.rs`), and URLs shown without credentials
//! (`url.rs`).
//!
//! May import: time, keys.

pub(crate) mod body;
pub(crate) mod exchange;
pub(crate) mod noted_body;
pub(crate) mod url;
