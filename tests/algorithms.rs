//! Every algorithm on both backends.
//!
//! - Equivalence: the same scripted calls at the same times give the same
//!   decisions from the Lua scripts in Redis and from the memory backend.
//!   Redis runs them with a fixed "now" (`RedisBackend::check_at`), so no
//!   tolerance is needed; the times are Unix-epoch sized, as `TIME` gives.
//! - Boundary burst: `fixed_window` lets `2 * count - 1` calls through
//!   around a window edge; `sliding_log` never more than `count` in any
//!   interval of length `period`.
//! - Real time, through the limiter: count calls pass, the next is refused
//!   with a sensible `retry_after`, the budget returns; afterwards every key
//!   in Redis has a TTL.

use std::time::Duration;

mod common;

use common::{
    EPOCH_US, Subject, XorShift, count_pass_then_refused_then_budget_returns, redis_backend,
    redis_backend_without_functions, same_decisions,
};
use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{Algorithm, ManualClock, RateLimiter, Rule};
use ratelimit_test_support::RedisServer;

/// One module of equivalence tests: each algorithm's timelines through the
/// Redis backend that `$backend` makes, against the memory backend.
macro_rules! equivalence_through {
    ($module:ident, $backend:path, [$($name:ident => $algorithm:expr),*]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let server = RedisServer::start();
                    same_decisions(&$backend(&server).await, $algorithm).await;
                    server.assert_no_key_without_ttl("limiter:*");
                    assert!(!server.keys_with_pttl("limiter:*").is_empty());
                }
            )*
        }
    };
}

macro_rules! equivalence {
    ($($name:ident => $algorithm:expr),* $(,)?) => {
        // Checks made one after another each go alone: the algorithm's own
        // driver, a function of the library.
        equivalence_through!(redis_equals_memory, redis_backend, [$($name => $algorithm),*]);
        // The same alone, by the rules' own scripts (`EVALSHA`): a server
        // without functions (alone with them, the library's functions run
        // the same drivers).
        equivalence_through!(
            scripts_redis_equals_memory,
            redis_backend_without_functions,
            [$($name => $algorithm),*]
        );
        // The same timelines through the batch script that coalesced checks use.
        equivalence_through!(batched_redis_equals_memory, batching_backend, [$($name => $algorithm),*]);
    };
}

/// A backend whose checks all go in batches.
async fn batching_backend(server: &RedisServer) -> ratelimit_runtime::backend::redis::RedisBackend {
    redis_backend(server).await.batch_every_check()
}

equivalence!(
    fixed_window => Algorithm::FixedWindow,
    sliding_log => Algorithm::SlidingLog,
    sliding_window => Algorithm::SlidingWindow,
    token_bucket => Algorithm::TokenBucket,
    gcra => Algorithm::Gcra,
    concurrency => Algorithm::Concurrency,
);

/// Two rules of different algorithms under one key (a configuration
/// mistake): each treats the other's state as absent, on both backends alike.
#[tokio::test]
async fn algorithms_sharing_a_key_start_afresh_alike() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let clock = ManualClock::new();
    clock.advance(Duration::from_micros(EPOCH_US));
    let memory = MemoryBackend::with_clock(clock.clone());
    let mut random = XorShift(42);
    let mut now = EPOCH_US;
    // Concurrency takes leases, not checks: it is put over foreign values
    // of every type in `foreign_values_are_never_read_as_state`.
    let algorithms = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];
    for step in 0..300 {
        let algorithm = algorithms[random.below(5) as usize];
        let rule = Rule::new(algorithm, 3, Duration::from_millis(100));
        let advance = random.below(60_000);
        clock.advance(Duration::from_micros(advance));
        now += advance;
        let from_memory = memory.check_now(&rule, "limiter:shared", 1);
        let from_redis = redis
            .check_at(&rule, "limiter:shared", 1, Duration::from_micros(now))
            .await
            .unwrap();
        assert_eq!(from_redis, from_memory, "step {step}: {algorithm:?}");
    }
}

/// The most allowed calls in any interval of length `period`.
fn worst_burst(passes: &[u64], period: u64) -> usize {
    passes
        .iter()
        .map(|&start| {
            passes
                .iter()
                .filter(|&&t| t >= start && t < start + period)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// One call at 0 opens the window, then `count` calls 1 ms before it ends and
/// `count` calls 1 ms after: times in µs relative to the first call.
fn edge_calls(count: u64, period: u64) -> Vec<u64> {
    let mut times = vec![0];
    times.extend(std::iter::repeat_n(period - 1_000, count as usize));
    times.extend(std::iter::repeat_n(period + 1_000, count as usize));
    times
}

#[tokio::test]
async fn boundary_burst_fixed_window_doubles_sliding_log_does_not() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let (count, period) = (10, 1_000_000);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
        let rule = Rule::new(algorithm, count, Duration::from_micros(period));
        let clock = ManualClock::new();
        let memory = MemoryBackend::with_clock(clock.clone());
        let key = format!("limiter:edge:{}", algorithm.name());
        let (mut on_memory, mut on_redis) = (vec![], vec![]);
        let mut last = 0;
        for t in edge_calls(count, period) {
            clock.advance(Duration::from_micros(t - last));
            last = t;
            if memory.check_now(&rule, &key, 1).allowed {
                on_memory.push(t);
            }
            let at = Duration::from_micros(EPOCH_US + t);
            if redis.check_at(&rule, &key, 1, at).await.unwrap().allowed {
                on_redis.push(t);
            }
        }
        assert_eq!(on_memory, on_redis, "{algorithm:?}");
        let worst = worst_burst(&on_memory, period);
        match algorithm {
            // The seeds' double burst: 10 in the last millisecond of one
            // window (well, 9 plus the opener) and 10 in the first of the next.
            Algorithm::FixedWindow => assert_eq!(worst, 2 * count as usize - 1),
            _ => assert_eq!(worst, count as usize),
        }
    }
}

macro_rules! real_time {
    ($($name:ident => $algorithm:expr),* $(,)?) => {
        mod in_memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    count_pass_then_refused_then_budget_returns(&Subject::memory(), $algorithm).await;
                }
            )*
        }
        mod in_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let subject = Subject::redis().await;
                    count_pass_then_refused_then_budget_returns(&subject, $algorithm).await;
                    subject.assert_ttls();
                }
            )*
        }
    };
}

real_time!(
    fixed_window => Algorithm::FixedWindow,
    sliding_log => Algorithm::SlidingLog,
    sliding_window => Algorithm::SlidingWindow,
    token_bucket => Algorithm::TokenBucket,
    gcra => Algorithm::Gcra,
    concurrency => Algorithm::Concurrency,
);

#[tokio::test]
async fn a_dropped_permit_releases_its_lease_in_redis() {
    let subject = Subject::redis().await;
    let rule = Rule::concurrency(1, Duration::from_secs(30));
    let first = subject
        .limiter
        .acquire(&rule, "limiter:drop", 1)
        .await
        .unwrap();
    assert!(first.decision().allowed);
    assert!(
        !subject
            .limiter
            .acquire(&rule, "limiter:drop", 1)
            .await
            .unwrap()
            .decision()
            .allowed
    );
    // Cancelled mid-call: the future holding the permit is dropped.
    let call = async move {
        let _held = first;
        std::future::pending::<()>().await;
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(10), call)
            .await
            .is_err()
    );
    // The release runs on a spawned task: wait (bounded) until it lands.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let permit = subject
            .limiter
            .acquire(&rule, "limiter:drop", 1)
            .await
            .unwrap();
        if permit.decision().allowed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lease was never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn concurrency_rules_need_acquire() {
    let limiter = RateLimiter::in_memory();
    let rule = Rule::concurrency(2, Duration::from_secs(1));
    let error = limiter.check(&rule, "k").await.unwrap_err();
    assert!(
        matches!(error, ratelimit_runtime::Error::PermitRequired),
        "{error}"
    );
}

#[tokio::test]
async fn a_cost_over_the_burst_is_an_error_not_a_silent_refusal() {
    let limiter = RateLimiter::in_memory();
    let rule = Rule::token_bucket(10, Duration::from_secs(1)).with_burst(4);
    assert!(limiter.check_cost(&rule, "k", 4).await.unwrap().allowed);
    let error = limiter.check_cost(&rule, "k", 5).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "a call costing 5 can never pass a rule whose capacity is 4"
    );
}

/// Leases whose holders died are not counted, and the script trims them
/// from the sorted set (at a refusal, and at about one acquire in ten):
/// what dead holders leave behind stays bounded.
#[tokio::test]
async fn dead_leases_are_not_counted_and_are_trimmed_in_redis() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::concurrency(1_000, Duration::from_secs(1));
    let mut largest = 0;
    for id in 1..=300u64 {
        // Each holder dies: its lease has expired by the next acquire.
        let now = Duration::from_micros(EPOCH_US) + Duration::from_secs(2 * id);
        let decision = redis
            .acquire_at(&rule, "limiter:dead", 1, id, now)
            .await
            .unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 999, "lease {id}: dead leases counted");
        // Leases are scored by their expiry; the set's one other member
        // (when its TTL was set) is scored at or below 0.
        let held: usize = redis::cmd("ZCOUNT")
            .arg("limiter:dead")
            .arg("(0")
            .arg("+inf")
            .query(&mut server.connection())
            .unwrap();
        largest = largest.max(held);
    }
    // Ids ending in 0 trim: never more than ten leases, one of them live.
    assert!(largest <= 10, "{largest} leases kept");
}

/// Long sliding logs (past the 16 units earlier versions kept in a string,
/// and past the memory backend's inline calls) decide as the memory backend
/// does, alone and in batches. Also from 2^50 µs (in 2005), where a time's
/// packed bytes (a member's prefix) hold a zero in their third byte for days.
#[tokio::test]
async fn long_sliding_logs_decide_as_memory_does() {
    let server = RedisServer::start();
    for (path, start, redis) in [
        ("alone", EPOCH_US, redis_backend(&server).await),
        (
            "batch",
            EPOCH_US,
            redis_backend(&server).await.batch_every_check(),
        ),
        ("alone-2005", 1 << 50, redis_backend(&server).await),
        (
            "batch-2005",
            1 << 50,
            redis_backend(&server).await.batch_every_check(),
        ),
    ] {
        let rule = Rule::sliding_log(40, Duration::from_millis(50));
        let clock = ManualClock::new();
        clock.advance(Duration::from_micros(start));
        let memory = MemoryBackend::with_clock(clock.clone());
        let mut now = start;
        let mut random = XorShift(0x2545_F491_4F6C_DD1D);
        let mut long_logs = 0;
        for step in 0..600 {
            let advance = match random.below(8) {
                0 => 0,
                1 => random.below(12_000),
                2 => random.below(60_000),
                _ => random.below(1_500),
            };
            clock.advance(Duration::from_micros(advance));
            now += advance;
            let key = format!("limiter:long:{path}:{}", random.below(2));
            let cost = 1 + random.below(4);
            let from_memory = memory.check_now(&rule, &key, cost);
            let from_redis = redis
                .check_at(&rule, &key, cost, Duration::from_micros(now))
                .await
                .unwrap();
            assert_eq!(
                from_redis, from_memory,
                "{path}: step {step}, key {key}, cost {cost}, now {now}"
            );
            long_logs += usize::from(from_memory.allowed && from_memory.remaining < 40 - 16);
        }
        assert!(
            long_logs > 100,
            "{path}: only {long_logs} checks on a long log"
        );
    }
}

/// A sliding log is a sorted set, short or long (never a string moved to a
/// set: the move deleted the key and made it again, which a migrating slot
/// refuses half way); it counts only the calls within its window and trims
/// older ones at a refusal and at about one call in eight: what old calls
/// leave behind stays bounded, and it never counts.
#[tokio::test]
async fn old_calls_are_not_counted_and_are_trimmed_in_redis() {
    let server = RedisServer::start();
    for (path, redis) in [
        ("alone", redis_backend(&server).await),
        ("batch", redis_backend(&server).await.batch_every_check()),
    ] {
        let key = format!("limiter:log:{path}");
        let rule = Rule::sliding_log(40, Duration::from_millis(30));
        let mut largest = 0;
        for call in 1..=300u64 {
            // 1,001 µs apart: the time's last bits take every value in turn.
            let now = Duration::from_micros(EPOCH_US + call * 1_001);
            let decision = redis.check_at(&rule, &key, 1, now).await.unwrap();
            assert!(decision.allowed, "{path}, call {call}");
            // Thirty calls at most in any period: older ones are never counted.
            assert!(
                decision.remaining >= 10,
                "{path}, call {call}: {decision:?}"
            );
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query(&mut server.connection())
                .unwrap();
            assert_eq!(kind, "zset", "{path}, call {call}");
            let held: usize = redis::cmd("ZCARD")
                .arg(&key)
                .query(&mut server.connection())
                .unwrap();
            largest = largest.max(held);
        }
        // Thirty calls a period, at most eight between trims: under 40 kept.
        assert!(largest < 40, "{path}: {largest} calls kept");
    }
}

/// The script sets a lease key's TTL only at the first acquire of each
/// period (the key lives to the end of the next one). Leases taken every
/// 30 ms over several 100 ms periods, none released: after each, the key
/// must outlive its newest lease. On the server's
/// own clock, through the rule's own script and through the batch script.
#[tokio::test]
async fn a_lease_key_outlives_its_newest_lease() {
    use ratelimit_runtime::backend::Backend;

    let server = RedisServer::start();
    let rule = Rule::concurrency(1_000, Duration::from_millis(100));
    for (path, redis) in [
        ("alone", redis_backend(&server).await),
        ("batch", redis_backend(&server).await.batch_every_check()),
    ] {
        let key = format!("limiter:outlives:{path}");
        for id in 1..=12u64 {
            let decision = redis.acquire(&rule, &key, 1, id).await.unwrap();
            assert!(decision.allowed, "{path}, lease {id}");
            let mut conn = server.connection();
            let (newest, pttl, time): (Vec<(String, f64)>, i64, (u64, u64)) = redis::pipe()
                .cmd("ZRANGE")
                .arg(&key)
                .arg(-1)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("PTTL")
                .arg(&key)
                .cmd("TIME")
                .query(&mut conn)
                .unwrap();
            assert_eq!(newest[0].0, id.to_string(), "{path}: the newest lease");
            let now_us = time.0 * 1_000_000 + time.1;
            let lives_us = (newest[0].1 as u64).saturating_sub(now_us);
            assert!(
                pttl >= 0 && (pttl as u64 + 1) * 1_000 >= lives_us,
                "{path}, lease {id}: the key expires in {pttl} ms, its newest lease in {lives_us} µs"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
}

/// A GCRA key filled under a small `count`, then checked under a much larger
/// one (an override): the memory backend's `(tat - now) * count` went past
/// 2^64 (wrapping in a release build, a panic in a debug one) where the Lua
/// script refused. Both now refuse alike, with the same numbers, and agree
/// again once the rule is back.
#[tokio::test]
async fn gcra_after_a_raised_count_agrees_without_overflow() {
    let server = RedisServer::start();
    for redis in [
        redis_backend(&server).await,
        redis_backend(&server).await.batch_every_check(),
    ] {
        let key = format!("limiter:gcra-raised-{}", EPOCH_US);
        let period = Duration::from_secs(75 * 60);
        let written = Rule::gcra(1, period).with_burst(1_000_000);
        let raised = Rule::gcra(10_000, period).with_burst(1_000_000);
        let clock = ManualClock::new();
        clock.advance(Duration::from_micros(EPOCH_US));
        let memory = MemoryBackend::with_clock(clock.clone());
        let mut now = EPOCH_US;
        for (step, (rule, cost, advance)) in [
            (written, 1_000_000, 0),
            (raised, 1, 1),
            (raised, 10_000, 1_000),
            (written, 1, 1_000_000),
            (raised, 1_000_000, 60_000_000),
        ]
        .into_iter()
        .enumerate()
        {
            clock.advance(Duration::from_micros(advance));
            now += advance;
            let from_memory = memory.check_now(&rule, &key, cost);
            let from_redis = redis
                .check_at(&rule, &key, cost, Duration::from_micros(now))
                .await
                .unwrap();
            assert_eq!(from_redis, from_memory, "step {step}");
        }
        redis::cmd("DEL")
            .arg(&key)
            .query::<i64>(&mut server.connection())
            .unwrap();
    }
}

/// A concurrency key lives at least as long as its longest live lease, also
/// when an override changes the rule's period. The key's TTL was set only
/// when a new period number beat the stored one, and a lengthened period
/// has smaller numbers: its leases lived past the key, which expired with
/// them held (limit 2, period 1 s then 60 s: 2 more leases were granted).
#[tokio::test]
async fn a_concurrency_key_outlives_its_leases_after_a_period_override() {
    use ratelimit_runtime::Backend;
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let short = Rule::concurrency(2, Duration::from_secs(1));
    let long = Rule::concurrency(2, Duration::from_secs(60));
    let pttl = |key: &str| pttl(&server, key);

    // Lengthened: the key had the short rule's TTL.
    let key = "limiter:lengthened";
    assert!(redis.acquire(&short, key, 1, 1).await.unwrap().allowed);
    redis.release(&short, key, 1, 1).await.unwrap();
    assert!(pttl(key) <= 2_000);
    assert!(redis.acquire(&long, key, 1, 2).await.unwrap().allowed);
    assert!(redis.acquire(&long, key, 1, 3).await.unwrap().allowed);
    assert!(
        pttl(key) >= 59_000,
        "the key lives as long as its 60 s leases: {} ms",
        pttl(key)
    );

    // Shortened: the key keeps the long lease's TTL.
    let key = "limiter:shortened";
    assert!(redis.acquire(&long, key, 1, 4).await.unwrap().allowed);
    assert!(redis.acquire(&short, key, 1, 5).await.unwrap().allowed);
    assert!(
        pttl(key) >= 59_000,
        "the 60 s lease still holds the key: {} ms",
        pttl(key)
    );
    assert!(!redis.acquire(&short, key, 1, 6).await.unwrap().allowed);
    server.assert_no_key_without_ttl("limiter:*");
}

/// `key`'s `PTTL` on `server` (-2: gone).
fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .keys_with_pttl(key)
        .first()
        .map_or(-2, |(_, pttl)| *pttl)
}

/// A sliding log or a token bucket keeps its state in Redis as long as the
/// rule in force needs it, after an override that slows the rule. Its TTL
/// was the rule's it was written under, refreshed only by a period's first
/// call or an allowed call: the key then expired early and the budget came
/// back whole (3 per 60 s let 6 through; a bucket slowed to 10 a second
/// was full again after 2 s, not 20).
#[tokio::test]
async fn a_slowed_rule_keeps_its_state_in_redis_as_long_as_it_needs() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let pttl = |key: &str| pttl(&server, key);
    let allowed = async |rule: &Rule, key: &str, cost: u64| {
        limiter.check_cost(rule, key, cost).await.unwrap().allowed
    };

    // A sliding log whose period is lengthened: refused, then allowed.
    let (short, long) = (
        Rule::sliding_log(3, Duration::from_secs(1)),
        Rule::sliding_log(3, Duration::from_secs(60)),
    );
    for _ in 0..3 {
        assert!(allowed(&short, "limiter:log:refused", 1).await);
    }
    assert!(!allowed(&long, "limiter:log:refused", 1).await);
    assert!(
        pttl("limiter:log:refused") >= 59_000,
        "refused: {} ms",
        pttl("limiter:log:refused")
    );
    let (short, long) = (
        Rule::sliding_log(4, Duration::from_secs(1)),
        Rule::sliding_log(4, Duration::from_secs(60)),
    );
    for rule in [&short, &short, &long, &long] {
        assert!(allowed(rule, "limiter:log:allowed", 1).await);
    }
    assert!(
        pttl("limiter:log:allowed") >= 59_000,
        "allowed: {} ms",
        pttl("limiter:log:allowed")
    );

    // A bucket whose rate is lowered, drained under the old one.
    let fast = Rule::token_bucket(100, Duration::from_secs(1)).with_burst(200);
    let slow = Rule::token_bucket(10, Duration::from_secs(1)).with_burst(200);
    for _ in 0..4 {
        assert!(allowed(&fast, "limiter:bucket", 50).await);
    }
    assert!(!allowed(&slow, "limiter:bucket", 50).await);
    assert!(
        pttl("limiter:bucket") >= 19_000,
        "bucket: {} ms",
        pttl("limiter:bucket")
    );
    server.assert_no_key_without_ttl("limiter:*");
}

/// No call's work grows with its cost or its rule's count: the largest
/// sliding-log and concurrency rules, with the largest costs they accept,
/// answer as fast as small ones, Redis answers `PING` within 100 ms
/// meanwhile, and Redis and memory decide alike. A call was one sorted-set
/// member per unit (and one log entry per unit in memory): a cost of
/// 200,000 held Redis for about a second, one of 10^9 for hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_costs_never_stall_redis() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Instant;

    use ratelimit_runtime::Backend;

    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    // A watcher on its own connection: the slowest PING, in µs.
    let (stop, slowest_ping) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let watcher = {
        let (stop, slowest) = (stop.clone(), slowest_ping.clone());
        let mut conn = server.connection();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                redis::cmd("PING").query::<String>(&mut conn).unwrap();
                slowest.fetch_max(sent.elapsed().as_micros() as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let max = Rule::MAX_COUNT;
    let clock = ManualClock::new();
    clock.advance(Duration::from_micros(EPOCH_US));
    let memory = MemoryBackend::with_clock(clock.clone());
    let mut slowest_call = Duration::ZERO;
    let mut now = EPOCH_US;
    for rule in [
        Rule::sliding_log(max, Duration::from_secs(60)),
        Rule::concurrency(max, Duration::from_secs(60)),
    ] {
        let key = format!("limiter:large:{:?}", rule.algorithm());
        let leased = rule.algorithm() == Algorithm::Concurrency;
        // The largest costs, a crowd of small ones between, refusals that
        // look for their retry time among them, and the large lease given
        // back (a log has none: nothing changes), then a large cost again.
        let mut calls: Vec<(u64, bool)> = vec![(max - 1_000, true)];
        calls.extend(std::iter::repeat_n((1, true), 600));
        calls.extend([
            (max, true),
            (1_000, true),
            (max - 1_000, false),
            (max - 600, true),
        ]);
        for (step, (cost, take)) in calls.into_iter().enumerate() {
            clock.advance(Duration::from_micros(7));
            now += 7;
            let id = step as u64 + 1;
            let at = Duration::from_micros(now);
            let sent = Instant::now();
            if !take {
                // Give back the first call's lease (cost max - 1,000).
                redis.release(&rule, &key, cost, 1).await.unwrap();
                slowest_call = slowest_call.max(sent.elapsed());
                memory.release(&rule, &key, cost, 1).await.unwrap();
                continue;
            }
            let from_redis = if leased {
                redis.acquire_at(&rule, &key, cost, id, at).await.unwrap()
            } else {
                redis.check_at(&rule, &key, cost, at).await.unwrap()
            };
            slowest_call = slowest_call.max(sent.elapsed());
            let from_memory = if leased {
                memory.acquire(&rule, &key, cost, id).await.unwrap()
            } else {
                memory.check_now(&rule, &key, cost)
            };
            assert_eq!(from_redis, from_memory, "{key}, step {step}, cost {cost}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let slowest_ping = Duration::from_micros(slowest_ping.load(Ordering::Relaxed));
    assert!(
        slowest_call < Duration::from_millis(100),
        "a call took {slowest_call:?}"
    );
    assert!(
        slowest_ping < Duration::from_millis(100),
        "Redis took {slowest_ping:?} to answer PING"
    );
    server.assert_no_key_without_ttl("limiter:*");
}

/// Whatever else is under a key (someone's own value under the prefix: every
/// Redis type, strings of exactly a state's length, the format before the
/// header) is never read as state: a check starts afresh, as the memory
/// backend's does, and its write leaves a TTL. A 17-byte string starting
/// with "F" was read as a fixed window's state, and a crafted one refused
/// forever; a sorted set of future scores was counted as leases.
#[tokio::test]
async fn foreign_values_are_never_read_as_state() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let mut conn = server.connection();
    let huge = |n: usize| {
        (0..n)
            .flat_map(|_| 4e15f64.to_be_bytes())
            .collect::<Vec<u8>>()
    };
    // Strings of each state's length: 2 to 4 numbers, an old short log's.
    let mut strings: Vec<Vec<u8>> = Vec::new();
    for tag in [b'F', b'L', b'W', b'T', b'G', b'S', b'C', b'E'] {
        for n in 1..=4 {
            // The format before the header: a tag byte and the numbers.
            strings.push([vec![tag], huge(n)].concat());
            // A version of the format yet to come.
            strings.push([b"rl\x09".to_vec(), vec![tag], huge(n)].concat());
            // Bytes that are no header at all.
            strings.push([b"xyz".to_vec(), vec![tag], huge(n)].concat());
        }
    }
    for algorithm in Algorithm::ALL {
        let rule = Rule::new(algorithm, 3, Duration::from_secs(10));
        let mut plants: Vec<(String, redis::Cmd)> = strings
            .iter()
            .map(|bytes| {
                let mut set = redis::cmd("SET");
                set.arg("limiter:foreign").arg(bytes);
                (format!("string {bytes:?}"), set)
            })
            .collect();
        let mut add = |what: &str, name: &str, args: &[&str]| {
            let mut cmd = redis::cmd(name);
            cmd.arg("limiter:foreign").arg(args);
            plants.push((what.to_owned(), cmd));
        };
        add("list", "RPUSH", &["a", "b", "c"]);
        add("set", "SADD", &["a", "b", "c"]);
        add("hash", "HSET", &["a", "1", "b", "2"]);
        add("stream", "XADD", &["*", "a", "1"]);
        // Future scores, as leases or log calls would be scored.
        add(
            "sorted set",
            "ZADD",
            &["4e15", "a", "4e15", "b", "4e15", "c", "-1", "epoch"],
        );
        for (what, plant) in plants {
            let _: () = redis::cmd("DEL")
                .arg("limiter:foreign")
                .query(&mut conn)
                .unwrap();
            let _: redis::Value = plant.query(&mut conn).unwrap();
            let clock = ManualClock::new();
            clock.advance(Duration::from_micros(EPOCH_US));
            let memory = MemoryBackend::with_clock(clock);
            let at = Duration::from_micros(EPOCH_US);
            let (from_redis, from_memory) = if algorithm == Algorithm::Concurrency {
                use ratelimit_runtime::Backend;
                (
                    redis.acquire_at(&rule, "limiter:foreign", 1, 1, at).await,
                    memory
                        .acquire(&rule, "limiter:foreign", 1, 1)
                        .await
                        .unwrap(),
                )
            } else {
                (
                    redis.check_at(&rule, "limiter:foreign", 1, at).await,
                    memory.check_now(&rule, "limiter:foreign", 1),
                )
            };
            assert_eq!(
                from_redis.unwrap(),
                from_memory,
                "{algorithm:?} over a {what}"
            );
            server.assert_all_keys_expire("limiter:foreign");
        }
    }
}

/// Peeks, refunds and resets among checks, at the same times on both
/// backends: Redis (alone by the library, by scripts, in batches) answers
/// each as memory does, and the charges of allowed checks are the same. A
/// peek answers what the next check would and changes nothing; a refund
/// gives back the charge of an earlier check (any of them, in the window or
/// long gone, before a reset or after) where it is still counted, at most
/// what is held.
#[tokio::test]
async fn peeks_refunds_and_resets_decide_as_memory_does() {
    use ratelimit_runtime::Backend;

    let server = RedisServer::start();
    let backends = [
        ("alone", redis_backend(&server).await),
        ("scripts", redis_backend_without_functions(&server).await),
        ("batch", redis_backend(&server).await.batch_every_check()),
    ];
    for (path, redis) in &backends {
        for algorithm in Algorithm::ALL {
            // 40 units: a sliding log past its string form (16) too.
            for count in [5, 40] {
                let rule = Rule::new(algorithm, count, Duration::from_millis(40));
                let clock = ManualClock::new();
                clock.advance(Duration::from_micros(EPOCH_US));
                let memory = MemoryBackend::with_clock(clock.clone());
                let mut now = EPOCH_US;
                let mut random = XorShift(0x9E37_79B9_7F4A_7C15 ^ count);
                let leased = algorithm == Algorithm::Concurrency;
                let mut leases: Vec<(u64, u64)> = Vec::new();
                let mut charges = Vec::new();
                for step in 0..400u64 {
                    let advance = match random.below(4) {
                        0 => 0,
                        1 => random.below(30_000),
                        _ => random.below(2_000),
                    };
                    clock.advance(Duration::from_micros(advance));
                    now += advance;
                    let at = Duration::from_micros(now);
                    let key = format!(
                        "limiter:ops:{path}:{algorithm:?}:{count}:{}",
                        random.below(2)
                    );
                    let cost = 1 + random.below(4);
                    let what = random.below(10);
                    let (from_redis, from_memory) = match what {
                        0..=4 if leased => {
                            let id = step + 1;
                            let redis = redis.acquire_at(&rule, &key, cost, id, at).await;
                            let memory = memory.acquire(&rule, &key, cost, id).await;
                            if redis.as_ref().is_ok_and(|d| d.allowed) {
                                leases.push((id, cost));
                            }
                            (redis, memory)
                        }
                        0..=4 => {
                            let (redis, charged) =
                                redis.charge_at(&rule, &key, cost, at).await.unwrap();
                            let (memory, charge) = memory.charge_now(&rule, &key, cost);
                            assert_eq!(charged, charge, "step {step}: {rule:?}");
                            if let Some(charge) = charge {
                                charges.push((key.clone(), charge));
                            }
                            (Ok(redis), Ok(memory))
                        }
                        5 if leased && !leases.is_empty() => {
                            let (id, cost) =
                                leases.swap_remove(random.below(leases.len() as u64) as usize);
                            redis.release(&rule, &key, cost, id).await.unwrap();
                            memory.release(&rule, &key, cost, id).await.unwrap();
                            continue;
                        }
                        5..=6 => (
                            redis.peek_at(&rule, &key, at).await,
                            Ok(memory.peek_now(&rule, &key)),
                        ),
                        7..=8 if !charges.is_empty() => {
                            let (key, charge) =
                                &charges[random.below(charges.len() as u64) as usize];
                            (
                                redis.refund_at(&rule, key, charge, at).await,
                                memory.refund_now(&rule, key, charge),
                            )
                        }
                        7..=8 => continue,
                        _ => (
                            redis.reset_at(&rule, &key, at).await,
                            Ok(memory.reset_now(&rule, &key)),
                        ),
                    };
                    let context = format!(
                        "{path}, {algorithm:?} count {count}, step {step}, op {what}, cost {cost}"
                    );
                    match (from_redis, from_memory) {
                        (Ok(redis), Ok(memory)) => assert_eq!(redis, memory, "{context}"),
                        (Err(redis), Err(memory)) => {
                            assert!(leased && (7..=8).contains(&what), "{context}: {redis}");
                            assert_eq!(redis.to_string(), memory.to_string(), "{context}");
                        }
                        (redis, memory) => panic!("{context}: {redis:?} against {memory:?}"),
                    }
                }
            }
        }
    }
    server.assert_no_key_without_ttl("limiter:*");
}
