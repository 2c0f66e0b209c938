//! The one error of the host layer: what went wrong, in words for people, and which of the
//! host language's errors it becomes.

/// Which error a package raises for a [`HostError`]: Python maps them to `ValueError`,
/// `FileNotFoundError`, `OSError` and `RuntimeError`; Node to `TypeError` or `Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostErrorKind {
    /// An argument that is not valid: a bad option, header, URL, key or number.
    Value,
    /// A file named in the settings that does not exist.
    NotFound,
    /// A file named in the settings that cannot be read.
    Io,
    /// Something outside the arguments: the runtime's threads, the ledger, the HTTP client.
    Runtime,
}

/// An error of the host layer, its message naming the cause and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    /// Which error the package raises.
    pub kind: HostErrorKind,
    /// The message for people.
    pub message: String,
}

impl HostError {
    /// A [`HostErrorKind::Value`] error.
    pub fn value(message: impl Into<String>) -> HostError {
        HostError {
            kind: HostErrorKind::Value,
            message: message.into(),
        }
    }

    /// A [`HostErrorKind::Runtime`] error.
    pub fn runtime(message: impl Into<String>) -> HostError {
        HostError {
            kind: HostErrorKind::Runtime,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HostError {}

/// `err` and each of its causes that says more, joined with `: `: reqwest's own message for a
/// body that failed ("error reading a body from connection") says nothing of the cause, and
/// the engine's note on a streamed answer cut midway (its key, and how to have the answer
/// again) is one of the causes.
pub fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}
