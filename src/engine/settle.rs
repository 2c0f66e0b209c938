//! The settle stage: what one request asks for (its overrides, from the front end and its
//! extensions), the policy that applies, and the operation's key, written into the request
//! once, before the first attempt exists: every attempt is a clone of this request.

use std::time::Duration;

use http::Method;
use http::header::{Entry, HeaderMap, HeaderName};

use crate::decision::policy::RetryPolicy;
use crate::engine::settings::{Overrides, Settings};
use crate::keys::key::{IdempotencyKey, is_idempotent_method};
use crate::message::exchange::RetryRequest;
use crate::outcome::error::Error;
use crate::telemetry::operation;

/// One operation, settled: nothing about it changes from here on.
#[derive(Debug)]
pub(super) struct Settled {
    pub(super) method: Method,
    pub(super) policy: RetryPolicy,
    pub(super) key: Option<IdempotencyKey>,
    /// Whether `key` was minted at random for this operation (no key given, derived or in the
    /// header): no other request can have been sent with it.
    pub(super) minted_key: bool,
    pub(super) attempt_timeout: Duration,
    pub(super) scope: Option<String>,
    /// The row a dispatcher already took for the operation: no claim of its own.
    pub(super) held: Option<crate::ledger::HeldRow>,
    /// The operation's `idempotent_request` span, opened once the key is settled: every
    /// stage after this one runs in it.
    pub(super) span: tracing::Span,
}

/// Settles `request` as one operation.
///
/// # Errors
///
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder) for an invalid policy, a zero timeout,
/// a key header set twice or two different keys; [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey)
/// for a key header that is not a valid key. Nothing has been sent.
pub(super) fn settle<Q: RetryRequest>(
    settings: &Settings,
    request: &mut Q,
    overrides: Overrides,
) -> Result<Settled, Error> {
    let overrides = match request.extensions() {
        Some(ext) => overrides.or(Overrides::from_extensions(ext)),
        None => overrides,
    };
    let policy = settings.policy_for(overrides.policy, request.host());
    policy.validate()?;
    if overrides.timeout.is_some_and(|timeout| timeout.is_zero()) {
        return Err(Error::builder("the request's timeout must be positive"));
    }
    let method = request.method().clone();
    let (key, minted_key) = attach_key(
        request.headers_mut(),
        &method,
        &settings.key_header,
        overrides.key,
        overrides.auto_key.unwrap_or(settings.auto_keys),
    )?;
    let span = operation::open(&method, request.host(), key.as_ref(), settings.key_in_spans);
    Ok(Settled {
        method,
        policy,
        key,
        minted_key,
        attempt_timeout: overrides.timeout.unwrap_or(policy.attempt_timeout()),
        scope: overrides.scope,
        held: overrides.held,
        span,
    })
}

/// Settles the operation's key and puts it in the request's headers (one lookup of the
/// header, whether it is there or not); `true` with a key minted here at random.
fn attach_key(
    headers: &mut HeaderMap,
    method: &Method,
    header: &HeaderName,
    explicit: Option<IdempotencyKey>,
    auto_key: bool,
) -> Result<(Option<IdempotencyKey>, bool), Error> {
    let slot = match headers.entry(header) {
        Entry::Occupied(values) => {
            // A key the caller put in the header stays exactly as given (its bytes are the
            // key's, and its sensitivity flag is kept).
            let mut values = values.iter();
            let (Some(value), None) = (values.next(), values.next()) else {
                return Err(Error::builder(format!(
                    "the {header} header is set more than once"
                )));
            };
            // The raw bytes are checked, so a value with obs-text (bytes 0x80 and up) or a tab
            // is refused with the offending byte and its index, like any other invalid key.
            let in_header = IdempotencyKey::from_header_bytes(value.as_bytes())
                .map_err(|reason| Error::invalid_key(reason, "set in a header"))?;
            return match explicit {
                Some(explicit) if explicit != in_header => Err(Error::builder(format!(
                    "two different idempotency keys: one given, another in the {header} header"
                ))),
                _ => Ok((Some(in_header), false)),
            };
        }
        Entry::Vacant(slot) => slot,
    };
    // Only a key from elsewhere is written in.
    let (key, minted) = match explicit {
        Some(key) => (key, false),
        None if auto_key && !is_idempotent_method(method) => (IdempotencyKey::random(), true),
        None => return Ok((None, false)),
    };
    slot.insert(key.to_header_value());
    Ok((Some(key), minted))
}
