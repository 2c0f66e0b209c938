//! Deterministic helpers for tests: a recording sleeper, fixed keys, a loopback HTTP client.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotent_retry::IdempotencyKey;
use idempotent_retry::time::{Sleep, Sleeper};

/// A [`Sleeper`] that records every wait the retry loop asks for.
///
/// [`new`](Self::new) really waits (on tokio's clock), for tests against real sockets;
/// [`instant`](Self::instant) returns at once, for tests that only look at the delays chosen.
/// Clones share one record.
///
/// # Examples
///
/// ```
/// use idempotent_retry_testkit::RecordingSleeper;
/// use idempotent_retry::{Client, RetryPolicy};
///
/// let sleeper = RecordingSleeper::instant();
/// let client = Client::builder()
///     .sleeper(sleeper.clone())
///     .rng_seed(7)
///     .policy(RetryPolicy::default())
///     .build()
///     .expect("valid policy");
/// # let _ = client;
/// assert!(sleeper.delays().is_empty()); // nothing sent yet
/// ```
#[derive(Debug, Clone)]
pub struct RecordingSleeper {
    delays: Arc<Mutex<Vec<Duration>>>,
    real: bool,
}

impl RecordingSleeper {
    /// Records each wait and really waits it.
    #[must_use]
    pub fn new() -> RecordingSleeper {
        RecordingSleeper {
            delays: Arc::default(),
            real: true,
        }
    }

    /// Records each wait and returns at once.
    #[must_use]
    pub fn instant() -> RecordingSleeper {
        RecordingSleeper {
            delays: Arc::default(),
            real: false,
        }
    }

    /// Every wait asked for so far, in order.
    #[must_use]
    pub fn delays(&self) -> Vec<Duration> {
        self.delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The sum of the waits asked for so far.
    #[must_use]
    pub fn total(&self) -> Duration {
        self.delays()
            .into_iter()
            .fold(Duration::ZERO, Duration::saturating_add)
    }
}

impl Default for RecordingSleeper {
    fn default() -> Self {
        RecordingSleeper::new()
    }
}

impl Sleeper for RecordingSleeper {
    fn sleep(&self, duration: Duration) -> Sleep {
        self.delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(duration);
        if self.real {
            Box::pin(tokio::time::sleep(duration))
        } else {
            Box::pin(std::future::ready(()))
        }
    }
}

/// A fixed, valid, readable key for test `n`: `testkit-key-0000000000000042`. The same `n`
/// always gives the same key.
#[must_use]
pub fn fixed_key(n: u64) -> IdempotencyKey {
    IdempotencyKey::new(format!("testkit-key-{n:016}"))
        .unwrap_or_else(|_| IdempotencyKey::derive("testkit.fixed_key", &[&n.to_string()]))
}

/// A `reqwest::Client` for talking to a loopback [`Receiver`](super::Receiver): it ignores
/// proxy settings from the environment (`HTTP_PROXY` would otherwise catch `127.0.0.1`) and
/// follows no redirect itself, so the [`Client`](idempotent_retry::Client)'s
/// [`RedirectPolicy`](idempotent_retry::RedirectPolicy) applies.
///
/// # Errors
///
/// reqwest's error when it cannot build a client (its TLS
/// back end failed to load).
pub fn loopback_http() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
}
