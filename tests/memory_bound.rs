//! Bounded memory: a million distinct keys in the in-memory store stay under
//! a documented ceiling, memory comes back when they expire, and a cap on
//! tracked keys holds. Measured with the process's resident set size (one
//! test in this binary, so nothing else allocates meanwhile).

use std::time::Duration;

use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{ManualClock, Rule};

/// Documented in the README and BENCHMARKS.md: per million keys.
const CEILING: u64 = 256 << 20;

fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split(' ').nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_million_keys_stay_under_the_ceiling_and_memory_comes_back() {
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone());
    let rule = Rule::gcra(10, Duration::from_secs(1));
    let mut key = String::with_capacity(32);
    let before = rss();
    for i in 0..1_000_000u32 {
        key.clear();
        key.push_str("limiter:user:");
        key.push_str(&i.to_string());
        assert!(store.check_now(&rule, &key, 1).allowed);
    }
    let grown = rss().saturating_sub(before);
    assert_eq!(store.len(), 1_000_000);
    eprintln!(
        "1,000,000 keys: +{} MiB resident, {} bytes per key",
        grown >> 20,
        grown / 1_000_000
    );
    assert!(grown < CEILING, "{} MiB for a million keys", grown >> 20);

    // They all expire; a sweep gives the memory back.
    clock.advance(Duration::from_secs(2));
    store.sweep();
    assert_eq!(store.len(), 0);
    let after = rss();
    eprintln!(
        "after they expired: {} MiB above the start",
        after.saturating_sub(before) >> 20
    );
    assert!(
        after < before + grown / 4,
        "memory was not given back: {} MiB",
        (after - before) >> 20
    );

    // New keys reuse the store without growing past one generation.
    for i in 0..1_000_000u32 {
        store.check_now(&rule, &format!("limiter:other:{i}"), 1);
    }
    clock.advance(Duration::from_secs(2));
    for i in 0..1_000_000u32 {
        store.check_now(&rule, &format!("limiter:third:{i}"), 1);
    }
    assert!(
        store.len() <= 1_100_000,
        "expired keys were reclaimed on the way: {}",
        store.len()
    );

    // A cap: new keys past it are not tracked (their calls pass), tracked
    // keys keep their state.
    let capped = MemoryBackend::with_clock(ManualClock::new()).with_max_keys(6_400);
    let tight = Rule::fixed_window(1, Duration::from_secs(60));
    assert!(capped.check_now(&tight, "limiter:first", 1).allowed);
    for i in 0..50_000u32 {
        capped.check_now(&tight, &format!("limiter:flood:{i}"), 1);
    }
    assert!(capped.len() <= 6_400, "{} keys held", capped.len());
    assert!(
        !capped.check_now(&tight, "limiter:first", 1).allowed,
        "tracked keys are not forgotten"
    );
}
