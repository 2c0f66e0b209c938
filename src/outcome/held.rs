//! What the ledger holds under a key that a different request tried to use: the record an
//! [`ErrorKind::KeyReuse`](crate::ErrorKind::KeyReuse) error carries, the part of the request
//! that differs, and what the record says about the key's operation.

use std::fmt;
use std::time::SystemTime;

use http::StatusCode;

use crate::time::readable::rfc3339;
use idempotent_retry_ledger::OperationStatus;

/// The part of a request that differs from the one the ledger holds under its key.
///
/// The fingerprint covers the method, the whole URL (origin included) and the body: a key
/// belongs to one receiver, and the same path on another origin (a staging host, a test server
/// on another port, a regional endpoint) is another receiver's business, which this crate
/// cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestPart {
    /// Another method.
    Method,
    /// Another scheme, host or port.
    Origin,
    /// The same origin, another path or query.
    PathOrQuery,
    /// The same method and URL: the body differs (or a user name or password in the URL).
    Body,
}

impl RequestPart {
    /// `method`, `origin`, `path_or_query` or `body`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            RequestPart::Method => "method",
            RequestPart::Origin => "origin",
            RequestPart::PathOrQuery => "path_or_query",
            RequestPart::Body => "body",
        }
    }
}

impl fmt::Display for RequestPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ledger's record of the operation under a key, as a
/// [`KeyReuse`](crate::ErrorKind::KeyReuse) error reports it
/// ([`Error::held_operation`](crate::Error::held_operation)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldOperation {
    /// Where the key's operation stands.
    pub status: OperationStatus,
    /// Its scope.
    pub scope: String,
    /// Its method, when the row records one (rows written before 0.2 do not).
    pub method: Option<String>,
    /// Its URL, without a user name or password, when the row records one.
    pub url: Option<String>,
    /// When it was first attempted.
    pub first_attempt_at: SystemTime,
    /// The status of its saved final answer, when it has one.
    pub answered: Option<StatusCode>,
    /// What differs in the request refused, when the row records its request.
    pub differs: Option<RequestPart>,
    /// The refused request's value of the part that differs, for the message.
    sent: Option<String>,
}

impl HeldOperation {
    /// The record of a row, against the refused request's method and URL (without
    /// credentials).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        status: OperationStatus,
        scope: String,
        held: (Option<String>, Option<String>),
        first_attempt_at: SystemTime,
        answered: Option<u16>,
        method: &str,
        url: Option<&reqwest::Url>,
    ) -> Self {
        let (held_method, held_url) = held;
        let (differs, sent) =
            differing_part(held_method.as_deref(), held_url.as_deref(), method, url);
        HeldOperation {
            status,
            scope,
            method: held_method,
            url: held_url,
            first_attempt_at,
            answered: answered.and_then(|code| StatusCode::from_u16(code).ok()),
            differs,
            sent,
        }
    }

    /// Whether the key's operation may have run, or did: every status but a definite "not
    /// run" ([`FailedFinal`](OperationStatus::FailedFinal) without an answer, or
    /// [`NotSent`](OperationStatus::NotSent)). A caller told `true` must not send the
    /// operation again under a new key.
    #[must_use]
    pub fn may_have_run(&self) -> bool {
        match self.status {
            OperationStatus::FailedFinal => self.answered.is_some(),
            OperationStatus::NotSent => false,
            _ => true,
        }
    }

    /// The final answer the key's operation has, when the ledger holds one: a succeeded
    /// operation's status, or a final refusal's.
    pub(crate) fn final_answer(&self) -> Option<StatusCode> {
        match self.status {
            OperationStatus::Succeeded | OperationStatus::FailedFinal => self.answered,
            _ => None,
        }
    }
}

/// Which part of the refused request differs from the held one, and its value there.
fn differing_part(
    held_method: Option<&str>,
    held_url: Option<&str>,
    method: &str,
    url: Option<&reqwest::Url>,
) -> (Option<RequestPart>, Option<String>) {
    let (Some(held_method), Some(held_url)) = (held_method, held_url) else {
        return (None, None);
    };
    if !held_method.eq_ignore_ascii_case(method) {
        return (Some(RequestPart::Method), Some(method.to_owned()));
    }
    let Some(url) = url else {
        return (None, None);
    };
    let Ok(held) = reqwest::Url::parse(held_url) else {
        return (None, None);
    };
    if held.origin() != url.origin() {
        return (
            Some(RequestPart::Origin),
            Some(url.origin().ascii_serialization()),
        );
    }
    if held.path() != url.path() || held.query() != url.query() {
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        return (Some(RequestPart::PathOrQuery), Some(target));
    }
    (Some(RequestPart::Body), None)
}

impl fmt::Display for HeldOperation {
    /// `recorded as succeeded (answered 200 OK) for POST https://…, first attempted at …
    /// (scope …); this request goes to another origin (…)`: each fact once.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "recorded as {}", self.status)?;
        if let Some(answered) = self.answered {
            write!(f, " (answered {answered})")?;
        }
        if let (Some(method), Some(url)) = (&self.method, &self.url) {
            write!(f, " for {method} {url}")?;
        }
        write!(
            f,
            ", first attempted at {} (scope {})",
            rfc3339(self.first_attempt_at),
            self.scope
        )?;
        let sent = self.sent.as_deref().unwrap_or("");
        match self.differs {
            Some(RequestPart::Method) => write!(f, "; this request's method is {sent}"),
            Some(RequestPart::Origin) => write!(
                f,
                "; this request goes to another origin, {sent} (a key belongs to one receiver: \
                 the fingerprint includes the origin)"
            ),
            Some(RequestPart::PathOrQuery) => write!(f, "; this request goes to {sent}"),
            Some(RequestPart::Body) => f.write_str("; this request's body differs"),
            None => f.write_str("; this request differs in its method, URL or body"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn held(
        status: OperationStatus,
        answered: Option<u16>,
        method: &str,
        url: &str,
    ) -> HeldOperation {
        let url = reqwest::Url::parse(url).expect("a URL");
        HeldOperation::new(
            status,
            "shop.charge".to_owned(),
            (
                Some("POST".to_owned()),
                Some("http://127.0.0.1:8080/charges?order=1".to_owned()),
            ),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200),
            answered,
            method,
            Some(&url),
        )
    }

    #[test]
    fn the_differing_part_is_named_with_its_value() {
        let cases = [
            (
                "PUT",
                "http://127.0.0.1:8080/charges?order=1",
                Some(RequestPart::Method),
                "method is PUT",
            ),
            (
                "POST",
                "http://127.0.0.1:9090/charges?order=1",
                Some(RequestPart::Origin),
                "another origin, http://127.0.0.1:9090",
            ),
            (
                "POST",
                "http://127.0.0.1:8080/refunds?order=1",
                Some(RequestPart::PathOrQuery),
                "goes to /refunds?order=1",
            ),
            (
                "POST",
                "http://127.0.0.1:8080/charges?order=2",
                Some(RequestPart::PathOrQuery),
                "goes to /charges?order=2",
            ),
            (
                "POST",
                "http://127.0.0.1:8080/charges?order=1",
                Some(RequestPart::Body),
                "body differs",
            ),
        ];
        for (method, url, part, says) in cases {
            let held = held(OperationStatus::Succeeded, Some(200), method, url);
            assert_eq!(held.differs, part, "{method} {url}");
            let text = held.to_string();
            assert!(text.contains(says), "{text}");
            assert!(
                text.starts_with(
                    "recorded as succeeded (answered 200 OK) for POST \
                     http://127.0.0.1:8080/charges?order=1, first attempted at \
                     2024-01-01T00:00:00Z (scope shop.charge)"
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn only_a_definite_not_run_says_the_operation_did_not_run() {
        let url = "http://127.0.0.1:9090/charges?order=1";
        for (status, answered, may_have_run) in [
            (OperationStatus::Succeeded, Some(200), true),
            (OperationStatus::FailedFinal, Some(422), true),
            (OperationStatus::FailedFinal, None, false),
            (OperationStatus::Unknown, None, true),
            (OperationStatus::InFlight, None, true),
            (OperationStatus::NotSent, None, false),
        ] {
            let held = held(status, answered, "POST", url);
            assert_eq!(held.may_have_run(), may_have_run, "{status}");
        }
    }

    #[test]
    fn a_row_without_its_request_says_what_may_differ() {
        let held = HeldOperation::new(
            OperationStatus::Unknown,
            "api.example.com".to_owned(),
            (None, None),
            SystemTime::UNIX_EPOCH,
            None,
            "POST",
            None,
        );
        assert_eq!(held.differs, None);
        assert!(
            held.to_string()
                .ends_with("; this request differs in its method, URL or body")
        );
    }
}
