//! What every front end is configured with: the shared [`Settings`], one request's
//! [`Overrides`], and where jitter comes from. Configuration only: it imports nothing that
//! runs an operation, so every stage above can read it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderName;
use rand::rngs::StdRng;

use crate::decision::budget::RetryBudget;
use crate::decision::policy::RetryPolicy;
use crate::keys::key::IdempotencyKey;
use crate::ledger::{HeldRow, LedgerHandle};
use crate::outcome::observe::Observer;
use crate::time::{Clock, Sleeper};

/// Where jitter comes from: the thread-local RNG, or one seeded RNG shared by all clones.
pub(crate) enum Jitter {
    Thread,
    Seeded(Box<Mutex<StdRng>>),
}

/// Everything the engine needs that is shared by all operations of one front end.
pub(crate) struct Settings {
    pub(crate) policy: RetryPolicy,
    /// Policies by lowercase host name, between the request's own and `policy`.
    pub(crate) host_policies: HashMap<String, RetryPolicy>,
    pub(crate) key_header: HeaderName,
    pub(crate) auto_keys: bool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) sleeper: Arc<dyn Sleeper>,
    pub(crate) rng: Jitter,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// Carries the attempt number on each attempt when set.
    pub(crate) attempt_header: Option<HeaderName>,
    /// Admits every retry and is charged for those that fail, shared by all clones of the front
    /// end; `None` when turned off.
    pub(crate) budget: Option<RetryBudget>,
    /// The durable operation ledger, if any: every front end claims, records and finishes
    /// through it (`engine/mod.rs`).
    pub(crate) ledger: Option<LedgerHandle>,
    /// Whether the operation span carries the key as `idempotent_retry.idempotency_key`.
    pub(crate) key_in_spans: bool,
    /// An answer whose `Content-Length` is at most this is read inside its attempt.
    pub(crate) answer_read_limit: usize,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_as("Settings", f)
    }
}

impl Settings {
    /// The policy for a request: its own, else its host's, else the default.
    pub(crate) fn policy_for(&self, own: Option<RetryPolicy>, host: Option<&str>) -> RetryPolicy {
        own.or_else(|| {
            // Without per-host policies (the common case) the host is neither copied nor hashed.
            if self.host_policies.is_empty() {
                return None;
            }
            let host = host?.to_ascii_lowercase();
            self.host_policies.get(&host).copied()
        })
        .unwrap_or(self.policy)
    }

    /// Formats the settings as the front end named `name`.
    pub(crate) fn debug_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("policy", &self.policy)
            .field("host_policies", &self.host_policies)
            .field("key_header", &self.key_header)
            .field("auto_keys", &self.auto_keys)
            .field("clock", &self.clock)
            .field("sleeper", &self.sleeper)
            .field(
                "rng",
                &match self.rng {
                    Jitter::Thread => "thread",
                    Jitter::Seeded(_) => "seeded",
                },
            )
            .field("observer", &self.observer)
            .field("attempt_header", &self.attempt_header)
            .field("budget", &self.budget)
            .field("ledger", &self.ledger)
            .field("key_in_spans", &self.key_in_spans)
            .field("answer_read_limit", &self.answer_read_limit)
            .finish_non_exhaustive()
    }
}

/// What one request asks for beyond the front end's settings.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// A key given by the caller.
    pub(crate) key: Option<IdempotencyKey>,
    /// `Some(false)` turns off the random key for this request.
    pub(crate) auto_key: Option<bool>,
    /// A policy for this request only.
    pub(crate) policy: Option<RetryPolicy>,
    /// A per-attempt timeout for this request only.
    pub(crate) timeout: Option<Duration>,
    /// The operation's scope in the ledger; by default the request's host.
    pub(crate) scope: Option<String>,
    /// The row a dispatcher already took for the operation (`Ledger::take_due`).
    pub(crate) held: Option<HeldRow>,
}

impl Overrides {
    /// Each option from `self`, else from `fallback`.
    pub(crate) fn or(self, fallback: Overrides) -> Self {
        Overrides {
            key: self.key.or(fallback.key),
            auto_key: self.auto_key.or(fallback.auto_key),
            policy: self.policy.or(fallback.policy),
            timeout: self.timeout.or(fallback.timeout),
            scope: self.scope.or(fallback.scope),
            held: self.held.or(fallback.held),
        }
    }
}
