//! Shared support for the integration tests.
//!
//! Use it from a test binary with `mod support; use support::*;`. Each test binary uses a subset of
//! the helpers, hence the module-level `dead_code` and `unused_imports` allowances.
#![allow(dead_code, unused_imports)]
// The test server records real arrival times; only the crate itself must read time through `Clock`.
#![allow(clippy::disallowed_methods)]

pub mod crash;
pub mod fault_proxy;
#[cfg(all(feature = "tower", feature = "middleware"))]
pub mod front;
pub mod held;
pub mod ledgers;
pub mod logs;
pub mod policy;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod raw;
pub mod server;

pub use crash::*;
pub use held::*;
pub use ledgers::*;
pub use logs::*;
pub use policy::*;
#[cfg(feature = "postgres")]
pub use postgres::*;
pub use raw::*;
pub use server::*;
pub mod time;

pub use time::*;

/// The name libtest knows `test` by, for a test in `module` (its `module_path!()`): the path
/// below the test binary's crate, so a test can run itself again in a child process with
/// `--exact`, whichever binary its file is compiled into.
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, inside)) => format!("{inside}::{test}"),
        None => test.to_owned(),
    }
}
