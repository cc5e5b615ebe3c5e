//! The in-memory backend, per check, next to governor's keyed limiter
//! (`String` keys) on the same inputs.
//!
//! `cargo bench -p ratelimit-benches --bench memory`
//!
//! - `single_key`: one key, one thread.
//! - `single_key_2_threads`: one key, 2 threads at once: both update one
//!   state, as a global limit does on a multi-threaded server (wall time per
//!   check over both).
//! - `100k_keys`: 100,000 distinct keys in turn, one thread.
//! - `100k_keys_shuffled`: the same keys in one fixed random order, so
//!   neither limiter's memory is walked in the order it was filled (in
//!   `100k_keys` it is, and the CPU's prefetcher can see it coming).
//! - `100k_keys_2_threads`: the same on 2 threads at once (each half the
//!   keys); the time per check is wall time over both, so a lower number than
//!   the 1-thread one means throughput grows.
//! - `at_cap`: a store full of keys whose budgets are in use (its cap,
//!   65,536 keys, reached): `tracked` checks 60,000 of the keys it holds in
//!   turn, `untracked` 100,000 keys it has no room for (each charged to the
//!   rule's overflow budget). Fixed window only.
//! - `dependent_read`: the machine's latency for one random cache line in a
//!   buffer of 2 to 16 MiB, the miss a check over many keys pays.
//!
//! The rule never refuses in a run, so every check is the full
//! check-and-consume; state stays between visits (as governor's does), except
//! for the sliding log and concurrency (1 ms, so logs and leases stay short:
//! their keys are stored again at each visit).

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{KEYS, governor, keys, ours, ours_for, rule, shuffled};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ratelimit_runtime::Algorithm;
use ratelimit_runtime::backend::memory::MemoryBackend;

/// Runs `iters` checks on `threads` threads, `step` for check `i` of a thread.
fn spread(iters: u64, threads: usize, step: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let step = &step;
            s.spawn(move || {
                for i in 0..iters / threads as u64 {
                    step(t, i);
                }
            });
        }
    });
    start.elapsed()
}

fn benches(c: &mut Criterion) {
    let keys = Arc::new(keys());
    let order = shuffled(KEYS);
    let mut group = c.benchmark_group("memory");
    for algorithm in Algorithm::ALL {
        let (store, limiter) = ours_for("bench", algorithm);
        let one = rule(algorithm, false);
        group.bench_function(BenchmarkId::new("single_key", algorithm.name()), |b| {
            b.iter(|| ours(&store, &limiter, &one, "limiter:user:1"))
        });
        let rule = rule(algorithm, true);
        let mut i = 0;
        group.bench_function(BenchmarkId::new("100k_keys", algorithm.name()), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                ours(&store, &limiter, &rule, &keys[i]);
            })
        });
        group.bench_function(
            BenchmarkId::new("100k_keys_shuffled", algorithm.name()),
            |b| {
                b.iter(|| {
                    i = (i + 1) % KEYS;
                    ours(&store, &limiter, &rule, &keys[order[i]]);
                })
            },
        );
        group.bench_function(
            BenchmarkId::new("single_key_2_threads", algorithm.name()),
            |b| {
                b.iter_custom(|iters| {
                    spread(iters, 2, |_, _| {
                        ours(&store, &limiter, &one, "limiter:user:1")
                    })
                })
            },
        );
        group.bench_function(
            BenchmarkId::new("100k_keys_2_threads", algorithm.name()),
            |b| {
                b.iter_custom(|iters| {
                    spread(iters, 2, |t, i| {
                        let key = &keys[(t * KEYS / 2) + (i as usize % (KEYS / 2))];
                        ours(&store, &limiter, &rule, key);
                    })
                })
            },
        );
    }
    let gov = governor();
    group.bench_function(BenchmarkId::new("single_key", "governor"), |b| {
        let key = "limiter:user:1".to_owned();
        b.iter(|| black_box(gov.check_key(&key).is_ok()))
    });
    group.bench_function(BenchmarkId::new("single_key_2_threads", "governor"), |b| {
        let key = "limiter:user:1".to_owned();
        b.iter_custom(|iters| {
            spread(iters, 2, |_, _| {
                black_box(gov.check_key(&key).is_ok());
            })
        })
    });
    let mut i = 0;
    group.bench_function(BenchmarkId::new("100k_keys", "governor"), |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(gov.check_key(&keys[i]).is_ok())
        })
    });
    group.bench_function(BenchmarkId::new("100k_keys_shuffled", "governor"), |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(gov.check_key(&keys[order[i]]).is_ok())
        })
    });
    group.bench_function(BenchmarkId::new("100k_keys_2_threads", "governor"), |b| {
        b.iter_custom(|iters| {
            spread(iters, 2, |t, i| {
                let key = &keys[(t * KEYS / 2) + (i as usize % (KEYS / 2))];
                black_box(gov.check_key(key).is_ok());
            })
        })
    });
    group.finish();
    at_cap(c, &keys);
    latency(c);
}

/// Checks of a full store: of keys it tracks, and of keys it cannot.
fn at_cap(c: &mut Criterion, keys: &[String]) {
    let mut group = c.benchmark_group("memory");
    let store = MemoryBackend::new().with_max_keys(65_536);
    let rule = rule(Algorithm::FixedWindow, true);
    let tracked = &keys[..60_000];
    for key in tracked {
        assert!(store.check_now(&rule, key, 1).allowed);
    }
    for i in 0..KEYS {
        store.check_now(&rule, &format!("limiter:flood:{i}"), 1);
    }
    let fresh: Vec<String> = (0..KEYS).map(|i| format!("limiter:fresh:{i}")).collect();
    let mut i = 0;
    group.bench_function(BenchmarkId::new("at_cap", "tracked"), |b| {
        b.iter(|| {
            i = (i + 1) % tracked.len();
            black_box(store.check_now(&rule, &tracked[i], 1).allowed)
        })
    });
    group.bench_function(BenchmarkId::new("at_cap", "untracked"), |b| {
        b.iter(|| {
            i = (i + 1) % fresh.len();
            black_box(store.check_now(&rule, &fresh[i], 1).allowed)
        })
    });
    group.finish();
}

/// The machine's own cost of the miss a check over many keys pays: one
/// read of a random cache line that depends on the previous read, within
/// buffers of 2 to 16 MiB (100k entries of 72 bytes take 7 MiB).
fn latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("dependent_read");
    for mib in [2usize, 4, 8, 16] {
        let lines = mib * (1 << 20) / 64;
        // One cycle through every line in a random order, each line
        // holding the index of the next one.
        let order = shuffled(lines);
        let mut next = vec![[0u64; 8]; lines];
        for i in 0..lines {
            next[order[i]][0] = order[(i + 1) % lines] as u64;
        }
        let mut at = 0usize;
        group.bench_function(BenchmarkId::new("random_line", format!("{mib}MiB")), |b| {
            b.iter(|| {
                at = next[at][0] as usize;
                black_box(at)
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = memory;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(memory);
