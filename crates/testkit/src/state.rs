//! The receiver's per-key state: the request log, fault scripts, key rows, effect counts, and
//! the transitions between them.
//!
//! Every transition (log an arrival and take its fault, claim a key, settle it, forget it)
//! runs under one lock, so the lookup and the claim are as atomic as a unique constraint makes
//! them in a real receiver's database. What a test reads back is copied out as the values in
//! `records.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::fault::{Fault, When};
use super::handler::{EffectRecorder, Reply};
use super::records::{
    Arrival, Compensated, Compensation, ForgetError, Handling, KeyRecord, KeyStatus,
    ReplayableResponse, Violation,
};
use idempotent_retry::time::{Clock, TokioClock};

/// The receiver's bookkeeping, shared by its connection tasks, the deliveries' recorders and
/// the [`Receiver`](super::Receiver) a test reads it through. Everything sits behind one
/// `std::sync::Mutex` that no method holds across an `.await`.
pub(super) struct Shared {
    started: Instant,
    /// Stored with every key ([`KeyRecord::scope`]).
    scope: String,
    /// Woken on every arrival and every outcome.
    changed: Notify,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    arrivals: Vec<Arrival>,
    by_request: HashMap<u64, Fault>,
    by_key: HashMap<(String, u32), Fault>,
    key_attempts: HashMap<String, u32>,
    rows: HashMap<String, Row>,
    effects: u64,
    effects_by_key: HashMap<String, u64>,
    keyless_effects: u64,
    violations: Vec<Violation>,
    compensated: Vec<Compensated>,
}

struct Row {
    fingerprint: [u8; 32],
    status: KeyStatus,
    saved: Option<ReplayableResponse>,
}

impl EffectRecorder for Shared {
    fn record_effect(&self, key: Option<&str>) -> u64 {
        let mut st = self.lock();
        st.effects += 1;
        match key {
            Some(key) => *st.effects_by_key.entry(key.to_owned()).or_default() += 1,
            None => st.keyless_effects += 1,
        }
        st.effects
    }
}

/// What the idempotency check says about one delivery.
pub(super) enum Admission {
    Run,
    InProgress,
    Mismatch,
    Replay(ReplayableResponse),
}

impl Shared {
    /// Empty state for a receiver that starts now.
    pub(super) fn new(scope: String) -> Shared {
        Shared {
            started: TokioClock::new().now(),
            scope,
            changed: Notify::new(),
            state: Mutex::default(),
        }
    }

    /// The receiver's scope.
    pub(super) fn scope(&self) -> &str {
        &self.scope
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not turn every later call into a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Scripts `fault` for the delivery `when` picks, replacing an earlier script for it.
    pub(super) fn inject(&self, when: When, fault: Fault) {
        let mut st = self.lock();
        match when {
            When::Request(n) => {
                st.by_request.insert(n, fault);
            }
            When::KeyAttempt { key, attempt } => {
                st.by_key.insert((key, attempt), fault);
            }
        }
    }

    /// A future that resolves at the next arrival or outcome. Create it before checking the
    /// condition it waits for, so a change in between is not missed.
    pub(super) fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    pub(super) fn effects(&self) -> u64 {
        self.lock().effects
    }

    pub(super) fn effects_for(&self, key: &str) -> u64 {
        self.lock().effects_by_key.get(key).copied().unwrap_or(0)
    }

    pub(super) fn keyless_effects(&self) -> u64 {
        self.lock().keyless_effects
    }

    pub(super) fn arrivals(&self) -> u64 {
        self.lock().arrivals.len() as u64
    }

    pub(super) fn log(&self) -> Vec<Arrival> {
        self.lock().arrivals.clone()
    }

    pub(super) fn keys(&self) -> Vec<Option<String>> {
        self.lock().arrivals.iter().map(|a| a.key.clone()).collect()
    }

    /// Whether every arrival has its outcome (no handler running).
    pub(super) fn idle(&self) -> bool {
        self.lock()
            .arrivals
            .iter()
            .all(|a| a.outcome != Handling::Pending)
    }

    pub(super) fn record(&self, key: &str) -> Option<KeyRecord> {
        let st = self.lock();
        let row = st.rows.get(key)?;
        Some(KeyRecord {
            scope: self.scope.clone(),
            fingerprint: hex(&row.fingerprint),
            status: row.status,
            response: row.saved.clone(),
            effects: st.effects_by_key.get(key).copied().unwrap_or(0),
        })
    }

    pub(super) fn violations(&self) -> Vec<Violation> {
        self.lock().violations.clone()
    }

    pub(super) fn compensations(&self) -> Vec<Compensated> {
        self.lock().compensated.clone()
    }

    /// Drops `key`'s row, refused while its handler runs and, without a compensation, once
    /// its effect committed. Effect counts are not touched: they say what happened.
    pub(super) fn forget(
        &self,
        key: &str,
        compensation: Option<Compensation>,
    ) -> Result<(), ForgetError> {
        let mut st = self.lock();
        let effects = st.effects_by_key.get(key).copied().unwrap_or(0);
        match st.rows.get(key).map(|row| row.status) {
            None => Err(ForgetError::UnknownKey {
                key: key.to_owned(),
            }),
            Some(KeyStatus::InProgress) => Err(ForgetError::InProgress {
                key: key.to_owned(),
            }),
            Some(_) if effects > 0 => match compensation {
                None => Err(ForgetError::EffectCommitted {
                    key: key.to_owned(),
                    effects,
                }),
                Some(compensation) => {
                    st.rows.remove(key);
                    st.compensated.push(Compensated {
                        key: key.to_owned(),
                        effects,
                        compensation,
                    });
                    Ok(())
                }
            },
            Some(_) => {
                st.rows.remove(key);
                Ok(())
            }
        }
    }

    /// Logs the arrival and takes its scripted fault.
    pub(super) fn arrive(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
    ) -> (u64, Option<Fault>) {
        let at = TokioClock::new()
            .now()
            .saturating_duration_since(self.started);
        let mut st = self.lock();
        let number = st.arrivals.len() as u64 + 1;
        let key_attempt = match key {
            Some(key) => {
                let count = st.key_attempts.entry(key.to_owned()).or_default();
                *count += 1;
                *count
            }
            None => 0,
        };
        let fault = st
            .by_request
            .remove(&number)
            .or_else(|| key.and_then(|key| st.by_key.remove(&(key.to_owned(), key_attempt))));
        st.arrivals.push(Arrival {
            number,
            at,
            method: method.to_owned(),
            path: path.to_owned(),
            key: key.map(str::to_owned),
            key_attempt,
            fault: fault.clone(),
            outcome: Handling::Pending,
            answer_fault: None,
        });
        drop(st);
        self.changed.notify_waiters();
        (number, fault)
    }

    fn update(&self, number: u64, change: impl FnOnce(&mut Arrival)) {
        let mut st = self.lock();
        let index = number.checked_sub(1).and_then(|i| usize::try_from(i).ok());
        if let Some(arrival) = index.and_then(|i| st.arrivals.get_mut(i)) {
            change(arrival);
        }
    }

    pub(super) fn set_outcome(&self, number: u64, outcome: Handling) {
        self.update(number, |arrival| arrival.outcome = outcome);
        self.changed.notify_waiters();
    }

    pub(super) fn set_answer_fault(&self, number: u64, what: String) {
        self.update(number, |arrival| arrival.answer_fault = Some(what));
    }

    /// The idempotency check: lookup and claim under one lock.
    pub(super) fn admit(&self, key: &str, fingerprint: [u8; 32]) -> Admission {
        let mut st = self.lock();
        match st.rows.get_mut(key) {
            Some(row) if row.fingerprint != fingerprint => Admission::Mismatch,
            Some(row) => match row.status {
                KeyStatus::InProgress => Admission::InProgress,
                KeyStatus::Completed => match &row.saved {
                    Some(saved) => Admission::Replay(saved.clone()),
                    // Completed rows always carry their response; be safe anyway.
                    None => Admission::InProgress,
                },
                KeyStatus::Failed => {
                    row.status = KeyStatus::InProgress;
                    Admission::Run
                }
            },
            None => {
                st.rows.insert(
                    key.to_owned(),
                    Row {
                        fingerprint,
                        status: KeyStatus::InProgress,
                        saved: None,
                    },
                );
                Admission::Run
            }
        }
    }

    /// Settles a claimed key after its handler returned.
    pub(super) fn finish(&self, key: &str, request: u64, reply: &Reply, effects: u64) {
        let mut st = self.lock();
        let committed = st.effects_by_key.get(key).copied().unwrap_or(0);
        if reply.release_key {
            if committed == 0 {
                st.rows.remove(key);
                return;
            }
            st.violations.push(Violation::ReleasedCommittedKey {
                key: key.to_owned(),
                request,
                effects: committed,
            });
        }
        let Some(row) = st.rows.get_mut(key) else {
            return;
        };
        if effects == 0 && reply.status >= 500 {
            row.status = KeyStatus::Failed;
        } else {
            row.status = KeyStatus::Completed;
            row.saved = Some(ReplayableResponse {
                status: reply.status,
                headers: reply.headers.clone(),
                body: reply.body.clone(),
            });
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// SHA-256 of the method, the target and the body, length-prefixed; a JSON body in its RFC 8785
/// canonical form, so member order and number spelling do not make two requests differ.
pub(super) fn fingerprint(method: &str, path: &str, body: &[u8]) -> [u8; 32] {
    let canonical = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .map(|json| idempotent_retry::canonical::to_string(&json));
    let body = canonical.as_ref().map_or(body, |c| c.as_bytes());
    let mut hasher = Sha256::new();
    for part in [method.as_bytes(), path.as_bytes(), body] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ignore_json_spelling_but_not_content_or_target() {
        let a = fingerprint("POST", "/v1/charges", br#"{"amount":500,"currency":"eur"}"#);
        let b = fingerprint(
            "POST",
            "/v1/charges",
            br#"{ "currency": "eur", "amount": 5e2 }"#,
        );
        assert_eq!(a, b);
        assert_ne!(a, fingerprint("POST", "/v1/charges", br#"{"amount":501}"#));
        assert_ne!(
            a,
            fingerprint("PUT", "/v1/charges", br#"{"amount":500,"currency":"eur"}"#)
        );
        assert_ne!(
            a,
            fingerprint("POST", "/v1/refunds", br#"{"amount":500,"currency":"eur"}"#)
        );
        // Length prefixes keep the parts apart.
        assert_ne!(
            fingerprint("POST", "/ab", b"c"),
            fingerprint("POST", "/a", b"bc")
        );
        // Not JSON: the raw bytes count.
        assert_ne!(
            fingerprint("POST", "/", b"x "),
            fingerprint("POST", "/", b"x")
        );
        assert_eq!(hex(&a).len(), 64);
    }
}
