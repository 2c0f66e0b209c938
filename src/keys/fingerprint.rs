//! The request fingerprint: what "the same request" means to the ledger.

use http::{HeaderValue, Method};
use sha2::{Digest, Sha256};

use crate::keys::key::push_hex;

/// Domain tag, so a fingerprint never hashes the same bytes as a derived key.
const TAG: &[u8] = b"idempotent-retry:request:v1";

/// What "the same request" means to a [`Ledger`](crate::ledger::Ledger): the SHA-256 of a request's
/// method, full URL (without fragment) and buffered body, each length-prefixed.
///
/// A JSON body (`application/json` or `+json`) that parses is hashed in RFC 8785 canonical
/// form, so member order and number spelling do not make two spellings of one request look
/// different; a `multipart/form-data` body is hashed with its random boundary replaced by a
/// fixed one, so a form built again (after a restart) is the same request. Headers are left out
/// on purpose: credentials rotate between restarts, and the
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

    /// The hex digits, owned.
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

/// The body as hashed, when it is not hashed byte for byte: a JSON body in canonical form, a
/// `multipart/form-data` body with its boundary replaced by a fixed one.
fn canonical_body(content_type: Option<&HeaderValue>, bytes: &[u8]) -> Option<Vec<u8>> {
    let content_type = content_type?.to_str().ok()?;
    let mut params = content_type.split(';');
    let essence = params.next()?.trim().to_ascii_lowercase();
    if essence == "multipart/form-data" {
        let boundary = params.find_map(|param| {
            let (name, value) = param.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("boundary")
                .then(|| value.trim().trim_matches('"'))
                .filter(|boundary| !boundary.is_empty())
        })?;
        return Some(with_fixed_boundary(bytes, boundary));
    }
    if essence != "application/json" && !essence.ends_with("+json") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some(crate::keys::canonical::to_string(&value).into_bytes())
}

/// A multipart body with every delimiter (`--` and the boundary) spelled with one fixed
/// boundary. The boundary is drawn at random each time a form is built, so the same form
/// built again (after a restart, under the same key) is the same request to the ledger; it
/// cannot occur inside a part (RFC 2046 section 5.1.1), so nothing else is rewritten.
fn with_fixed_boundary(body: &[u8], boundary: &str) -> Vec<u8> {
    const FIXED: &[u8] = b"--idempotent-retry-fingerprint-boundary";
    let mut delimiter = Vec::with_capacity(boundary.len() + 2);
    delimiter.extend_from_slice(b"--");
    delimiter.extend_from_slice(boundary.as_bytes());
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    while let Some(at) = find(rest, &delimiter) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(FIXED);
        rest = &rest[at + delimiter.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The first position of `needle` (not empty) in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use http::header::CONTENT_TYPE;

    use super::*;
    use crate::message::exchange::RetryRequest;

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
    fn a_multipart_form_built_again_with_another_boundary_is_the_same_request() {
        let form = |boundary: &str, value: &str| {
            let body = format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n{value}\r\n\
                 --{boundary}--\r\n"
            );
            let content_type = format!("multipart/form-data; boundary={boundary}");
            request("POST", "http://x/upload", Some((&content_type, &body)))
        };
        let first = request_fingerprint(&form("aaaa-1111", "one")).expect("buffered");
        assert_eq!(
            Some(first.clone()),
            request_fingerprint(&form("bbbb-2222", "one"))
        );
        // A quoted boundary is the same boundary.
        let quoted = request(
            "POST",
            "http://x/upload",
            Some((
                "multipart/form-data; charset=utf-8; BOUNDARY=\"cccc\"",
                "--cccc\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\none\r\n--cccc--\r\n",
            )),
        );
        assert_eq!(Some(first.clone()), request_fingerprint(&quoted));
        // The content of a part still counts.
        assert_ne!(Some(first), request_fingerprint(&form("aaaa-1111", "two")));
        // Without a boundary parameter the body is hashed byte for byte.
        let bare = |body: &str| request("POST", "http://x/", Some(("multipart/form-data", body)));
        assert_ne!(
            request_fingerprint(&bare("--a")),
            request_fingerprint(&bare("--b"))
        );
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
