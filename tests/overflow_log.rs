//! A full in-memory store says so: a `warn` line at most once per 10 s of
//! its clock (with how many it held back), so a flood days after the first
//! is said again, and every call it could not track is counted in
//! `ratelimit_memory_overflow_total`.

mod common;

use common::Logs;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{ManualClock, Rule};

#[test]
fn a_full_store_warns_now_and_then_and_counts_every_overflow() {
    let clock = ManualClock::new();
    // 64 shards of 2 keys: 128 keys at most.
    let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(128);
    let rule = Rule::fixed_window(3, Duration::from_secs(3_600));
    let logs = Logs::default();
    let subscriber = logs.subscriber(tracing_subscriber::filter::LevelFilter::INFO);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let flood = |name: &str| {
        for i in 0..2_000 {
            store.check_now(&rule, &format!("limiter:{name}-{i}"), 1);
        }
    };
    // Calls counted since the last look (a snapshot drains the counters).
    let counted = || -> u64 {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "ratelimit_memory_overflow_total")
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => n,
                other => panic!("a counter, not {other:?}"),
            })
            .sum()
    };
    let (first, second) = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            flood("first");
            let first = counted();
            // A day later, in use again (a 1 h rule whose keys came back).
            clock.advance(Duration::from_secs(86_400));
            flood("second");
            (first, counted())
        })
    });
    // Each flood: 2,000 new keys, at most 128 tracked, the rest overflow.
    for overflowed in [first, second] {
        assert!(
            (2_000 - 128..=2_000).contains(&overflowed),
            "{overflowed} calls counted"
        );
    }
    let logged = logs.text();
    let lines: Vec<&str> = logged
        .lines()
        .filter(|line| line.contains("in-memory rate limiter is full"))
        .collect();
    assert_eq!(lines.len(), 2, "one per flood: {logged}");
    assert!(lines.iter().all(|line| line.contains("WARN")), "{logged}");
    assert!(lines[0].contains("unlogged=0"), "{logged}");
    let held_back = lines[1]
        .split("unlogged=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("how many were held back");
    assert_eq!(held_back, first - 1, "{logged}");
}
