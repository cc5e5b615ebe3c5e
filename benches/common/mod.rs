//! What the in-memory benches share: the keys, the rules and one check of
//! ours, so `memory` (criterion) and `threads` (paired rounds) measure the
//! same work.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, Quota};
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{Algorithm, RateLimiter, Rule};
use ratelimit_test_support::ready;

/// How many keys the many-key rows visit.
pub(crate) const KEYS: usize = 100_000;

/// The bench's keys, `limiter:user:<i>`.
#[allow(dead_code, reason = "the footprint bench takes a shape of keys")]
pub(crate) fn keys() -> Vec<String> {
    keys_of("user")
}

/// The shapes of keys the footprint and `--versus` runs measure: `user`
/// (`limiter:user:<i>`, the default), `short` (`k<i>`), and what the HTTP
/// adapters make: `ipv4` (`limiter:api:ip:10.1.2.3`), `ipv6` (a /64,
/// `limiter:api:ip:2001:db8:0:1f4::/64`) and `header` (a keyed digest,
/// `limiter:api:header:x-api-key:#<32 hex digits>`).
#[allow(dead_code, reason = "the memory bench uses the default keys only")]
pub(crate) const SHAPES: [&str; 5] = ["user", "short", "ipv4", "ipv6", "header"];

/// [`KEYS`] keys of `shape` (one of [`SHAPES`]), each distinct.
pub(crate) fn keys_of(shape: &str) -> Vec<String> {
    (0..KEYS as u32)
        .map(|i| match shape {
            "user" => format!("limiter:user:{i}"),
            "short" => format!("k{i}"),
            "ipv4" => format!(
                "limiter:api:ip:10.{}.{}.{}",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            ),
            "ipv6" => format!(
                "limiter:api:ip:2001:db8:{:x}:{:x}::/64",
                i >> 16,
                i & 0xffff
            ),
            "header" => {
                // 32 hex digits, spread like a digest's.
                let x = u128::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
                format!("limiter:api:header:x-api-key:#{x:032x}")
            }
            other => panic!("unknown key shape {other}: one of {SHAPES:?}"),
        })
        .collect()
}

/// A rule that never refuses. Keys keep their state between visits, as
/// governor's do, except the sliding log's and concurrency's, whose window
/// stays short so logs and lease lists stay short (those keys expire between
/// visits and are stored again: the insert-and-sweep path).
///
/// The buckets need two shapes for that: one key visited every few ns keeps
/// a bucket that refills about as fast (a billion per 4 s); 100k keys each
/// visited every few ms keep a huge bucket that refills slowly (a million
/// tokens, one more an hour), whose state then lasts. A fast-refilling
/// bucket would be full again, so expired, before each key's next visit.
pub(crate) fn rule(algorithm: Algorithm, many_keys: bool) -> Rule {
    match algorithm {
        Algorithm::SlidingLog | Algorithm::Concurrency => {
            Rule::new(algorithm, 1_000_000_000, Duration::from_millis(1))
        }
        // Within 2^52 µs·tokens, as the rule requires.
        Algorithm::TokenBucket | Algorithm::Gcra if many_keys => {
            Rule::new(algorithm, 1, Duration::from_secs(3600)).with_burst(1_000_000)
        }
        Algorithm::TokenBucket | Algorithm::Gcra => {
            Rule::new(algorithm, 1_000_000_000, Duration::from_secs(4)).with_burst(1_000_000_000)
        }
        _ => Rule::new(algorithm, 1_000_000_000, Duration::from_secs(3600)),
    }
}

/// The algorithms whose state lasts between a key's visits under [`rule`]
/// (the sliding log's and the leases' expire at once), compared with
/// governor key for key.
#[allow(
    dead_code,
    reason = "the memory bench includes this module and compares every algorithm"
)]
pub(crate) const LASTING: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

/// Governor's keyed limiter with `String` keys, a quota that never refuses.
pub(crate) fn governor() -> DefaultKeyedRateLimiter<String> {
    governor::RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX))
}

/// Our side for `algorithm`: a store of its own, and a limiter installed as
/// `<prefix>-<algorithm>` for the concurrency rule's leases (an installed
/// limiter's, as the attribute's calls take them).
pub(crate) fn ours_for(prefix: &str, algorithm: Algorithm) -> (MemoryBackend, RateLimiter) {
    let name = format!("{prefix}-{}", algorithm.name());
    RateLimiter::in_memory().install_as(&name).unwrap();
    (MemoryBackend::new(), RateLimiter::named(&name).unwrap())
}

/// One check-and-consume of our limiter (a concurrency rule takes and
/// releases its lease, as a call does, through an installed limiter as the
/// attribute's calls are: see `RateLimiter::acquire` for one not installed).
pub(crate) fn ours(store: &MemoryBackend, limiter: &RateLimiter, rule: &Rule, key: &str) {
    if rule.algorithm() == Algorithm::Concurrency {
        let permit = ready(limiter.acquire(rule, key, 1)).unwrap();
        black_box(permit.decision().allowed);
    } else {
        black_box(store.check_now(rule, key, 1).allowed);
    }
}

/// The positions `0..n` in one fixed random order (Fisher-Yates over a
/// xorshift sequence), the same for every run.
#[allow(
    dead_code,
    reason = "the footprint bench includes this module and orders nothing"
)]
pub(crate) fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}
