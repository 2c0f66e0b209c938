//! Clocks and sleepers: the crate's only contact with time.
//!
//! The retry loop never reads a clock or sleeps directly. It asks a [`Clock`] for the monotonic
//! time (to measure the reconcile window) and the wall-clock time (only to turn an HTTP-date
//! `Retry-After` into a delay), and a [`Sleeper`] to wait between attempts. The defaults use
//! tokio, so `tokio::time::pause` works; tests substitute a recording sleeper and a manual clock
//! to assert exact delays without waiting for them.
//!
//! This folder is the bottom layer: clocks and sleepers (`clock.rs`), and times and durations
//! as messages write them (`readable.rs`).
//!
//! May import: nothing.

mod clock;
pub(crate) mod readable;

pub use clock::{Clock, Sleep, Sleeper, TokioClock, TokioSleeper};
