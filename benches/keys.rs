//! Cost of deriving keys, against the baseline of hashing `serde_json::to_vec` of the same
//! value (which is not canonical, so not a valid key: it is the floor to compare with).
//!
//! Run: `cargo bench --bench keys`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
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
criterion_main!(benches);
