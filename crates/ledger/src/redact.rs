//! What a row keeps of a request's URL: every query value redacted unless its name is on the
//! caller's list (the names stay, so a row still says which parameters the request had), no
//! fragment; and which names look like a credential's (a query parameter or a header).

use std::borrow::Cow;

/// What replaces a redacted query value in a stored URL.
pub const REDACTED_VALUE: &str = "…";

/// `url` as a ledger row stores it: each query value replaced by [`REDACTED_VALUE`]
/// (`?api_key=…&page=…`) unless its parameter's name, compared as written in the URL, is in
/// `keep`; a parameter without `=` (a bare value, which may be the secret itself) is replaced
/// whole unless it is in `keep`; empty values stay empty; the fragment (never sent, and where
/// some flows put tokens) is dropped. A URL without a query or fragment is returned as it is,
/// without a copy.
///
/// ```
/// use idempotent_retry_ledger::redact_query;
///
/// let url = "https://api.example.com/v1/charges?api_key=sk_live_1&page=2#receipt";
/// assert_eq!(redact_query(url, &[] as &[&str]), "https://api.example.com/v1/charges?api_key=…&page=…");
/// assert_eq!(redact_query(url, &["page"]), "https://api.example.com/v1/charges?api_key=…&page=2");
/// ```
pub fn redact_query<'a, S: AsRef<str>>(url: &'a str, keep: &[S]) -> Cow<'a, str> {
    let without_fragment = url.split_once('#').map_or(url, |(before, _)| before);
    let Some((base, query)) = without_fragment.split_once('?') else {
        return if without_fragment.len() == url.len() {
            Cow::Borrowed(url)
        } else {
            Cow::Owned(without_fragment.to_owned())
        };
    };
    let kept = |name: &str| keep.iter().any(|kept| kept.as_ref() == name);
    let mut redacted = String::with_capacity(without_fragment.len());
    redacted.push_str(base);
    redacted.push('?');
    for (n, pair) in query.split('&').enumerate() {
        if n > 0 {
            redacted.push('&');
        }
        match pair.split_once('=') {
            Some((name, value)) if value.is_empty() || kept(name) => {
                redacted.push_str(name);
                redacted.push('=');
                redacted.push_str(value);
            }
            Some((name, _)) => {
                redacted.push_str(name);
                redacted.push('=');
                redacted.push_str(REDACTED_VALUE);
            }
            None if pair.is_empty() || kept(pair) => redacted.push_str(pair),
            None => redacted.push_str(REDACTED_VALUE),
        }
    }
    if redacted == url {
        Cow::Borrowed(url)
    } else {
        Cow::Owned(redacted)
    }
}

/// Whether a query parameter's or a header's `name` looks like it carries a credential, in any
/// case and with `-` or `_` anywhere: `Authorization`, `Proxy-Authorization`, `Cookie`,
/// `Set-Cookie`, and any name containing `token`, `key`, `secret`, `password`, `passwd`,
/// `signature`, `credential`, `session` or `auth`, or equal to `sig`, `pwd` or `pass`. Wide on
/// purpose: it decides what is masked and what the outbox refuses, where a false alarm costs
/// a word and a miss costs a secret.
///
/// ```
/// use idempotent_retry_ledger::looks_like_credential;
///
/// assert!(looks_like_credential("api_key"));
/// assert!(looks_like_credential("X-Goog-Api-Key"));
/// assert!(looks_like_credential("Set-Cookie"));
/// assert!(!looks_like_credential("page"));
/// assert!(!looks_like_credential("Content-Type"));
/// ```
#[must_use]
pub fn looks_like_credential(name: &str) -> bool {
    let folded: String = name
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    const CONTAINED: [&str; 10] = [
        "token",
        "key",
        "secret",
        "password",
        "passwd",
        "signature",
        "credential",
        "session",
        "auth",
        "cookie",
    ];
    const EXACT: [&str; 3] = ["sig", "pwd", "pass"];
    CONTAINED.iter().any(|part| folded.contains(part)) || EXACT.contains(&folded.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: &[&str] = &[];

    #[test]
    fn every_query_value_is_redacted_and_every_name_kept() {
        for (stored, redacted) in [
            (
                "http://127.0.0.1:8080/charges/ok?api_key=QUERYSECRET9",
                "http://127.0.0.1:8080/charges/ok?api_key=…",
            ),
            (
                "https://api.example.com/v1?a=1&b=&c&&d=x=y",
                "https://api.example.com/v1?a=…&b=&…&&d=…",
            ),
            ("https://api.example.com/v1?", "https://api.example.com/v1?"),
            (
                "https://api.example.com/v1#access_token=T",
                "https://api.example.com/v1",
            ),
            (
                "https://api.example.com/v1?q=1#frag",
                "https://api.example.com/v1?q=…",
            ),
        ] {
            assert_eq!(redact_query(stored, NONE), redacted, "{stored}");
        }
    }

    #[test]
    fn a_url_without_a_query_is_not_copied_and_kept_names_keep_their_values() {
        let plain = "https://api.example.com/v1/charges";
        assert!(matches!(redact_query(plain, NONE), Cow::Borrowed(_)));
        let kept = "https://api.example.com/v1?page=2&limit=";
        assert!(matches!(redact_query(kept, &["page"]), Cow::Borrowed(_)));
        assert_eq!(
            redact_query("https://h/?page=2&Page=3&flag", &["page", "flag"]),
            "https://h/?page=2&Page=…&flag"
        );
    }

    #[test]
    fn credential_names_are_recognized_in_any_spelling() {
        for name in [
            "key",
            "api_key",
            "apikey",
            "API-KEY",
            "access_token",
            "token",
            "sig",
            "signature",
            "X-Amz-Signature",
            "secret",
            "client_secret",
            "password",
            "pwd",
            "Authorization",
            "proxy-authorization",
            "Cookie",
            "set-cookie",
            "X-Session-Id",
        ] {
            assert!(looks_like_credential(name), "{name}");
        }
        for name in ["page", "limit", "q", "content-type", "location", "design"] {
            assert!(!looks_like_credential(name), "{name}");
        }
    }
}
