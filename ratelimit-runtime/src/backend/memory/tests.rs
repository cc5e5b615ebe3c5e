//! The in-process store's tests.

use std::time::Duration;

use super::shard::{CREDIT_PER_CALL, MIN_SWEEP_LEN};
use super::*;
use crate::backend::INLINE_KEY;
use crate::clock::ManualClock;

fn rule(count: u64, period_ms: u64) -> Rule {
    Rule::fixed_window(count, Duration::from_millis(period_ms))
}

/// A key's entry is one cache line: a key of up to 22 bytes in place,
/// its state and its expiry (memory per key, and one line to fetch per
/// check).
#[test]
fn an_entry_is_one_cache_line() {
    assert_eq!(size_of::<Entry>(), 64);
    assert_eq!(align_of::<Entry>(), 64);
}

#[test]
fn window_starts_at_first_call_and_rejections_consume_nothing() {
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone());
    let r = rule(3, 1000);
    clock.advance(Duration::from_millis(250));
    for expected_remaining in [2, 1, 0] {
        let d = store.check_now(&r, "k", 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, expected_remaining);
        assert_eq!(d.reset_after, Duration::from_millis(1000));
    }
    clock.advance(Duration::from_millis(400));
    for _ in 0..5 {
        let d = store.check_now(&r, "k", 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Duration::from_millis(600));
    }
    clock.advance(Duration::from_millis(599));
    assert!(!store.check_now(&r, "k", 1).allowed);
    clock.advance(Duration::from_millis(1));
    let d = store.check_now(&r, "k", 1);
    assert!(d.allowed, "a new window opens exactly at the period's end");
    assert_eq!(d.remaining, 2);
}

#[test]
fn retry_after_is_zero_while_budget_remains() {
    let store = MemoryBackend::with_clock(ManualClock::new());
    let r = rule(2, 1000);
    assert_eq!(store.check_now(&r, "k", 1).retry_after, Duration::ZERO);
    let last = store.check_now(&r, "k", 1);
    assert!(last.allowed);
    assert_eq!(last.retry_after, Duration::from_secs(1));
}

#[test]
fn keys_are_independent() {
    let store = MemoryBackend::with_clock(ManualClock::new());
    let r = rule(1, 1000);
    assert!(store.check_now(&r, "a", 1).allowed);
    assert!(store.check_now(&r, "b", 1).allowed);
    assert!(!store.check_now(&r, "a", 1).allowed);
}

#[test]
fn expired_keys_are_reclaimed_without_being_asked() {
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone());
    let per_round = SHARDS * MIN_SWEEP_LEN;
    let rounds = 8;
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra,
    ] {
        let r = Rule::new(algorithm, 1, Duration::from_millis(10));
        for round in 0..rounds {
            for i in 0..per_round {
                store.check_now(&r, &format!("{round}-{i}"), 1);
            }
            // Every key written so far expires.
            clock.advance(Duration::from_millis(10));
        }
        // Kept without reclaiming: rounds * per_round keys.
        assert!(
            store.len() <= 3 * per_round,
            "{algorithm:?}: expired keys were not reclaimed: {} keys held after {} rounds of {}",
            store.len(),
            rounds,
            per_round
        );
    }
}

#[test]
fn keys_that_outlive_sweeps_keep_their_state() {
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone());
    let kept = Rule::fixed_window(2, Duration::from_secs(3600));
    let brief = rule(1, 10);
    let keep: Vec<String> = (0..5_000).map(|i| format!("keep-{i}")).collect();
    for key in &keep {
        assert!(store.check_now(&kept, key, 1).allowed);
    }
    // Waves of short-lived keys: each wave expires, later ones sweep it
    // out (moving the survivors and rebuilding the index), and the last
    // sweeps shrink the tables.
    for wave in 0..6 {
        let n = if wave < 3 {
            SHARDS * MIN_SWEEP_LEN * 2
        } else {
            SHARDS * 4
        };
        for i in 0..n {
            assert!(
                store
                    .check_now(&brief, &format!("brief-{wave}-{i}"), 1)
                    .allowed
            );
        }
        clock.advance(Duration::from_millis(10));
    }
    store.sweep();
    assert_eq!(store.len(), keep.len(), "only the long-lived keys are left");
    for key in &keep {
        let second = store.check_now(&kept, key, 1);
        assert!(second.allowed, "{key} lost its state");
        assert_eq!(second.remaining, 0, "{key} lost its first call");
        assert!(!store.check_now(&kept, key, 1).allowed, "{key}");
    }
}

#[test]
fn keys_keep_their_state_as_the_index_grows() {
    // Fewer keys than a sweep needs: only growth moves them in the index.
    let store = MemoryBackend::with_clock(ManualClock::new());
    let r = rule(1, 1000);
    let keys: Vec<String> = (0..20_000).map(|i| format!("user:{i}")).collect();
    for key in &keys {
        assert!(store.check_now(&r, key, 1).allowed, "{key}");
    }
    for key in &keys {
        assert!(!store.check_now(&r, key, 1).allowed, "{key} lost its call");
    }
    assert_eq!(store.len(), keys.len());
}

#[test]
fn short_and_long_keys_are_told_apart() {
    let store = MemoryBackend::with_clock(ManualClock::new());
    let r = rule(1, 1000);
    let keys: Vec<String> = (INLINE_KEY - 2..INLINE_KEY + 3)
        .map(|n| "k".repeat(n))
        .collect();
    for key in &keys {
        assert!(store.check_now(&r, key, 1).allowed, "{} bytes", key.len());
    }
    for key in &keys {
        assert!(!store.check_now(&r, key, 1).allowed, "{} bytes", key.len());
    }
    assert_eq!(store.len(), keys.len());
}

#[test]
fn a_cap_set_on_a_shared_store_holds_for_every_clone() {
    let store = MemoryBackend::with_clock(ManualClock::new());
    let shared = store.clone();
    let store = store.with_max_keys(SHARDS); // about one key per shard
    let rule = rule(1, 60_000);
    for i in 0..10_000 {
        shared.check_now(&rule, &format!("k{i}"), 1);
    }
    assert!(shared.len() <= SHARDS, "{} keys held", shared.len());
    assert_eq!(store.len(), shared.len(), "one store");
}

/// A full store still limits the keys it cannot track: they share
/// their rule's overflow budget. (They used to be allowed on every
/// call, untracked: a flood of new keys made every new caller
/// unlimited.)
#[test]
fn a_full_store_limits_the_keys_it_cannot_track() {
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * 16);
    let r = rule(3, 60_000);
    for i in 0..SHARDS * 64 {
        store.check_now(&r, &format!("flood-{i}"), 1);
    }
    assert!(store.len() <= SHARDS * 16, "{} keys held", store.len());
    let passed = |rule: &Rule, prefix: &str| {
        (0..1_000)
            .filter(|i| store.check_now(rule, &format!("{prefix}-{i}"), 1).allowed)
            .count()
    };
    assert_eq!(
        passed(&r, "fresh"),
        0,
        "the flood spent the overflow budget"
    );
    assert_eq!(
        passed(&rule(5, 60_000), "other"),
        5,
        "another rule: its own overflow budget, whole"
    );
    let peeked = store.peek_now(&r, "never-seen");
    assert!(
        !peeked.allowed,
        "a peek answers what the next check would: {peeked:?}"
    );

    // Once the flood's budgets recover, new keys are tracked again, each
    // with its own budget.
    clock.advance(Duration::from_secs(60));
    for key in ["late-1", "late-2"] {
        for _ in 0..3 {
            assert!(store.check_now(&r, key, 1).allowed, "{key}");
        }
        assert!(!store.check_now(&r, key, 1).allowed, "{key}");
    }
}

/// A lease taken from an overflow budget is given back there.
#[test]
fn leases_of_a_full_store_are_released() {
    let store = MemoryBackend::with_clock(ManualClock::new()).with_max_keys(SHARDS);
    let long = rule(1, 60_000);
    for i in 0..SHARDS * 32 {
        store.check_now(&long, &format!("live-{i}"), 1);
    }
    let leases = Rule::concurrency(2, Duration::from_secs(60));
    assert!(store.acquire_now(&leases, "a", 1, 1).allowed);
    assert!(store.acquire_now(&leases, "b", 1, 2).allowed);
    assert!(
        !store.acquire_now(&leases, "c", 1, 3).allowed,
        "one shared budget"
    );
    store.release_now("a", 1);
    assert!(store.acquire_now(&leases, "c", 1, 4).allowed);
    store.release_now("b", 2);
    store.release_now("c", 4);
    assert!(store.acquire_now(&leases, "d", 1, 5).allowed);
    assert!(
        store.acquire_now(&leases, "e", 1, 6).allowed,
        "both given back"
    );
}

/// Flooding cannot reset a budget in use: a key that refuses calls
/// keeps its state however many new keys arrive, and while others'
/// budgets recover and are replaced.
#[test]
fn a_full_store_never_forgets_a_key_in_use() {
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * 4);
    let long = rule(1, 3_600_000);
    assert!(store.check_now(&long, "flooder", 1).allowed);
    assert!(!store.check_now(&long, "flooder", 1).allowed);
    let brief = rule(1, 10);
    for wave in 0..5 {
        for i in 0..SHARDS * 32 {
            store.check_now(&brief, &format!("w{wave}-{i}"), 1);
        }
        clock.advance(Duration::from_millis(10));
    }
    assert!(store.len() <= SHARDS * 4, "{} keys held", store.len());
    assert!(!store.check_now(&long, "flooder", 1).allowed);
}

/// Keys visited by sweeps so far, over every shard.
fn visited(store: &MemoryBackend) -> usize {
    store.inner.shards.iter().map(|s| s.lock().visited).sum()
}

/// A call at the cap costs a small constant, not a scan of its shard:
/// with no key able to expire nothing is swept; with keys expiring all
/// the time, sweeps visit at most `CREDIT_PER_CALL` keys per call. (A
/// full shard used to be swept at every call of a new key.)
#[test]
fn calls_at_the_cap_do_not_scan_the_shard() {
    let per_shard = 64;
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * per_shard);
    let long = rule(1, 3_600_000);
    for i in 0..SHARDS * per_shard * 4 {
        store.check_now(&long, &format!("live-{i}"), 1);
    }
    let before = visited(&store);
    for i in 0..100_000 {
        store.check_now(&long, &format!("fresh-{i}"), 1);
    }
    assert_eq!(
        visited(&store),
        before,
        "no key can expire: nothing to sweep"
    );

    // Keys that expire one after another, fewer live at once than the
    // cap: the store is full of keys of which some can always have
    // expired.
    let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * per_shard);
    let brief = rule(1, 100);
    let calls = 200_000;
    for i in 0..calls {
        clock.advance(Duration::from_micros(40));
        store.check_now(&brief, &format!("churn-{i}"), 1);
    }
    assert!(store.len() <= SHARDS * per_shard);
    let visits = visited(&store);
    assert!(
        visits <= CREDIT_PER_CALL * calls + SHARDS * per_shard,
        "{visits} keys visited by sweeps for {calls} calls"
    );
    // Room was made from keys that recovered: most new keys were tracked.
    let overflowed = store.inner.overflow_calls.load(Ordering::Relaxed);
    assert!(
        overflowed < calls / 10,
        "{overflowed} of {calls} calls overflowed"
    );
}

#[test]
fn refused_calls_on_unknown_keys_store_nothing() {
    let store = MemoryBackend::with_clock(ManualClock::new());
    let r = Rule::sliding_log(2, Duration::from_secs(1));
    assert!(store.check_now(&r, "k", 2).allowed);
    assert_eq!(store.len(), 1);
}

#[test]
fn exact_under_threads() {
    let store = MemoryBackend::new();
    for algorithm in Algorithm::ALL {
        let r = Rule::new(algorithm, 500, Duration::from_secs(60));
        let passed: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..200)
                            .filter(|_| store.check_now(&r, algorithm.name(), 1).allowed)
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(passed, 500, "{algorithm:?}");
    }
}
