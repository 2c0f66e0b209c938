//! The request fingerprint: what "the same request" means to the ledger.

use http::{HeaderValue, Method};
use sha2::{Digest, Sha256};

use crate::key::push_hex;

/// Domain tag, so a fingerprint never hashes the same bytes as a derived key.
const TAG: &[u8] = b"idempotent-retry:request:v1";

/// What "the same request" means to a [`Ledger`](crate::Ledger): the SHA-256 of a request's
/// method, full URL (without fragment) and buffered body, each length-prefixed.
///
/// A JSON body (`application/json` or `+json`) that parses is hashed in RFC 8785 canonical
/// form, so member order and number spelling do not make two spellings of one request look
/// different. Headers are left out on purpose: credentials rotate between restarts, and the
/// key header is the key itself. Every front end computes it the same way, so a request sent
/// through the [`Client`](crate::Client), the tower service or the middleware has one
/// fingerprint, and rows written by one are recognised by the others.
///
/// A request type of your own gives it through
/// [`RetryRequest::fingerprint`](crate::RetryRequest::fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestFingerprint {
    hex: String,
    /// The URL as normalized, for a replayed `reqwest::Response` to report.
    url: Option<reqwest::Url>,
}

impl RequestFingerprint {
    /// The fingerprint of a request with this method, URL, `Content-Type` and body. A URL
    /// that parses as an absolute URL is normalized first (as `reqwest` spells it, fragment
    /// dropped), so `http://x` and `http://x/` are one target.
    #[must_use]
    pub fn new(
        method: &Method,
        url: &str,
        content_type: Option<&HeaderValue>,
        body: &[u8],
    ) -> Self {
        match reqwest::Url::parse(url) {
            Ok(parsed) => Self::of_url(method, parsed, content_type, body),
            Err(_) => RequestFingerprint {
                hex: digest(method, url, content_type, body),
                url: None,
            },
        }
    }

    /// As [`new`](Self::new), for a URL already parsed (a `reqwest::Request`'s): no second
    /// parse.
    pub(crate) fn of_url(
        method: &Method,
        mut url: reqwest::Url,
        content_type: Option<&HeaderValue>,
        body: &[u8],
    ) -> Self {
        url.set_fragment(None);
        RequestFingerprint {
            hex: digest(method, url.as_str(), content_type, body),
            url: Some(url),
        }
    }

    /// The 64 lowercase hex digits stored in the ledger's `fingerprint` column.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.hex
    }

    /// The normalized URL, when the request's URL was absolute.
    pub(crate) fn url(&self) -> Option<&reqwest::Url> {
        self.url.as_ref()
    }

    #[cfg(test)]
    pub(crate) fn into_string(self) -> String {
        self.hex
    }
}

/// The SHA-256 (hex) of the tagged, length-prefixed method, URL and (canonical) body.
fn digest(method: &Method, url: &str, content_type: Option<&HeaderValue>, body: &[u8]) -> String {
    let canonical = canonical_body(content_type, body);
    let body = canonical.as_deref().unwrap_or(body);
    let mut hasher = Sha256::new();
    hasher.update(TAG);
    for part in [method.as_str().as_bytes(), url.as_bytes(), body] {
        let len = u64::try_from(part.len()).unwrap_or(u64::MAX);
        hasher.update(len.to_be_bytes());
        hasher.update(part);
    }
    let mut hex = String::with_capacity(64);
    for byte in hasher.finalize() {
        push_hex(&mut hex, byte);
    }
    hex
}

fn canonical_body(content_type: Option<&HeaderValue>, bytes: &[u8]) -> Option<Vec<u8>> {
    let content_type = content_type?.to_str().ok()?;
    let essence = content_type.split(';').next()?.trim().to_ascii_lowercase();
    if essence != "application/json" && !essence.ends_with("+json") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some(crate::canonical::to_string(&value).into_bytes())
}

#[cfg(test)]
mod tests {
    use http::header::CONTENT_TYPE;

    use super::*;
    use crate::exchange::RetryRequest;

    fn request_fingerprint(request: &reqwest::Request) -> Option<String> {
        request.fingerprint().map(RequestFingerprint::into_string)
    }

    fn request(method: &str, url: &str, body: Option<(&str, &str)>) -> reqwest::Request {
        let client = reqwest::Client::new();
        let mut builder = client.request(method.parse().expect("method"), url);
        if let Some((content_type, body)) = body {
            builder = builder
                .header(CONTENT_TYPE, content_type)
                .body(body.to_owned());
        }
        builder.build().expect("request")
    }

    #[test]
    fn json_spelling_does_not_matter_but_content_does() {
        let a = request(
            "POST",
            "http://x/charges",
            Some(("application/json", r#"{"amount":100,"currency":"eur"}"#)),
        );
        let b = request(
            "POST",
            "http://x/charges#frag",
            Some((
                "application/json; charset=utf-8",
                r#"{ "currency": "eur", "amount": 100.0 }"#,
            )),
        );
        let c = request(
            "POST",
            "http://x/charges",
            Some(("application/json", r#"{"amount":200,"currency":"eur"}"#)),
        );
        let fa = request_fingerprint(&a).expect("buffered");
        assert_eq!(fa.len(), 64);
        assert_eq!(Some(fa.clone()), request_fingerprint(&b));
        assert_ne!(Some(fa.clone()), request_fingerprint(&c));
        // Method and URL are part of it; a non-JSON body is hashed byte for byte.
        let put = request(
            "PUT",
            "http://x/charges",
            Some(("application/json", r#"{"amount":100,"currency":"eur"}"#)),
        );
        assert_ne!(Some(fa), request_fingerprint(&put));
        let text_a = request("POST", "http://x/", Some(("text/plain", "{\"a\":1}")));
        let text_b = request("POST", "http://x/", Some(("text/plain", "{\"a\":1.0}")));
        assert_ne!(request_fingerprint(&text_a), request_fingerprint(&text_b));
    }

    #[test]
    fn parts_are_length_prefixed() {
        let a = request("POST", "http://x/ab", Some(("text/plain", "c")));
        let b = request("POST", "http://x/a", Some(("text/plain", "bc")));
        assert_ne!(request_fingerprint(&a), request_fingerprint(&b));
    }

    #[test]
    fn a_streamed_body_has_no_fingerprint() {
        let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from("x"))]);
        let request = reqwest::Client::new()
            .post("http://x/")
            .body(reqwest::Body::wrap_stream(stream))
            .build()
            .expect("request");
        assert_eq!(request_fingerprint(&request), None);
    }
}
