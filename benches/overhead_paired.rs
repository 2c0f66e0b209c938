//! The overhead comparison of `benches/overhead.rs`, made robust to a busy machine: the clients
//! take turns request by request (the order rotating every round), so they all run under the
//! same background load, and the median of each client's own latencies is compared.
//!
//! The clients: bare reqwest, bare reqwest with a 30 s request timeout, ours, and
//! `reqwest-middleware` + `reqwest-retry` (`RetryTransientMiddleware`, an `ExponentialBackoff`
//! policy of 4 retries) twice, without a timeout (as `overhead.rs` runs it) and with the same
//! 30 s timeout, which our client sets on every attempt: ours and the peer with a timeout are
//! then like for like. After the table, two lines put ours and the peer side by side, over
//! bare reqwest and over bare reqwest + timeout.
//!
//! Criterion times one function after another; on a shared machine the load can change
//! between them by more than the few percent being measured. Interleaving removes that
//! (it cannot remove the noise, only make it the same for everyone).
//!
//! Besides the ratio of medians, each client's cost over bare reqwest with a timeout (the
//! like-for-like floor) is given in microseconds per request: the median of the per-round
//! paired differences (this client's latency minus bare reqwest + timeout's, in the same
//! round), with a 95% confidence interval from a bootstrap over rounds (1 000 resamples of the
//! rounds with replacement, the median difference of each, the 2.5th and 97.5th percentiles of
//! those; the resampling is seeded, so the same samples give the same interval). The interval
//! says how well one run pins its own median; it cannot say how the machine's load moves the
//! figure from one run to the next, which is more: compare several runs.
//!
//! Run: `cargo bench --bench overhead_paired` (10 to 15 s). Prints a markdown table and the
//! two side-by-side lines.
//!
//! Options, after `--`:
//!
//! - `--rounds N`: timed rounds (default 20 000, after 2 000 warm-up rounds).
//! - `--only CLIENT`: one client alone, no interleaving, for profiling with `strace -c -f` or
//!   `perf stat`: 2 000 warm-up requests, then `--requests N` (default 20 000) timed ones, and
//!   their median. `CLIENT` is `bare`, `bare-timeout`, `ours`, `peer`, `peer-timeout` or
//!   `ours-random-key`.
//!   The process's fixed costs (runtime, server, clients) cancel out of the difference
//!   between two runs with different `--requests`.
//! - `--subscriber`: install a `tracing` subscriber that records nothing (the bare
//!   `tracing_subscriber::registry()`, no layer: every span and event is enabled, built and
//!   dropped, nothing is written), as in an application whose exporter is off.
//! - `--subscriber-warn`: the same subscriber behind a `WARN` level filter, as in an
//!   application run with `RUST_LOG=warn`: the crate's INFO spans are disabled at their
//!   call site, and cost what they cost with no subscriber.
//! - `--quick-start`: the README quick start's shape instead (`Client::builder().build()`, a
//!   keyed JSON POST of `{"amount":100,"currency":"eur"}` with `.json()`, a key derived per
//!   request), against bare reqwest + a 30 s timeout and against reqwest-middleware +
//!   `RetryTransientMiddleware` (3 retries) sending the same request, without a timeout as the
//!   peer's own quick start does and with the 30 s one ours sets on every attempt (`--only
//!   quick-ours`, `quick-peer`, `quick-peer-timeout`, `quick-bare` alone).
//! - `--current-thread`: everything (server and client) on one thread, for counting
//!   instructions with `valgrind --tool=callgrind`: with one thread the same requests take the
//!   same path through the code every run, where the two workers' timing varies how often a
//!   future is polled before it is ready by thousands of instructions a request.

mod common;

use std::time::Duration;

use common::{Clients, Contender, start_server};
use idempotent_retry::time::{Clock, TokioClock};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

const WARM_UP_ROUNDS: usize = 2_000;
const ROUNDS: usize = 20_000;
const RESAMPLES: usize = 1_000;

/// The contenders that take turns (the random-key line of `overhead.rs` is left out: it
/// measures key minting, not the wrapper against its peers).
const CONTENDERS: [Contender; 5] = [
    Contender::Bare,
    Contender::BareWithTimeout,
    Contender::Ours,
    Contender::Peer,
    Contender::PeerWithTimeout,
];
/// The quick start's shape (`--quick-start`): the floor first, then ours, then the peer, then
/// the peer with the timeout ours sets.
const QUICK_START: [Contender; 4] = [
    Contender::QuickBare,
    Contender::QuickOurs,
    Contender::QuickPeer,
    Contender::QuickPeerTimeout,
];
/// The floor the differences are taken against: bare reqwest with a timeout.
const FLOOR: usize = 1;
/// Our client and the peer with the same timeout, side by side in the summary lines.
const OURS: usize = 2;
const PEER: usize = 3;
const PEER_WITH_TIMEOUT: usize = 4;

/// What the command line asks for.
struct Args {
    only: Option<Contender>,
    rounds: usize,
    requests: usize,
    current_thread: bool,
    subscriber: Option<Subscriber>,
    quick_start: bool,
}

/// The `tracing` subscriber a run installs (`--subscriber`, `--subscriber-warn`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Subscriber {
    /// Every span enabled, none recorded.
    RecordsNothing,
    /// The same behind a `WARN` level filter.
    Warn,
}

impl Args {
    /// Reads `--only`, `--rounds`, `--requests` and `--current-thread`; anything else
    /// (cargo's `--bench`) is ignored.
    fn parse() -> Args {
        let mut args = Args {
            only: None,
            rounds: ROUNDS,
            requests: ROUNDS,
            current_thread: false,
            subscriber: None,
            quick_start: false,
        };
        let mut words = std::env::args().skip(1);
        while let Some(word) = words.next() {
            let mut value = || {
                words
                    .next()
                    .unwrap_or_else(|| panic!("{word} needs a value"))
            };
            match word.as_str() {
                "--only" => {
                    let name = value();
                    let contender = Contender::EVERY
                        .into_iter()
                        .find(|c| c.flag() == name)
                        .unwrap_or_else(|| {
                            let known: Vec<_> = Contender::EVERY.iter().map(|c| c.flag()).collect();
                            panic!("--only {name}: not one of {}", known.join(", "))
                        });
                    args.only = Some(contender);
                }
                "--rounds" => args.rounds = count(&value()),
                "--requests" => args.requests = count(&value()),
                "--current-thread" => args.current_thread = true,
                "--quick-start" => args.quick_start = true,
                "--subscriber" => args.subscriber = Some(Subscriber::RecordsNothing),
                "--subscriber-warn" => args.subscriber = Some(Subscriber::Warn),
                _ => {}
            }
        }
        args
    }
}

fn count(text: &str) -> usize {
    match text.replace('_', "").parse() {
        Ok(n) if n > 0 => n,
        _ => panic!("{text}: not a positive count"),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// The median of `values`, reordering them.
fn median(values: &mut [f64]) -> f64 {
    let mid = values.len() / 2;
    let (_, m, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    *m
}

/// The median of the paired differences and its 95% bootstrap interval (percentile method,
/// resampling the rounds).
fn paired_difference(diffs: &[f64], rng: &mut StdRng) -> (f64, f64, f64) {
    let mut scratch = diffs.to_vec();
    let point = median(&mut scratch);
    let n = diffs.len();
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for slot in scratch.iter_mut() {
                // A uniform index by multiply-shift: the bias (n / 2^64) is nil here.
                let i = ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize;
                *slot = diffs[i];
            }
            median(&mut scratch)
        })
        .collect();
    medians.sort_unstable_by(f64::total_cmp);
    let at = |p: f64| medians[((RESAMPLES - 1) as f64 * p).round() as usize];
    (point, at(0.025), at(0.975))
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Each contender's latencies, taking turns request by request, the order rotating every
/// round.
async fn take_turns(
    clients: &Clients,
    url: &str,
    clock: &TokioClock,
    rounds: usize,
    contenders: &[Contender],
) -> Vec<Vec<Duration>> {
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); contenders.len()];
    for round in 0..WARM_UP_ROUNDS + rounds {
        for turn in 0..contenders.len() {
            let which = (round + turn) % contenders.len();
            let start = clock.now();
            clients.send(contenders[which], url).await;
            if round >= WARM_UP_ROUNDS {
                samples[which].push(clock.now() - start);
            }
        }
    }
    samples
}

/// The quick start's shape: ours and the peer over bare reqwest + timeout, each request's
/// latency paired with the floor's of the same round.
async fn quick_start(clients: &Clients, url: &str, clock: &TokioClock, rounds: usize) {
    let mut samples = take_turns(clients, url, clock, rounds, &QUICK_START).await;
    let mut rng = StdRng::seed_from_u64(18);
    let diffs: Vec<Vec<f64>> = samples
        .iter()
        .map(|s| {
            s.iter()
                .zip(&samples[0])
                .map(|(&one, &floor)| micros(one) - micros(floor))
                .collect()
        })
        .collect();
    for s in &mut samples {
        s.sort_unstable();
    }
    let medians: Vec<Duration> = samples.iter().map(|s| percentile(s, 0.5)).collect();
    println!(
        "| quick start's shape ({rounds} interleaved requests each) | median | p90 | median / \
         bare + timeout | paired difference to bare + timeout, us (95% CI) |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (i, contender) in QUICK_START.iter().enumerate() {
        let difference = if i == 0 {
            "0".to_owned()
        } else {
            let (point, low, high) = paired_difference(&diffs[i], &mut rng);
            format!("{point:+.2} ({low:+.2} to {high:+.2})")
        };
        println!(
            "| {} | {:.2} us | {:.2} us | {:.3} | {difference} |",
            contender.name(),
            micros(medians[i]),
            micros(percentile(&samples[i], 0.9)),
            medians[i].as_secs_f64() / medians[0].as_secs_f64(),
        );
    }
    println!(
        "\nquick start, median / bare reqwest + timeout: ours {:.3}, peer {:.3}, peer + timeout \
         {:.3}",
        medians[1].as_secs_f64() / medians[0].as_secs_f64(),
        medians[2].as_secs_f64() / medians[0].as_secs_f64(),
        medians[3].as_secs_f64() / medians[0].as_secs_f64(),
    );
}

async fn interleaved(clients: &Clients, url: &str, clock: &TokioClock, rounds: usize) {
    let mut samples = take_turns(clients, url, clock, rounds, &CONTENDERS).await;
    // Differences first, while the samples are still in round order.
    let diffs: Vec<Vec<f64>> = samples
        .iter()
        .map(|s| {
            s.iter()
                .zip(&samples[FLOOR])
                .map(|(&ours, &floor)| micros(ours) - micros(floor))
                .collect()
        })
        .collect();
    for s in &mut samples {
        s.sort_unstable();
    }
    let medians: Vec<Duration> = samples.iter().map(|s| percentile(s, 0.5)).collect();
    let mut rng = StdRng::seed_from_u64(18);
    println!(
        "| client ({rounds} interleaved requests each) | median | p90 | median / bare reqwest \
         | median / bare + timeout | paired difference to bare + timeout, us (95% CI) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, contender) in CONTENDERS.iter().enumerate() {
        let difference = if i == FLOOR {
            "0".to_owned()
        } else {
            let (point, low, high) = paired_difference(&diffs[i], &mut rng);
            format!("{point:+.2} ({low:+.2} to {high:+.2})")
        };
        println!(
            "| {} | {:.2} us | {:.2} us | {:.3} | {:.3} | {difference} |",
            contender.name(),
            micros(medians[i]),
            micros(percentile(&samples[i], 0.9)),
            medians[i].as_secs_f64() / medians[0].as_secs_f64(),
            medians[i].as_secs_f64() / medians[FLOOR].as_secs_f64(),
        );
    }
    let over = |i: usize, floor: usize| medians[i].as_secs_f64() / medians[floor].as_secs_f64();
    println!(
        "\nmedian / bare reqwest: {} {:.3}, {} {:.3}, {} {:.3}",
        CONTENDERS[OURS].name(),
        over(OURS, 0),
        CONTENDERS[PEER].name(),
        over(PEER, 0),
        CONTENDERS[PEER_WITH_TIMEOUT].name(),
        over(PEER_WITH_TIMEOUT, 0),
    );
    println!(
        "median / bare reqwest + timeout, the same 30 s timeout on all three: {} {:.3}, {} {:.3}",
        CONTENDERS[OURS].name(),
        over(OURS, FLOOR),
        CONTENDERS[PEER_WITH_TIMEOUT].name(),
        over(PEER_WITH_TIMEOUT, FLOOR),
    );
}

async fn alone(
    clients: &Clients,
    url: &str,
    clock: &TokioClock,
    contender: Contender,
    requests: usize,
) {
    for _ in 0..WARM_UP_ROUNDS {
        clients.send(contender, url).await;
    }
    let mut samples = Vec::with_capacity(requests);
    let began = clock.now();
    for _ in 0..requests {
        let start = clock.now();
        clients.send(contender, url).await;
        samples.push(clock.now() - start);
    }
    let total = clock.now() - began;
    samples.sort_unstable();
    println!(
        "{}: {requests} requests after {WARM_UP_ROUNDS} warm-up, median {:.2} us, p90 {:.2} us, \
         {:.2} us per request in all",
        contender.name(),
        micros(percentile(&samples, 0.5)),
        micros(percentile(&samples, 0.9)),
        micros(total) / requests as f64,
    );
}

fn main() {
    let args = Args::parse();
    match args.subscriber {
        Some(Subscriber::RecordsNothing) => {
            tracing::subscriber::set_global_default(tracing_subscriber::registry())
                .expect("the first subscriber");
            println!("with a subscriber that records nothing (tracing_subscriber::registry())");
        }
        Some(Subscriber::Warn) => {
            use tracing_subscriber::layer::SubscriberExt as _;
            let subscriber =
                tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::WARN);
            tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
            println!("with a subscriber behind a WARN level filter (RUST_LOG=warn)");
        }
        None => {}
    }
    let mut builder = if args.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(2);
        builder
    };
    let rt = builder.enable_all().build().expect("a tokio runtime");
    rt.block_on(async {
        let url = start_server().await;
        let clients = Clients::new();
        let clock = TokioClock::new();
        match args.only {
            Some(contender) => alone(&clients, &url, &clock, contender, args.requests).await,
            None if args.quick_start => quick_start(&clients, &url, &clock, args.rounds).await,
            None => interleaved(&clients, &url, &clock, args.rounds).await,
        }
    });
    rt.shutdown_background();
}
