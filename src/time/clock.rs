//! The clock and sleeper traits, and tokio's implementations of them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A boxed, `Send` future that completes after a sleep.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of time for the retry loop.
///
/// Implement it to run the loop on a simulated clock. The default is [`TokioClock`].
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The monotonic time, used to measure how much of the reconcile window has passed.
    fn now(&self) -> Instant;

    /// The wall-clock time, used only to turn an HTTP-date `Retry-After` into a delay.
    fn wall(&self) -> SystemTime;
}

/// The default [`Clock`]: `tokio::time::Instant::now()` and `SystemTime::now()`.
///
/// Honours `tokio::time::pause()` for the monotonic part.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct TokioClock;

impl TokioClock {
    /// The tokio clock.
    #[must_use]
    pub const fn new() -> Self {
        TokioClock
    }
}

impl Clock for TokioClock {
    #[allow(clippy::disallowed_methods)] // the one place the real clock is read
    fn now(&self) -> Instant {
        Instant::now()
    }

    #[allow(clippy::disallowed_methods)] // the one place the wall clock is read
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Waits between attempts.
///
/// Implement it to record or skip waits in tests. The default is [`TokioSleeper`].
pub trait Sleeper: Send + Sync + fmt::Debug + 'static {
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// The default [`Sleeper`]: `tokio::time::sleep`.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct TokioSleeper;

impl TokioSleeper {
    /// The tokio sleeper.
    #[must_use]
    pub const fn new() -> Self {
        TokioSleeper
    }
}

impl Sleeper for TokioSleeper {
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock;
        let before = clock.now();
        TokioSleeper.sleep(Duration::from_secs(3600)).await;
        assert_eq!(clock.now() - before, Duration::from_secs(3600));
    }
}
