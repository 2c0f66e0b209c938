//! The request fingerprint: what "the same request" means to the ledger.

use http::header::CONTENT_TYPE;
use sha2::{Digest, Sha256};

/// Domain tag, so a fingerprint never hashes the same bytes as a derived key.
const TAG: &[u8] = b"idempotent-retry:request:v1";

/// SHA-256 (64 lowercase hex digits) of the request's method, URL (without fragment) and
/// body, each length-prefixed. A JSON body (`application/json` or `+json`) that parses is
/// hashed in RFC 8785 canonical form, so member order and number spelling do not make two
/// spellings of one request look different. Headers are left out on purpose: credentials
/// rotate between restarts, and the key header is the key itself.
///
/// `None` when the body is a stream, which cannot be read without consuming it.
pub(crate) fn request_fingerprint(request: &reqwest::Request) -> Option<String> {
    let body: Vec<u8> = match request.body() {
        None => Vec::new(),
        Some(body) => {
            let bytes = body.as_bytes()?;
            canonical_body(request, bytes).unwrap_or_else(|| bytes.to_vec())
        }
    };
    let mut url = request.url().clone();
    url.set_fragment(None);
    let mut hasher = Sha256::new();
    hasher.update(TAG);
    for part in [
        request.method().as_str().as_bytes(),
        url.as_str().as_bytes(),
        &body,
    ] {
        let len = u64::try_from(part.len()).unwrap_or(u64::MAX);
        hasher.update(len.to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(64);
    for byte in digest.iter() {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 0x0f)]));
    }
    Some(hex)
}

fn canonical_body(request: &reqwest::Request, bytes: &[u8]) -> Option<Vec<u8>> {
    let content_type = request.headers().get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = content_type.split(';').next()?.trim().to_ascii_lowercase();
    if essence != "application/json" && !essence.ends_with("+json") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some(crate::canonical_json(&value).into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

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
