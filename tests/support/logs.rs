//! The crate's `tracing` output, captured in memory for tests that read it.
//!
//! One global subscriber per test binary: tracing caches per-callsite interest process-wide, so
//! a thread-local subscriber in a binary whose other tests run concurrently would miss events
//! now and then. Tests tell their own lines apart by a unique key.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_env_filter(tracing_subscriber::EnvFilter::new("idempotent_retry=trace"))
            .with_ansi(false)
            .init();
        captured
    })
}

/// Starts capturing every level of the crate's own targets (once per binary); call it before
/// the code whose log a test reads.
pub fn capture_log() {
    captured();
}

/// Everything captured so far.
pub fn log_text() -> String {
    String::from_utf8(captured().0.lock().expect("not poisoned").clone()).expect("utf-8")
}

/// The captured lines that mention `needle`.
pub fn log_lines_with(needle: &str) -> Vec<String> {
    log_text()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}
