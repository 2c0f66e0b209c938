//! Virtual time for tests: a clock that only moves when the sleeper sleeps.
//!
//! Real sockets run on the real clock; the retry loop's *waits* run on this one, so a test can
//! ask for a 24 h window or a 30 s `Retry-After` and finish in milliseconds, then assert every
//! delay the loop chose.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idempotent_retry::time::{Clock, Sleep, Sleeper, TokioClock};
use tokio::time::Instant;

#[derive(Debug)]
struct State {
    offset: Duration,
    slept: Vec<Duration>,
}

/// A clock and a sleeper sharing one virtual timeline.
#[derive(Debug, Clone)]
pub struct VirtualTime {
    start: Instant,
    wall: SystemTime,
    state: Arc<Mutex<State>>,
}

impl VirtualTime {
    /// Starts at the real monotonic now and at a fixed wall-clock second (2024-01-01T00:00:00Z),
    /// so HTTP-dates convert to exact delays.
    pub fn new() -> Self {
        VirtualTime {
            start: TokioClock::new().now(),
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200),
            state: Arc::new(Mutex::new(State {
                offset: Duration::ZERO,
                slept: Vec::new(),
            })),
        }
    }

    /// Every sleep requested so far, in order.
    pub fn slept(&self) -> Vec<Duration> {
        self.state.lock().unwrap().slept.clone()
    }

    /// How far the virtual clock has moved.
    pub fn elapsed(&self) -> Duration {
        self.state.lock().unwrap().offset
    }

    /// The virtual wall-clock time now.
    pub fn wall_now(&self) -> SystemTime {
        self.wall + self.elapsed()
    }

    /// Moves the clock without a sleep (time spent inside an attempt).
    pub fn advance(&self, by: Duration) {
        self.state.lock().unwrap().offset += by;
    }
}

impl Clock for VirtualTime {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }
    fn wall(&self) -> SystemTime {
        self.wall_now()
    }
}

impl Sleeper for VirtualTime {
    fn sleep(&self, duration: Duration) -> Sleep {
        let mut state = self.state.lock().unwrap();
        state.offset += duration;
        state.slept.push(duration);
        Box::pin(std::future::ready(()))
    }
}

/// Milliseconds since the Unix epoch, as the SQL ledgers store times.
pub fn millis(at: SystemTime) -> i64 {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("fits")
}
