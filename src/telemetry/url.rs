//! `url.full` as the OpenTelemetry HTTP conventions want it: the URL without the credentials
//! it may carry.

use reqwest::Url;

/// What replaces a secret: the conventions' own placeholder.
const REDACTED: &str = "REDACTED";

/// `url` with its user name and password replaced by `REDACTED` (the conventions' form,
/// `https://REDACTED:REDACTED@host/`), every query value replaced by `REDACTED` (query strings
/// carry API keys and signatures, and the crate cannot tell which parameter does; the names
/// stay), and no fragment (never sent).
pub(crate) fn redacted(url: &Url) -> String {
    let mut url = url.clone();
    if !url.username().is_empty() || url.password().is_some() {
        // Only URLs that cannot carry credentials refuse these, and they carry none.
        let _ = url.set_username(REDACTED);
        let _ = url.set_password(Some(REDACTED));
    }
    if url.query().is_some() {
        let names: Vec<String> = url
            .query_pairs()
            .map(|(name, _)| name.into_owned())
            .collect();
        if names.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut()
                .clear()
                .extend_pairs(names.iter().map(|name| (name.as_str(), REDACTED)));
        }
    }
    url.set_fragment(None);
    url.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(text: &str) -> String {
        redacted(&Url::parse(text).expect("valid URL"))
    }

    #[test]
    fn credentials_and_query_values_are_redacted() {
        assert_eq!(
            redact("https://user:pass@api.example.com:8443/v1/charges?api_key=sk_live&limit=3#top"),
            "https://REDACTED:REDACTED@api.example.com:8443/v1/charges?api_key=REDACTED&limit=REDACTED"
        );
        assert_eq!(
            redact("https://user@api.example.com/"),
            "https://REDACTED:REDACTED@api.example.com/"
        );
    }

    #[test]
    fn a_plain_url_is_unchanged() {
        assert_eq!(
            redact("http://127.0.0.1:8080/v1/emails"),
            "http://127.0.0.1:8080/v1/emails"
        );
        assert_eq!(
            redact("http://127.0.0.1:8080/a?"),
            "http://127.0.0.1:8080/a"
        );
    }
}
