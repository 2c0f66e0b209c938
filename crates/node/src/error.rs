//! The host layer's errors as Node's: an `Error` whose `code` says which kind (`InvalidArg`
//! for a bad option or request part, `GenericFailure` otherwise).

use idempotent_retry_host::{HostError, HostErrorKind};
use napi::Status;

/// `err` as a JavaScript error.
pub(crate) fn to_js(err: HostError) -> napi::Error {
    let status = match err.kind {
        HostErrorKind::Value => Status::InvalidArg,
        HostErrorKind::NotFound | HostErrorKind::Io | HostErrorKind::Runtime => {
            Status::GenericFailure
        }
    };
    napi::Error::new(status, err.message)
}
