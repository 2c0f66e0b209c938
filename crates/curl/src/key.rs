//! Which key the operation gets, and how far it dedupes: the command line's, the request's
//! own header, one derived from the run the environment names, or a fresh one.

use idempotent_retry::{IdempotencyKey, RequestFingerprint};

use crate::args::KeyArg;
use crate::payload::{FormPart, Payload};

/// The variable a runtime sets once per agent run or job.
pub(crate) const RUN_VARIABLE: &str = "IDEMPOTENT_RETRY_RUN";
/// The variable a runtime sets once per step of a run (optional).
pub(crate) const STEP_VARIABLE: &str = "IDEMPOTENT_RETRY_STEP";

/// Where the key came from, which says how far it dedupes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// `--key`: every invocation with this key is one operation.
    Given,
    /// `--key-from`: every invocation with these parts (and scope) is one operation.
    Derived,
    /// The request's own key header.
    Header,
    /// The run (and step) the environment names, with the request: the same command in the
    /// same run (and step) is one operation.
    Run,
    /// Fresh for this invocation: its own retries are safe, a re-run is a new operation.
    Fresh,
    /// No key: the method is idempotent (`GET`, `PUT`, `DELETE`...) and none was given.
    None,
    /// `-H "Idempotency-Key:"`: the caller asked for none.
    Refused,
}

impl KeySource {
    /// The word the reports give.
    pub(crate) fn name(self) -> &'static str {
        match self {
            KeySource::Given => "key",
            KeySource::Derived => "key-from",
            KeySource::Header => "header",
            KeySource::Run => "run",
            KeySource::Fresh => "fresh",
            KeySource::None => "none",
            KeySource::Refused => "refused",
        }
    }
}

/// The operation's key and where it came from.
#[derive(Debug, Clone)]
pub(crate) struct KeyChoice {
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) source: KeySource,
}

/// The run identity the environment gives: the run and the step, when set and not empty.
pub(crate) fn run_identity(
    get: impl Fn(&str) -> Option<String>,
) -> Option<(String, Option<String>)> {
    let run = get(RUN_VARIABLE).filter(|run| !run.is_empty())?;
    Some((run, get(STEP_VARIABLE).filter(|step| !step.is_empty())))
}

/// What the request is, for a key derived from the run: the ledger's fingerprint of its method,
/// URL and body (a form hashed part by part, since its boundary is drawn at random).
pub(crate) fn request_identity(method: &http::Method, url: &str, payload: &Payload) -> String {
    match payload {
        Payload::None => RequestFingerprint::new(method, url, None, b"")
            .as_str()
            .to_owned(),
        Payload::Bytes { bytes, json } => {
            let content_type = json.then(|| http::HeaderValue::from_static("application/json"));
            RequestFingerprint::new(method, url, content_type.as_ref(), bytes)
                .as_str()
                .to_owned()
        }
        Payload::Form(parts) => RequestFingerprint::new(method, url, None, &form_identity(parts))
            .as_str()
            .to_owned(),
    }
}

/// The parts of a form, each field length-prefixed, in order.
fn form_identity(parts: &[FormPart]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut field = |value: &[u8]| {
        bytes.extend_from_slice(&(value.len() as u64).to_be_bytes());
        bytes.extend_from_slice(value);
    };
    for part in parts {
        field(part.name.as_bytes());
        field(part.file_name.as_deref().unwrap_or_default().as_bytes());
        field(part.content_type.as_deref().unwrap_or_default().as_bytes());
        field(&part.content);
    }
    bytes
}

/// Everything the choice is made from.
#[allow(missing_debug_implementations)]
pub(crate) struct KeyInputs<'a> {
    pub(crate) arg: &'a KeyArg,
    pub(crate) scope: &'a str,
    /// The request's own key header: `Some(None)` when `-H "Name:"` asked for none.
    pub(crate) header: Option<Option<&'a str>>,
    /// Whether the method gets a key without being given one (`POST`, `PATCH`...).
    pub(crate) keyed_method: bool,
    pub(crate) run: Option<(String, Option<String>)>,
    /// The request's identity, for a key derived from the run.
    pub(crate) request: &'a dyn Fn() -> String,
}

/// Chooses the key; `Err` is a usage error's message.
pub(crate) fn choose(inputs: &KeyInputs<'_>) -> Result<KeyChoice, String> {
    let parse = |text: &str, what: &str| {
        IdempotencyKey::new(text).map_err(|err| format!("{what} {text:?}: {err}"))
    };
    let from_args = match inputs.arg {
        KeyArg::Given(text) => Some((parse(text, "--key")?, KeySource::Given)),
        KeyArg::From(parts) => {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            Some((
                IdempotencyKey::derive(inputs.scope, &parts),
                KeySource::Derived,
            ))
        }
        KeyArg::Auto => None,
    };
    match (from_args, inputs.header) {
        (Some((key, source)), None) => Ok(KeyChoice {
            key: Some(key),
            source,
        }),
        (Some((key, source)), Some(Some(header))) => {
            if header == key.as_str() {
                Ok(KeyChoice {
                    key: Some(key),
                    source,
                })
            } else {
                Err(format!(
                    "the key header says {header:?} but --{} gives {:?}: give one key",
                    source.name(),
                    key.as_str()
                ))
            }
        }
        (Some(_), Some(None)) => {
            Err("a key is given and the key header is removed (-H \"Name:\"): choose one".into())
        }
        (None, Some(Some(header))) => Ok(KeyChoice {
            key: Some(parse(header, "the key header")?),
            source: KeySource::Header,
        }),
        (None, Some(None)) => Ok(KeyChoice {
            key: None,
            source: KeySource::Refused,
        }),
        (None, None) if !inputs.keyed_method => Ok(KeyChoice {
            key: None,
            source: KeySource::None,
        }),
        (None, None) => Ok(match &inputs.run {
            Some((run, step)) => {
                let request = (inputs.request)();
                let mut parts = vec![run.as_str(), inputs.scope];
                if let Some(step) = step {
                    parts.extend(["step", step.as_str()]);
                }
                parts.push(&request);
                KeyChoice {
                    key: Some(IdempotencyKey::derive("idemcurl.run", &parts)),
                    source: KeySource::Run,
                }
            }
            None => KeyChoice {
                key: Some(IdempotencyKey::random()),
                source: KeySource::Fresh,
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(
        arg: &'a KeyArg,
        run: Option<(&str, Option<&str>)>,
        request: &'a dyn Fn() -> String,
    ) -> KeyInputs<'a> {
        KeyInputs {
            arg,
            scope: "idemcurl",
            header: None,
            keyed_method: true,
            run: run.map(|(run, step)| (run.to_owned(), step.map(str::to_owned))),
            request,
        }
    }

    #[test]
    fn the_run_and_the_request_make_the_key_and_nothing_else_does() {
        let charge = || "charge".to_owned();
        let refund = || "refund".to_owned();
        let key = |run, step, request: &dyn Fn() -> String| {
            choose(&inputs(&KeyArg::Auto, Some((run, step)), request))
                .expect("chosen")
                .key
                .expect("a key")
        };
        assert_eq!(key("r1", None, &charge), key("r1", None, &charge));
        assert_ne!(key("r1", None, &charge), key("r2", None, &charge));
        assert_ne!(key("r1", None, &charge), key("r1", None, &refund));
        assert_ne!(key("r1", Some("1"), &charge), key("r1", Some("2"), &charge));
        assert_ne!(key("r1", Some("1"), &charge), key("r1", None, &charge));
        let fresh = choose(&inputs(&KeyArg::Auto, None, &charge)).expect("fresh");
        assert_eq!(fresh.source, KeySource::Fresh);
        let again = choose(&inputs(&KeyArg::Auto, None, &charge)).expect("fresh");
        assert_ne!(fresh.key, again.key);
    }

    #[test]
    fn key_from_is_the_library_derivation() {
        let arg = KeyArg::From(vec!["order-1".into(), "charge".into()]);
        let none = || String::new();
        let chosen = choose(&inputs(&arg, None, &none)).expect("derived");
        assert_eq!(
            chosen.key,
            Some(IdempotencyKey::derive("idemcurl", &["order-1", "charge"]))
        );
        assert_eq!(chosen.source, KeySource::Derived);
    }

    #[test]
    fn the_header_and_the_flags_must_agree() {
        let none = || String::new();
        let given = KeyArg::Given("k-1".into());
        let mut both = inputs(&given, None, &none);
        both.header = Some(Some("k-1"));
        assert_eq!(choose(&both).expect("same").source, KeySource::Given);
        both.header = Some(Some("k-2"));
        assert!(choose(&both).expect_err("differ").contains("give one key"));
        both.header = Some(None);
        assert!(choose(&both).is_err());
        let auto = KeyArg::Auto;
        let mut header = inputs(&auto, Some(("r", None)), &none);
        header.header = Some(Some("from-header"));
        let chosen = choose(&header).expect("header");
        assert_eq!(chosen.source, KeySource::Header);
        assert_eq!(chosen.key.expect("key").as_str(), "from-header");
        let mut get = inputs(&auto, Some(("r", None)), &none);
        get.keyed_method = false;
        assert_eq!(choose(&get).expect("get").source, KeySource::None);
        let bad = KeyArg::Given(String::new());
        assert!(
            choose(&inputs(&bad, None, &none))
                .expect_err("empty")
                .contains("--key")
        );
    }

    #[test]
    fn the_environment_names_a_run_only_when_set_and_not_empty() {
        let env = crate::test_env::env;
        assert_eq!(run_identity(env(&[])), None);
        assert_eq!(run_identity(env(&[(RUN_VARIABLE, "")])), None);
        assert_eq!(
            run_identity(env(&[(RUN_VARIABLE, "r"), (STEP_VARIABLE, "")])),
            Some(("r".into(), None))
        );
        assert_eq!(
            run_identity(env(&[(RUN_VARIABLE, "r"), (STEP_VARIABLE, "3")])),
            Some(("r".into(), Some("3".into())))
        );
    }
}
