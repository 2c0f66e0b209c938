//! A request's URL as the crate shows it, never with the credentials it may carry: `url.full`
//! as the OpenTelemetry HTTP conventions want it ([`redacted`]), and the URL a ledger row and
//! an [`Error`](crate::Error) record ([`without_credentials`], [`strip_credentials`]).

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

/// [`redacted`], formatted only when something reads it: a span field recorded with it costs
/// nothing under a subscriber that records no field values.
pub(crate) struct Redacted<'a>(pub(crate) &'a Url);

impl std::fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redacted(self.0))
    }
}

/// Removes the user name and password from `url`, in place; the rest (path, query, fragment)
/// stays as it is.
pub(crate) fn strip_credentials(url: &mut Url) {
    if url.username().is_empty() && url.password().is_none() {
        return;
    }
    // Only URLs that cannot have credentials refuse these, and they have none to remove.
    let _ = url.set_username("");
    let _ = url.set_password(None);
}

/// The URL as a ledger row records it: `url` without a user name or password.
pub(crate) fn without_credentials(url: &Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        return url.as_str().to_owned();
    }
    let mut url = url.clone();
    strip_credentials(&mut url);
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

    #[test]
    fn a_recorded_url_keeps_everything_but_the_credentials() {
        for (sent, recorded) in [
            (
                "https://alice:s3cret@api.example.com:8443/v1/charges?order=17",
                "https://api.example.com:8443/v1/charges?order=17",
            ),
            (
                "https://:s3cret@api.example.com/v1/charges",
                "https://api.example.com/v1/charges",
            ),
            (
                "https://alice@api.example.com/v1/charges",
                "https://api.example.com/v1/charges",
            ),
            (
                "https://api.example.com/v1/charges#receipt",
                "https://api.example.com/v1/charges#receipt",
            ),
        ] {
            let url = Url::parse(sent).expect("a URL");
            assert_eq!(without_credentials(&url), recorded, "{sent}");
            let mut stripped = url.clone();
            strip_credentials(&mut stripped);
            assert_eq!(stripped.as_str(), recorded, "{sent}");
        }
    }
}
