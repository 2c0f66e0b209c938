//! The tokio runtime every engine of a process shares, one per process: a child made by
//! `fork()` has none of its parent's threads, so it gets a runtime of its own on first use,
//! and what the parent made on the parent's runtime refuses to run in the child ([`Born`]).

use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::runtime::Runtime;

use crate::error::HostError;

/// The runtime's worker threads: the HTTP work is I/O, and the host language's threads wait on
/// it.
const WORKERS: usize = 2;

/// A runtime of this process, or why the operating system refused its threads. Never dropped:
/// a child of a fork cannot join its parent's threads, and a process keeps its own runtime
/// to its end.
type Made = Result<&'static Runtime, String>;

fn start() -> Made {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("idempotent-retry")
        .enable_all()
        .build()
        .map(|runtime| &*Box::leak(Box::new(runtime)))
        .map_err(|err| err.to_string())
}

/// This process's runtime, started on first use.
///
/// # Errors
///
/// A [`HostErrorKind::Runtime`](crate::HostErrorKind::Runtime) error when the operating system refused to start its threads (then every later
/// call in this process says so again: nothing is left to run on).
pub fn runtime() -> Result<&'static Runtime, HostError> {
    // The first process's runtime, read without a lock on every call; the runtimes of
    // children made by `fork()` behind one, which only children take.
    static FIRST: OnceLock<(u32, Made)> = OnceLock::new();
    static FORKED: Mutex<Option<(u32, Made)>> = Mutex::new(None);
    let pid = std::process::id();
    let (owner, made) = FIRST.get_or_init(|| (pid, start()));
    let made = if *owner == pid {
        made.clone()
    } else {
        let mut forked = FORKED.lock().unwrap_or_else(PoisonError::into_inner);
        match &*forked {
            Some((owner, made)) if *owner == pid => made.clone(),
            _ => forked.insert((pid, start())).1.clone(),
        }
    };
    made.map_err(|err| {
        HostError::runtime(format!(
            "cannot start the idempotent-retry runtime's threads: {err}"
        ))
    })
}

/// The process an object bound to a runtime was made in: its connections, tasks and ledger
/// threads live there, and a child of a fork has copies of their handles but not the threads
/// that serve them. Used there, such an object would wait for ever; [`check`](Self::check)
/// refuses instead, and [`is_here`](Self::is_here) tells its `Drop` to leave the parent's
/// resources alone (closing an inherited socket's registration would touch the parent's
/// event queue, which the two processes share).
#[derive(Debug, Clone, Copy)]
pub struct Born(u32);

impl Born {
    /// This process.
    pub fn here() -> Born {
        Born(std::process::id())
    }

    /// Whether this is still the process it was made in.
    pub fn is_here(self) -> bool {
        self.0 == std::process::id()
    }

    /// Nothing when this is the process `what` was made in; otherwise the error tells to make a
    /// new `remake` ("transport", say) in the child.
    ///
    /// # Errors
    ///
    /// A runtime error in a child of a `fork()` made after it, naming both processes and the
    /// fix.
    pub fn check(self, what: &str, remake: &str) -> Result<(), HostError> {
        if self.is_here() {
            return Ok(());
        }
        Err(HostError::runtime(format!(
            "{what} was made in process {} and this is process {}, a child of a fork(): its \
             connections, tasks and ledger belong to the parent. Make a new {remake} after \
             forking (it gets a runtime of its own)",
            self.0,
            std::process::id()
        )))
    }
}
