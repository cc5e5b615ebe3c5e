//! Bounded memory: a million distinct keys in the in-memory store stay under
//! a documented ceiling, memory comes back when they expire, and the cap on
//! tracked keys (a million by default) holds, for keys of the shapes real
//! rules make. Measured with the process's resident set size: one test in
//! this binary, which measures each key shape in a process of its own (it
//! runs itself again), so nothing else allocates meanwhile.

use std::time::Duration;

use ratelimit_runtime::backend::memory::{DEFAULT_MAX_KEYS, MemoryBackend};
use ratelimit_runtime::{ManualClock, Rule};

/// Documented in the README and BENCHMARKS.md: per million keys.
const CEILING: u64 = 256 << 20;

/// The keys real rules make, and the most resident bytes a key of each may
/// cost in a full store of the default cap (the README states the
/// measured figures, under these).
const SHAPES: [(&str, u64); 3] = [
    // `limiter:user:<i>`: up to 22 bytes, kept in the entry.
    ("short", 100),
    // A client's IPv6 /64: `limiter:ip_limit_test:ip:2001:db8:..::/64`.
    ("ipv6", 170),
    // A header value's digest: `limiter:api:header:x-api-key:#<32 hex>`.
    ("header", 190),
];

fn key(shape: &str, i: u32) -> String {
    match shape {
        "short" => format!("limiter:user:{i}"),
        "ipv6" => format!(
            "limiter:ip_limit_test:ip:2001:db8:{:x}:{:x}::/64",
            i >> 16,
            i & 0xffff
        ),
        "header" => format!(
            "limiter:api:header:x-api-key:#{:032x}",
            u128::from(i) * 0x9e37_79b9_7f4a_7c15
        ),
        other => panic!("no key shape {other}"),
    }
}

fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split(' ').nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// In a process of its own: fills a store of the default cap with keys of
/// `shape` and prints the resident bytes each costs.
fn measure_shape(shape: &str) {
    let store = MemoryBackend::with_clock(ManualClock::new());
    let rule = Rule::gcra(10, Duration::from_secs(60));
    let keys: Vec<String> = (0..DEFAULT_MAX_KEYS as u32)
        .map(|i| key(shape, i))
        .collect();
    let before = rss();
    for key in &keys {
        store.check_now(&rule, key, 1);
    }
    let grown = rss().saturating_sub(before);
    let held = store.len() as u64;
    assert!(held <= DEFAULT_MAX_KEYS as u64 && held > DEFAULT_MAX_KEYS as u64 * 9 / 10);
    println!("SHAPE {shape} {held} {}", grown / held);
}

#[test]
fn a_million_keys_stay_under_the_ceiling_and_memory_comes_back() {
    if let Ok(shape) = std::env::var("MEMORY_BOUND_SHAPE") {
        measure_shape(&shape);
        return;
    }
    for (shape, most) in SHAPES {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_million_keys_stay_under_the_ceiling_and_memory_comes_back",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env("MEMORY_BOUND_SHAPE", shape)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success(),
            "{shape}: {out}{}",
            String::from_utf8_lossy(&child.stderr)
        );
        // The test harness's own words may share the line.
        let line = out
            .split("SHAPE ")
            .nth(1)
            .and_then(|rest| rest.lines().next())
            .unwrap_or_else(|| panic!("{shape}: no measurement in {out:?}"));
        let per_key: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        eprintln!("{shape} keys: {per_key} bytes each ({line})");
        assert!(
            per_key <= most,
            "{shape} keys cost {per_key} bytes each, over {most}"
        );
    }

    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(usize::MAX);
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

    // A cap: new keys past it are not tracked but still limited (they
    // share an overflow budget), and tracked keys keep their state.
    let capped = MemoryBackend::with_clock(ManualClock::new()).with_max_keys(6_400);
    let tight = Rule::fixed_window(1, Duration::from_secs(60));
    assert!(capped.check_now(&tight, "limiter:first", 1).allowed);
    let passed = (0..50_000u32)
        .filter(|i| {
            capped
                .check_now(&tight, &format!("limiter:flood:{i}"), 1)
                .allowed
        })
        .count();
    assert!(capped.len() <= 6_400, "{} keys held", capped.len());
    assert!(
        passed <= 6_400 + 1,
        "{passed} calls of 50,000 new keys passed"
    );
    assert!(
        !capped.check_now(&tight, "limiter:first", 1).allowed,
        "tracked keys are not forgotten"
    );
}
