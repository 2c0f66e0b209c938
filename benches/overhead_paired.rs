//! The overhead comparison of `benches/overhead.rs`, made robust to a busy machine: the clients
//! take turns request by request (the order rotating every round), so they all run under the
//! same background load, and the median of each client's own latencies is compared.
//!
//! Criterion times one function after another; on a shared machine the load can change
//! between them by more than the few percent being measured. Interleaving removes that
//! (it cannot remove the noise, only make it the same for everyone).
//!
//! Run: `cargo bench --bench overhead_paired` (about 10 s). Prints a markdown table.

mod common;

use std::time::Duration;

use common::{Clients, Contender, start_server};
use idempotent_retry::{Clock, TokioClock};

const WARM_UP_ROUNDS: usize = 2_000;
const ROUNDS: usize = 20_000;

/// The contenders that take turns (the random-key line of `overhead.rs` is left out: it
/// measures key minting, not the wrapper against its peers).
const CONTENDERS: [Contender; 4] = [
    Contender::Bare,
    Contender::BareWithTimeout,
    Contender::Ours,
    Contender::Peer,
];

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let url = start_server().await;
        let clients = Clients::new();
        let clock = TokioClock::new();
        let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); CONTENDERS.len()];
        for round in 0..WARM_UP_ROUNDS + ROUNDS {
            for turn in 0..CONTENDERS.len() {
                let which = (round + turn) % CONTENDERS.len();
                let start = clock.now();
                clients.send(CONTENDERS[which], &url).await;
                if round >= WARM_UP_ROUNDS {
                    samples[which].push(clock.now() - start);
                }
            }
        }
        let medians: Vec<Duration> = samples
            .iter_mut()
            .map(|s| {
                s.sort_unstable();
                percentile(s, 0.5)
            })
            .collect();
        println!(
            "| client ({ROUNDS} interleaved requests each) | median | p90 | median / bare reqwest |"
        );
        println!("|---|---:|---:|---:|");
        for (i, contender) in CONTENDERS.iter().enumerate() {
            println!(
                "| {} | {:.2} us | {:.2} us | {:.3} |",
                contender.name(),
                medians[i].as_secs_f64() * 1e6,
                percentile(&samples[i], 0.9).as_secs_f64() * 1e6,
                medians[i].as_secs_f64() / medians[0].as_secs_f64(),
            );
        }
    });
    rt.shutdown_background();
}
