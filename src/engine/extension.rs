//! Options for one request that ride in its extensions: how the tower and middleware front
//! ends are told what [`RequestBuilder`](crate::RequestBuilder)'s methods tell the client.
//!
//! | extension | `RequestBuilder` equivalent |
//! |---|---|
//! | [`IdempotencyKey`] | [`idempotency_key`](crate::RequestBuilder::idempotency_key) |
//! | [`RetryPolicy`] | [`policy`](crate::RequestBuilder::policy) |
//! | [`WithoutIdempotencyKey`] | [`without_idempotency_key`](crate::RequestBuilder::without_idempotency_key) |
//! | [`LedgerScope`] | [`ledger_scope`](crate::RequestBuilder::ledger_scope) |
//!
//! [`RequestBuilder::build`](crate::RequestBuilder::build) puts its options into the built
//! `reqwest::Request` in these forms, and [`Client::execute`](crate::Client::execute) reads
//! them back.

use http::Extensions;

use crate::decision::policy::RetryPolicy;
use crate::engine::settings::Overrides;
use crate::keys::key::IdempotencyKey;

/// Marks one request as taking no automatic key: the extension form of
/// [`RequestBuilder::without_idempotency_key`](crate::RequestBuilder::without_idempotency_key),
/// for the tower service (an `http::Request`'s extensions) and the `reqwest-middleware`
/// middleware (`.with_extension(WithoutIdempotencyKey)`).
///
/// A non-idempotent request (`POST`, `PATCH`, ...) carrying it gets no random key, and is then
/// resent only when no attempt can have reached the server (DNS and connect failures). A key
/// given as an [`IdempotencyKey`] extension or in the key header is still sent on every
/// attempt. It does nothing to idempotent methods, which get no automatic key anyway.
///
/// `reqwest::Request` has no public extensions, so the tower service over `reqwest::Client`
/// cannot take it: turn automatic keys off for that service with
/// [`ClientBuilder::auto_keys`](crate::ClientBuilder::auto_keys).
/// [`Client::execute`](crate::Client::execute) does read it, from a request built by
/// [`RequestBuilder::build`](crate::RequestBuilder::build) or converted from an `http::Request`.
///
/// # Examples
///
/// ```
/// use idempotent_retry::WithoutIdempotencyKey;
///
/// let mut request = http::Request::post("https://api.example.com/v1/ping")
///     .body(String::new())
///     .expect("valid request");
/// request.extensions_mut().insert(WithoutIdempotencyKey);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct WithoutIdempotencyKey;

/// The operation's scope in the [`Ledger`](crate::ledger::Ledger) for one request (`stripe.charge`,
/// `agent.send_email`): the extension form of
/// [`RequestBuilder::ledger_scope`](crate::RequestBuilder::ledger_scope), for the tower service
/// (an `http::Request`'s extensions) and the `reqwest-middleware` middleware
/// (`.with_extension(LedgerScope::new("stripe.charge"))`). It names what kind of operation the
/// key belongs to and which retention applies
/// ([`LedgerOptions::scope_retention`](crate::ledger::LedgerOptions::scope_retention)).
///
/// Default, without it: the request's host.
///
/// # Examples
///
/// ```
/// use idempotent_retry::LedgerScope;
///
/// let mut request = http::Request::post("https://api.example.com/v1/charges")
///     .body(String::from("{}"))
///     .expect("valid request");
/// request.extensions_mut().insert(LedgerScope::new("stripe.charge"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LedgerScope(String);

impl LedgerScope {
    /// A scope named `scope`.
    pub fn new(scope: impl Into<String>) -> Self {
        LedgerScope(scope.into())
    }

    /// The scope's name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Overrides {
    /// The options a request carries in `extensions`.
    pub(crate) fn from_extensions(extensions: &Extensions) -> Self {
        Overrides {
            key: extensions.get::<IdempotencyKey>().cloned(),
            auto_key: extensions
                .get::<WithoutIdempotencyKey>()
                .map(|WithoutIdempotencyKey| false),
            policy: extensions.get::<RetryPolicy>().copied(),
            timeout: None,
            scope: extensions.get::<LedgerScope>().map(|scope| scope.0.clone()),
            held: None,
        }
    }

    /// Puts these options into `extensions` in the forms [`from_extensions`](Self::from_extensions)
    /// reads back. The timeout is not among them: a request type that carries one has its own
    /// field for it (`reqwest::Request::timeout`). `auto_key: Some(true)` is the front end's
    /// default, so only `Some(false)` leaves a mark.
    pub(crate) fn into_extensions(self, extensions: &mut Extensions) {
        if let Some(key) = self.key {
            extensions.insert(key);
        }
        if self.auto_key == Some(false) {
            extensions.insert(WithoutIdempotencyKey);
        }
        if let Some(policy) = self.policy {
            extensions.insert(policy);
        }
        if let Some(scope) = self.scope {
            extensions.insert(LedgerScope(scope));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_become_overrides_and_back_and_explicit_ones_win() {
        let empty = Overrides::from_extensions(&Extensions::new());
        assert!(empty.key.is_none() && empty.auto_key.is_none() && empty.policy.is_none());

        let key = IdempotencyKey::new("ext-key").expect("valid");
        let mut ext = Extensions::new();
        ext.insert(key.clone());
        ext.insert(WithoutIdempotencyKey);
        ext.insert(RetryPolicy::default().with_max_attempts(2));
        ext.insert(LedgerScope::new("stripe.charge"));
        let given = Overrides::from_extensions(&ext);
        assert_eq!(given.scope.as_deref(), Some("stripe.charge"));
        assert_eq!(given.key.as_ref(), Some(&key));
        assert_eq!(given.auto_key, Some(false));
        assert_eq!(
            given.policy,
            Some(RetryPolicy::default().with_max_attempts(2))
        );

        let explicit = Overrides {
            auto_key: Some(true),
            policy: Some(RetryPolicy::default().with_max_attempts(3)),
            ..Overrides::default()
        };
        let mut carried = Extensions::new();
        Overrides {
            key: given.key.clone(),
            auto_key: given.auto_key,
            policy: given.policy,
            timeout: None,
            scope: given.scope.clone(),
            held: None,
        }
        .into_extensions(&mut carried);
        let back = Overrides::from_extensions(&carried);
        assert_eq!(back.key, given.key);
        assert_eq!(back.auto_key, Some(false));
        assert_eq!(back.policy, given.policy);
        assert_eq!(back.scope, given.scope);
        let mut none = Extensions::new();
        Overrides {
            auto_key: Some(true),
            ..Overrides::default()
        }
        .into_extensions(&mut none);
        assert!(none.is_empty(), "the default leaves no mark");

        let merged = explicit.or(given);
        assert_eq!(merged.key, Some(key));
        assert_eq!(merged.auto_key, Some(true));
        assert_eq!(
            merged.policy,
            Some(RetryPolicy::default().with_max_attempts(3))
        );
    }
}
