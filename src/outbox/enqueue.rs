//! An operation to queue in the caller's transaction: the request as the dispatcher will send
//! it, its key, and the fingerprint the client computes for it, checked to carry no
//! credentials.

use std::time::{Duration, SystemTime};

use http::Method;
use http::header::{
    AUTHORIZATION, CONTENT_TYPE, COOKIE, HeaderMap, HeaderName, HeaderValue, PROXY_AUTHORIZATION,
};
use reqwest::Url;
use serde::Serialize;

use crate::client::IDEMPOTENCY_KEY;
use crate::keys::fingerprint::RequestFingerprint;
use crate::keys::key::IdempotencyKey;
use crate::ledger::outbox::QueuedOperation;
use crate::message::url::without_credentials;
use crate::outcome::error::Error;

/// Headers that carry credentials by convention, refused besides `Authorization`,
/// `Proxy-Authorization` and `Cookie`: the ledger is no place for secrets.
const CREDENTIAL_HEADERS: &[&str] = &[
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-access-token",
    "x-amz-security-token",
];

/// An operation to queue in the caller's own transaction (the outbox), for a
/// [`Dispatcher`](super::Dispatcher) to send under its key once the transaction commits.
///
/// ```
/// use idempotent_retry::IdempotencyKey;
/// use idempotent_retry::outbox::Enqueue;
///
/// let charge = Enqueue::post("https://api.stripe.com/v1/charges")
///     .key(IdempotencyKey::derive("order", &["ord_42", "charge"]))
///     .json(&serde_json::json!({"amount": 1200, "currency": "eur"}))
///     .scope("stripe.charge");
/// # let _ = charge;
/// ```
///
/// Credentials are never stored: a request carrying `Authorization`, `Proxy-Authorization`,
/// `Cookie`, an API-key header, a URL with a user name or a query value under a
/// credential-looking name (`?api_key=`, `?token=`, `?sig=`) is refused at enqueue; the dispatcher
/// adds them at send time (the client's default headers, or
/// [`Dispatcher::headers_for`](super::Dispatcher::headers_for)).
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | [`key`](Self::key) | a random key, stored with the row (so every attempt, in any process, sends the same one) |
/// | [`scope`](Self::scope) | the URL's host, as the client's |
/// | [`delay`](Self::delay) | none: due at commit |
/// | [`retention`](Self::retention) | one day after it is due (a queued row is never purged) |
#[derive(Debug, Clone)]
#[must_use]
pub struct Enqueue {
    method: Method,
    url: String,
    key: Option<IdempotencyKey>,
    headers: HeaderMap,
    body: Vec<u8>,
    scope: Option<String>,
    delay: Duration,
    retention: Duration,
    invalid: Option<String>,
}

impl Enqueue {
    /// An operation sending `method` to `url` (absolute, `http` or `https`).
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Enqueue {
            method,
            url: url.into(),
            key: None,
            headers: HeaderMap::new(),
            body: Vec::new(),
            scope: None,
            delay: Duration::ZERO,
            retention: Duration::from_secs(86_400),
            invalid: None,
        }
    }

    /// A `POST` to `url`.
    pub fn post(url: impl Into<String>) -> Self {
        Self::new(Method::POST, url)
    }

    /// The idempotency key it is sent under. Default: a random one, stored with the row.
    pub fn key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// A header sent with it (never a credential: those are refused at enqueue).
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        match (name.try_into(), value.try_into()) {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            _ => self.note_invalid("a header name or value is not valid HTTP"),
        }
        self
    }

    /// `value` as a JSON body, with `Content-Type: application/json`.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.headers
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                self.body = body;
            }
            Err(err) => self.note_invalid(&format!("the JSON body cannot be serialized: {err}")),
        }
        self
    }

    /// The body, byte for byte. Default: none.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The ledger scope (retention, reconcilers). Default: the URL's host.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Not sent until this long after it is queued (on the ledger's clock). Default: zero.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// How long its row is kept after it is due, at least. Default: one day.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    fn note_invalid(&mut self, why: &str) {
        self.invalid.get_or_insert_with(|| why.to_owned());
    }

    /// The row a store inserts, queued at `now` (the caller's clock; the PostgreSQL outbox
    /// keeps only the delay and takes the database's), and its key: what
    /// `outbox::sqlite::enqueue` and `outbox::postgres::enqueue` write, for a store
    /// of your own.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) for a URL that is not absolute
    /// `http` or `https`, a URL with a user name or password or a query value under a name
    /// that looks like a credential's (`api_key`, `token`, `sig`, `password`: see
    /// `idempotent_retry::ledger::looks_like_credential`), a credential header, an
    /// idempotency-key header (pass [`key`](Self::key)), or a header or body that could not
    /// be built.
    pub fn operation(&self, now: SystemTime) -> Result<(IdempotencyKey, QueuedOperation), Error> {
        if let Some(why) = &self.invalid {
            return Err(Error::builder(format!("outbox: {why}")));
        }
        let mut url = Url::parse(&self.url).map_err(|err| {
            Error::builder(format!(
                "outbox: {:?} is not an absolute URL ({err}); pass one such as \
                 https://api.example.com/v1/charges",
                self.url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(Error::builder(format!(
                "outbox: {} is not an http or https URL",
                without_credentials(&url)
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Error::builder(format!(
                "outbox: the URL {} carries credentials, and the ledger never stores them: \
                 add them at send time (the client's default headers, or \
                 Dispatcher::headers_for)",
                without_credentials(&url)
            )));
        }
        // A queued row keeps the URL it is sent to, query values included (a claim's row
        // redacts them): a value under a credential's name is refused, as the headers are.
        if let Some((name, _)) = url.query_pairs().find(|(name, value)| {
            !value.is_empty() && idempotent_retry_ledger::looks_like_credential(name)
        }) {
            return Err(Error::builder(format!(
                "outbox: the query parameter {name:?} of {} looks like a credential, and a \
                 queued row keeps its URL as it will be sent: pass the credential in a header \
                 added at send time (the client's default headers, or \
                 Dispatcher::headers_for), or send the request with the client directly, \
                 whose rows redact query values",
                crate::message::url::redacted(&url)
            )));
        }
        for name in self.headers.keys() {
            let credential = [AUTHORIZATION, PROXY_AUTHORIZATION, COOKIE].contains(name)
                || CREDENTIAL_HEADERS.contains(&name.as_str());
            if credential {
                return Err(Error::builder(format!(
                    "outbox: the {name} header carries credentials, and the ledger never \
                     stores them: add it at send time (the client's default headers, or \
                     Dispatcher::headers_for)"
                )));
            }
            if name == IDEMPOTENCY_KEY {
                return Err(Error::builder(format!(
                    "outbox: the key goes in Enqueue::key, not in a {name} header"
                )));
            }
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let value = value.to_str().map_err(|_| {
                Error::builder(format!(
                    "outbox: the {name} header's value is not visible ASCII, which the ledger \
                     keeps as text"
                ))
            })?;
            headers.push((name.as_str().to_owned(), value.to_owned()));
        }
        // Never sent: dropped here, as the client's fingerprint drops it.
        url.set_fragment(None);
        let key = self.key.clone().unwrap_or_else(IdempotencyKey::random);
        let fingerprint = RequestFingerprint::of_url(
            &self.method,
            url.clone(),
            self.headers.get(CONTENT_TYPE),
            &self.body,
        );
        let scope = self
            .scope
            .clone()
            .or_else(|| url.host_str().map(str::to_owned))
            .unwrap_or_default();
        let mut operation = QueuedOperation::new(
            key.as_str(),
            fingerprint.into_string(),
            (self.method.as_str(), url.as_str()),
            now,
        );
        operation.scope = scope;
        operation.headers = headers;
        operation.body = self.body.clone();
        operation.not_before = crate::ledger::later(now, self.delay);
        operation.retention = self.retention;
        Ok((key, operation))
    }
}

/// The error of an enqueue the store refused: nothing was written, the key is named.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(super) fn not_queued(key: &IdempotencyKey, source: crate::ledger::LedgerError) -> Error {
    Error::ledger(
        crate::outcome::report::RetryReport::new(Some(key.clone())),
        false,
        "could not queue the operation; nothing was written",
        source,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(enqueue: &Enqueue) -> Result<(IdempotencyKey, QueuedOperation), Error> {
        enqueue.operation(SystemTime::UNIX_EPOCH)
    }

    #[test]
    fn the_fingerprint_is_the_one_the_client_computes_for_the_same_request() {
        let body = br#"{"amount":1200}"#;
        let enqueue = Enqueue::post("https://api.example.com/v1/charges#x")
            .header("content-type", "application/json")
            .body(&body[..]);
        let (_, operation) = built(&enqueue).expect("valid");
        let client_side = RequestFingerprint::new(
            &Method::POST,
            "https://api.example.com/v1/charges",
            Some(&HeaderValue::from_static("application/json")),
            body,
        );
        assert_eq!(operation.fingerprint, client_side.as_str());
        assert_eq!(operation.url, "https://api.example.com/v1/charges");
        assert_eq!(operation.scope, "api.example.com");
    }

    #[test]
    fn credentials_are_refused_and_the_message_says_where_they_go() {
        for enqueue in [
            Enqueue::post("https://api.example.com/x").header("authorization", "Bearer sk_live"),
            Enqueue::post("https://api.example.com/x").header("Cookie", "session=1"),
            Enqueue::post("https://api.example.com/x").header("X-Api-Key", "k"),
            Enqueue::post("https://user:pw@api.example.com/x"),
        ] {
            let err = built(&enqueue).expect_err("a credential");
            assert_eq!(err.kind(), crate::ErrorKind::Builder);
            assert!(err.to_string().contains("never stores"), "{err}");
            assert!(err.to_string().contains("headers_for"), "{err}");
            assert!(!err.to_string().contains("sk_live"), "{err}");
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
    }

    #[test]
    fn a_query_value_under_a_credential_name_is_refused_and_not_repeated() {
        for url in [
            "https://api.example.com/x?api_key=QSECRET",
            "https://api.example.com/x?page=2&access_token=QSECRET",
            "https://api.example.com/x?sig=QSECRET",
        ] {
            let err = built(&Enqueue::post(url)).expect_err("a credential in the query");
            assert_eq!(err.kind(), crate::ErrorKind::Builder);
            assert!(err.to_string().contains("looks like a credential"), "{err}");
            assert!(err.to_string().contains("headers_for"), "{err}");
            assert!(!err.to_string().contains("QSECRET"), "{err}");
        }
        // Harmless names, and an empty value, are queued with the URL as it will be sent.
        let (_, operation) =
            built(&Enqueue::post("https://api.example.com/x?page=2&token=")).expect("queued");
        assert_eq!(operation.url, "https://api.example.com/x?page=2&token=");
    }

    #[test]
    fn bad_urls_headers_and_key_headers_are_refused() {
        for (enqueue, says) in [
            (Enqueue::post("/v1/charges"), "not an absolute URL"),
            (Enqueue::post("ftp://files.example.com/x"), "not an http"),
            (
                Enqueue::post("https://a.example.com/x").header("bad name", "v"),
                "not valid HTTP",
            ),
            (
                Enqueue::post("https://a.example.com/x").header("Idempotency-Key", "k1"),
                "Enqueue::key",
            ),
        ] {
            let err = built(&enqueue).expect_err("refused");
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn a_given_key_and_a_delay_are_kept() {
        let key = IdempotencyKey::new("order-42-charge").expect("valid");
        let enqueue = Enqueue::post("https://a.example.com/x")
            .key(key.clone())
            .delay(Duration::from_secs(30))
            .scope("stripe.charge");
        let (got, operation) = built(&enqueue).expect("valid");
        assert_eq!(got, key);
        assert_eq!(operation.key, "order-42-charge");
        assert_eq!(operation.scope, "stripe.charge");
        assert_eq!(
            operation.not_before,
            SystemTime::UNIX_EPOCH + Duration::from_secs(30)
        );
    }
}
