//! Cost of deriving keys, against the baseline of hashing `serde_json::to_vec` of the same
//! value (which is not canonical, so not a valid key: it is the floor to compare with).
//!
//! Run: `cargo bench --bench keys`.
//!
//! `cargo bench --bench keys -- --paired` times `for_tool_call` and the baseline in turns
//! instead (the order alternating every round, each turn 16 calls), 20 000 rounds at 1 KB,
//! 1 000 at 100 KB and 100 at 1 MB, so both run under the same background load; it prints
//! each one's median per call and the median of the per-round ratios, with a 95% interval
//! from a bootstrap over rounds (1 000 resamples, seeded). Criterion measures one function
//! for seconds and then the other, and on a shared machine the load can change between the
//! two by more than the ratio being measured.
//!
//! `cargo bench --bench keys -- --one WHICH BYTES CALLS` runs one contender alone, for a
//! profiler (`perf record`, `valgrind --tool=callgrind` on the bench binary): `ours`
//! (`for_tool_call`), `canonical` (`canonical::to_string`), `to_vec` or `baseline`, on
//! arguments of about `BYTES` bytes (default 102400), `CALLS` times (default 1000).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{DerivationSecret, IdempotencyKey, backoff, canonical};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A tool-call argument object of roughly `bytes` bytes of JSON.
fn args_of_size(bytes: usize) -> Value {
    let mut items = Vec::new();
    let mut size = 0;
    let mut i = 0u32;
    while size < bytes {
        let item = json!({
            "id": i,
            "email": format!("user{i}@example.com"),
            "amount": f64::from(i) * 1.25,
            "tags": ["a", "b", "ü"],
        });
        size += item.to_string().len() + 1;
        items.push(item);
        i += 1;
    }
    json!({ "to": "ada@example.com", "items": items })
}

fn keys(c: &mut Criterion) {
    c.bench_function("derive/2 parts", |b| {
        b.iter(|| {
            IdempotencyKey::derive(
                black_box("agent.send_email"),
                black_box(&["conv_8f2c", "3"]),
            )
        })
    });
    let secret = DerivationSecret::new([0x5a; 32]).expect("32 bytes");
    c.bench_function("derive keyed/2 parts", |b| {
        b.iter(|| {
            secret.derive(
                black_box("agent.send_email"),
                black_box(&["conv_8f2c", "3"]),
            )
        })
    });
    for (name, size) in [("1KB", 1024), ("64KB", 64 * 1024)] {
        let args = args_of_size(size);
        let mut group = c.benchmark_group(format!("tool_call/{name}"));
        group.bench_function("for_tool_call", |b| {
            b.iter(|| IdempotencyKey::for_tool_call(black_box("send_email"), black_box(&args)))
        });
        group.bench_function("for_tool_call keyed", |b| {
            b.iter(|| secret.for_tool_call(black_box("send_email"), black_box(&args)))
        });
        group.bench_function("canonical_json", |b| {
            b.iter(|| canonical::to_string(black_box(&args)))
        });
        group.bench_function("baseline to_vec+sha256", |b| {
            b.iter(|| {
                let bytes = serde_json::to_vec(black_box(&args)).unwrap_or_default();
                Sha256::digest(&bytes)
            })
        });
        group.finish();
    }
    let mut rng = StdRng::seed_from_u64(1);
    c.bench_function("full_jitter", |b| {
        b.iter(|| {
            backoff::full_jitter(
                black_box(3),
                Duration::from_millis(500),
                Duration::from_secs(30),
                rng.next_u64(),
            )
        })
    });
}

criterion_group!(benches, keys);

/// Calls per timed turn: a 1 KB key takes a few microseconds, so one call alone would be
/// close to the clock's resolution.
const CALLS_PER_TURN: u32 = 16;
const PAIRED_ROUNDS: usize = 20_000;
const RESAMPLES: usize = 1_000;

/// The median of `values`, reordering them.
fn median(values: &mut [f64]) -> f64 {
    let mid = values.len() / 2;
    let (_, m, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    *m
}

/// `for_tool_call` and the baseline in turns, for each argument size.
fn paired() {
    let mut rng = StdRng::seed_from_u64(18);
    println!(
        "| arguments | `for_tool_call`, median per call | baseline, median per call | \
         median of per-round ratios (95% CI) |"
    );
    println!("|---|---:|---:|---:|");
    for (name, size, rounds) in [
        ("1 KB", 1024, PAIRED_ROUNDS),
        ("100 KB", 100 * 1024, PAIRED_ROUNDS / 20),
        ("1 MB", 1024 * 1024, PAIRED_ROUNDS / 200),
    ] {
        let args = args_of_size(size);
        let ours = || {
            for _ in 0..CALLS_PER_TURN {
                black_box(IdempotencyKey::for_tool_call(
                    black_box("send_email"),
                    black_box(&args),
                ));
            }
        };
        let baseline = || {
            for _ in 0..CALLS_PER_TURN {
                let bytes = serde_json::to_vec(black_box(&args)).unwrap_or_default();
                black_box(Sha256::digest(&bytes));
            }
        };
        let clock = TokioClock::new();
        let time = |f: &dyn Fn()| {
            let start = clock.now();
            f();
            (clock.now() - start).as_secs_f64() * 1e6 / f64::from(CALLS_PER_TURN)
        };
        // Warm-up: caches, the scratch buffer, the allocator.
        for _ in 0..rounds / 10 {
            time(&ours);
            time(&baseline);
        }
        let (mut ours_us, mut base_us) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let (a, b) = if round % 2 == 0 {
                let a = time(&ours);
                (a, time(&baseline))
            } else {
                let b = time(&baseline);
                (time(&ours), b)
            };
            ours_us.push(a);
            base_us.push(b);
        }
        let ratios: Vec<f64> = ours_us.iter().zip(&base_us).map(|(a, b)| a / b).collect();
        let mut scratch = ratios.clone();
        let point = median(&mut scratch);
        let mut medians: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                for slot in scratch.iter_mut() {
                    let i = ((u128::from(rng.next_u64()) * ratios.len() as u128) >> 64) as usize;
                    *slot = ratios[i];
                }
                median(&mut scratch)
            })
            .collect();
        medians.sort_unstable_by(f64::total_cmp);
        let at = |p: f64| medians[((RESAMPLES - 1) as f64 * p).round() as usize];
        println!(
            "| {name} | {:.2} us | {:.2} us | {point:.3} ({:.3} to {:.3}) |",
            median(&mut ours_us),
            median(&mut base_us),
            at(0.025),
            at(0.975),
        );
    }
}

/// One of the two contenders alone, `calls` times on arguments of `bytes`, for a profiler.
fn one(which: &str, bytes: usize, calls: u32) {
    let args = args_of_size(bytes);
    for _ in 0..calls {
        match which {
            "ours" => {
                black_box(IdempotencyKey::for_tool_call(
                    black_box("send_email"),
                    black_box(&args),
                ));
            }
            "canonical" => {
                black_box(canonical::to_string(black_box(&args)));
            }
            "to_vec" => {
                black_box(serde_json::to_vec(black_box(&args)).unwrap_or_default());
            }
            "baseline" => {
                let bytes = serde_json::to_vec(black_box(&args)).unwrap_or_default();
                black_box(Sha256::digest(&bytes));
            }
            other => panic!("--one takes ours, canonical, to_vec or baseline, not {other}"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|arg| arg == "--paired") {
        paired();
        return;
    }
    if let Some(at) = args.iter().position(|arg| arg == "--one") {
        let operand = |i: usize| args.get(at + i).map(String::as_str);
        let which = operand(1).unwrap_or("ours");
        let bytes = operand(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(100 * 1024);
        let calls = operand(3).and_then(|n| n.parse().ok()).unwrap_or(1_000);
        one(which, bytes, calls);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
