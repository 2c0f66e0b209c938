//! The ledger scope of a request through the tower layer, for request types that carry no
//! extensions (`reqwest::Request`): the scope header, read and taken off before anything is
//! sent, and the layer's rules by path prefix. What this settles goes to the engine as the
//! front end's override, the way the `Client` passes `RequestBuilder::ledger_scope`.

use http::HeaderName;
use http::header::{Entry, HeaderMap};

use crate::engine::extension::LedgerScope;
use crate::message::exchange::RetryRequest;
use crate::outcome::error::Error;

/// The header the layer reads a request's ledger scope from.
pub(crate) const SCOPE_HEADER: HeaderName = HeaderName::from_static("idempotent-retry-scope");

/// The layer's scopes by path prefix.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScopeRules {
    /// `(prefix, scope)`, the prefix starting with `/` and without a trailing `/` (the root is
    /// the empty prefix).
    by_prefix: Vec<(String, String)>,
}

impl ScopeRules {
    /// Adds `scope` for paths under `prefix`; a prefix given again takes the new scope.
    pub(crate) fn insert(&mut self, prefix: &str, scope: String) {
        let prefix = match prefix.trim_matches('/') {
            "" => String::new(),
            inner => format!("/{inner}"),
        };
        match self.by_prefix.iter_mut().find(|(have, _)| *have == prefix) {
            Some(rule) => rule.1 = scope,
            None => self.by_prefix.push((prefix, scope)),
        }
    }

    /// The scope of the longest prefix that `path` is, or is under (at a `/`).
    fn scope_for(&self, path: &str) -> Option<&str> {
        self.by_prefix
            .iter()
            .filter(|(prefix, _)| {
                path.strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, scope)| scope.as_str())
    }
}

/// The scope the layer passes to the engine for `request`, with the scope header taken off it:
/// a [`LedgerScope`] in the extensions is read by the engine itself (`None` here), else the
/// header's, else the rules' by the request's path, else none (the engine's default, the host).
///
/// # Errors
///
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when the header is set more than once, is
/// not visible ASCII, or names another scope than the extensions' [`LedgerScope`].
pub(crate) fn settle_scope<R: RetryRequest>(
    request: &mut R,
    rules: &ScopeRules,
) -> Result<Option<String>, Error> {
    let header = take_header(request.headers_mut())?;
    let given = request
        .extensions()
        .and_then(|extensions| extensions.get::<LedgerScope>());
    match (given, header) {
        (Some(given), Some(header)) if given.as_str() != header => Err(Error::builder(format!(
            "two different ledger scopes: {given:?} in the request's extensions, {header:?} in \
             the {SCOPE_HEADER} header",
            given = given.as_str(),
        ))),
        (Some(_), _) => Ok(None),
        (None, Some(header)) => Ok(Some(header)),
        (None, None) if rules.by_prefix.is_empty() => Ok(None),
        (None, None) => Ok(request
            .path()
            .and_then(|path| rules.scope_for(path))
            .map(str::to_owned)),
    }
}

/// The scope header's value, taken off `headers`.
fn take_header(headers: &mut HeaderMap) -> Result<Option<String>, Error> {
    let Entry::Occupied(entry) = headers.entry(SCOPE_HEADER) else {
        return Ok(None);
    };
    let (_, mut values) = entry.remove_entry_mult();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(Error::builder(format!(
            "the {SCOPE_HEADER} header is set more than once"
        )));
    };
    let scope = value
        .to_str()
        .map_err(|_| Error::builder(format!("the {SCOPE_HEADER} header is not visible ASCII")))?;
    Ok(Some(scope.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pairs: &[(&str, &str)]) -> ScopeRules {
        let mut rules = ScopeRules::default();
        for (prefix, scope) in pairs {
            rules.insert(prefix, (*scope).to_owned());
        }
        rules
    }

    #[test]
    fn the_longest_prefix_at_a_segment_boundary_names_the_scope() {
        let rules = rules(&[
            ("/v1", "api"),
            ("/v1/charges/", "charge"),
            ("v1/charges/refunds", "refund"),
        ]);
        assert_eq!(rules.scope_for("/v1/charges"), Some("charge"));
        assert_eq!(rules.scope_for("/v1/charges/"), Some("charge"));
        assert_eq!(rules.scope_for("/v1/charges/ch_1"), Some("charge"));
        assert_eq!(rules.scope_for("/v1/charges/refunds/r_1"), Some("refund"));
        assert_eq!(rules.scope_for("/v1/chargesx"), Some("api"));
        assert_eq!(rules.scope_for("/v2/charges"), None);
        assert_eq!(rules.scope_for("/v10"), None);
    }

    #[test]
    fn the_root_prefix_matches_every_path_and_a_prefix_given_again_is_replaced() {
        let mut rules = rules(&[("/", "all"), ("/v1", "old")]);
        rules.insert("/v1/", "new".to_owned());
        assert_eq!(rules.scope_for("/"), Some("all"));
        assert_eq!(rules.scope_for("/health"), Some("all"));
        assert_eq!(rules.scope_for("/v1/x"), Some("new"));
    }

    fn request(scopes: &[&str], extension: Option<&str>) -> http::Request<String> {
        let mut builder = http::Request::post("http://api.example.test/v1/charges");
        for scope in scopes {
            builder = builder.header(SCOPE_HEADER, *scope);
        }
        let mut request = builder.body(String::new()).expect("request");
        if let Some(scope) = extension {
            request.extensions_mut().insert(LedgerScope::new(scope));
        }
        request
    }

    #[test]
    fn the_header_wins_over_the_rules_and_is_taken_off_the_request() {
        let rules = rules(&[("/v1/charges", "by-path")]);
        let mut with_header = request(&["by-header"], None);
        let scope = settle_scope(&mut with_header, &rules).expect("one header");
        assert_eq!(scope.as_deref(), Some("by-header"));
        assert!(with_header.headers().get(SCOPE_HEADER).is_none());
        let mut without = request(&[], None);
        let scope = settle_scope(&mut without, &rules).expect("no header");
        assert_eq!(scope.as_deref(), Some("by-path"));
    }

    #[test]
    fn an_extension_is_left_to_the_engine_and_a_different_header_refused() {
        let rules = rules(&[("/v1/charges", "by-path")]);
        let mut same = request(&["stripe.charge"], Some("stripe.charge"));
        assert_eq!(settle_scope(&mut same, &rules).expect("agree"), None);
        assert!(same.headers().get(SCOPE_HEADER).is_none());
        let mut only = request(&[], Some("stripe.charge"));
        assert_eq!(settle_scope(&mut only, &rules).expect("extension"), None);
        let mut other = request(&["shop.charge"], Some("stripe.charge"));
        let err = settle_scope(&mut other, &rules).expect_err("two scopes");
        assert_eq!(err.kind(), crate::ErrorKind::Builder);
        assert!(
            err.to_string().contains("two different ledger scopes"),
            "{err}"
        );
    }

    #[test]
    fn a_header_set_twice_or_not_ascii_is_refused() {
        let rules = ScopeRules::default();
        let err = settle_scope(&mut request(&["a", "b"], None), &rules).expect_err("twice");
        assert!(err.to_string().contains("more than once"), "{err}");
        let mut opaque = request(&[], None);
        opaque.headers_mut().insert(
            SCOPE_HEADER,
            http::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text is a valid value"),
        );
        let err = settle_scope(&mut opaque, &rules).expect_err("not ascii");
        assert!(err.to_string().contains("not visible ASCII"), "{err}");
    }
}
