//! The integration tests of the facade, as one binary: one link of the whole stack instead of
//! one per file. A test that needs a process of its own (a global subscriber or propagator, a
//! process-wide socket count) stays a binary of its own beside this one.

#[path = "../support/mod.rs"]
mod support;

mod api_surface;
#[cfg(feature = "internals")]
mod budget;
mod budget_soak;
mod canonical_vectors;
mod client;
mod cut_answers;
mod docs_defaults;
mod execute;
mod fleet_clock;
#[cfg(all(feature = "tower", feature = "middleware", feature = "sqlite"))]
mod front_end_ledger;
#[cfg(all(feature = "tower", feature = "middleware", feature = "internals"))]
mod front_ends;
#[cfg(feature = "internals")]
mod hostile_input;
mod hostile_server;
mod in_progress;
mod key_reuse;
mod lease_races;
mod lease_takeover;
mod ledger;
mod ledger_conformance;
mod ledger_files;
mod ledger_postgres;
mod ledger_sqlite;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(all(feature = "multipart", feature = "sqlite"))]
mod multipart;
mod outbox;
mod outbox_postgres;
mod outbox_queued_only;
mod outbox_read_ahead;
mod outbox_torture;
#[cfg(feature = "internals")]
mod properties;
mod quick_start_wal;
mod reconcile;
mod replay_proof;
mod secrets_at_rest;
mod support_selftest;
mod testkit;
mod torture;
#[cfg(feature = "tower")]
mod tower;
mod unsaved_answers;
