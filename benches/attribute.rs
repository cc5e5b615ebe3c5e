//! What `#[rate_limit]` costs over calling the runtime by hand, on the
//! in-memory backend: the same rule, the same key, the same outcome.
//!
//! `cargo bench -p ratelimit-benches --bench attribute`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ratelimit_runtime::{RateLimited, RateLimiter, Rule, rate_limit};
use ratelimit_test_support::ready;

/// A limit the benchmark never reaches (a billion calls a year).
const RULE: Rule = Rule::fixed_window(1_000_000_000, Duration::from_secs(365 * 24 * 3600));

#[rate_limit(key = "bench:attribute", rule = RULE)]
async fn attributed(x: u64) -> Result<u64, RateLimited> {
    Ok(x + 1)
}

/// The same, written by hand against the runtime.
async fn by_hand(x: u64) -> Result<u64, RateLimited> {
    let decision = RateLimiter::global()
        .check(&RULE, "limiter:bench:by-hand")
        .await
        .expect("in memory");
    if !decision.allowed {
        return Err(RateLimited::from_decision(&decision));
    }
    Ok(x + 1)
}

fn attribute_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("attribute_overhead");
    group.bench_function("by_hand", |b| b.iter(|| ready(by_hand(black_box(1)))));
    group.bench_function("attribute", |b| b.iter(|| ready(attributed(black_box(1)))));
    group.finish();
}

criterion_group!(benches, attribute_overhead);
criterion_main!(benches);
