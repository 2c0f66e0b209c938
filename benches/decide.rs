//! Cost of one retry decision: classifying an attempt's outcome, checking the limits, reading
//! `Retry-After`, drawing the full-jitter backoff. Pure CPU: no clock beyond one read, no I/O.
//!
//! Run: `cargo bench --bench decide`.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, StatusCode};
use idempotent_retry::internals::{self, DecideInput};
use idempotent_retry::{FailureKind, RetryPolicy};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

/// A keyed, replayable `POST` after attempt number `attempts`, decided at once.
fn keyed_post(attempts: u32) -> DecideInput {
    DecideInput {
        attempts,
        keyed: true,
        idempotent_method: false,
        replayable: true,
        elapsed: Duration::ZERO,
    }
}

fn decide(c: &mut Criterion) {
    let policy = RetryPolicy::default();
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut rng = StdRng::seed_from_u64(7);
    let none = HeaderMap::new();
    let mut seconds = HeaderMap::new();
    seconds.insert("retry-after", HeaderValue::from_static("2"));
    let mut date = HeaderMap::new();
    date.insert(
        "retry-after",
        HeaderValue::from_static("Tue, 14 Nov 2023 22:13:25 GMT"),
    );

    let mut group = c.benchmark_group("decide");
    group.bench_function("200 final", |b| {
        b.iter(|| {
            internals::decide(
                &policy,
                &keyed_post(1),
                Ok((black_box(StatusCode::OK), &none)),
                wall,
                rng.next_u64(),
            )
        })
    });
    group.bench_function("503 backoff", |b| {
        b.iter(|| {
            internals::decide(
                &policy,
                &keyed_post(black_box(2)),
                Ok((black_box(StatusCode::SERVICE_UNAVAILABLE), &none)),
                wall,
                rng.next_u64(),
            )
        })
    });
    group.bench_function("429 retry-after seconds", |b| {
        b.iter(|| {
            internals::decide(
                &policy,
                &keyed_post(1),
                Ok((
                    black_box(StatusCode::TOO_MANY_REQUESTS),
                    black_box(&seconds),
                )),
                wall,
                rng.next_u64(),
            )
        })
    });
    group.bench_function("429 retry-after http-date", |b| {
        b.iter(|| {
            internals::decide(
                &policy,
                &keyed_post(1),
                Ok((black_box(StatusCode::TOO_MANY_REQUESTS), black_box(&date))),
                wall,
                rng.next_u64(),
            )
        })
    });
    group.bench_function("timeout backoff", |b| {
        b.iter(|| {
            internals::decide(
                &policy,
                &keyed_post(black_box(3)),
                Err(black_box(FailureKind::Timeout)),
                wall,
                rng.next_u64(),
            )
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = decide
}
criterion_main!(benches);
