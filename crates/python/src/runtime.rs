//! The one tokio runtime every engine of the process shares.

use std::sync::OnceLock;

use tokio::runtime::Runtime;

/// The runtime's worker threads: the HTTP work is I/O, and Python's threads wait on it.
const WORKERS: usize = 2;

/// The process's runtime, started on first use.
///
/// # Panics
///
/// If the operating system refuses to start its threads, which leaves nothing to run on.
pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("idempotent-retry")
            .enable_all()
            .build()
            .expect("the operating system refused to start the idempotent-retry runtime's threads")
    })
}
