//! Waiting its turn (`RateLimiter::until_ready`): reservations of a future
//! slot, the same in Redis (Lua) and in process memory (Rust), held
//! against a plain model, and in real time: a wait that cannot be met is
//! refused at once, a cancelled wait gives its slot back.

use std::time::{Duration, Instant};

mod common;

use common::{EPOCH_US, XorShift, redis_backend, redis_backend_without_functions};
use proptest::prelude::*;
use ratelimit_runtime::__testing::{RedisTestHooks, WaitAnswer, memory_cancel, memory_reserve};
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{Algorithm, Error, ManualClock, OnError, RateLimiter, Rule};
use ratelimit_test_support::{RedisCluster, RedisServer};

fn rules(algorithm: Algorithm) -> Vec<Rule> {
    [
        (1, 1, 1_000),
        (3, 5, 7),
        (5, 2, 1_000),
        (7, 3, 333),
        (4, 1, 1_000),
    ]
    .into_iter()
    .map(|(count, burst, ms)| {
        Rule::new(algorithm, count, Duration::from_millis(ms)).with_burst(burst)
    })
    .collect()
}

/// Random reservations (costs, waits), checks and cancels of waiting
/// reservations on two keys, on the memory store and on `redis` at the
/// same times: every answer the same.
async fn same_reservations(redis: &RedisBackend, algorithm: Algorithm) {
    for (r, rule) in rules(algorithm).into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_micros(EPOCH_US));
        let memory = MemoryBackend::with_clock(clock.clone());
        let mut now = EPOCH_US;
        let mut random = XorShift(0x2545_F491_4F6C_DD1D ^ r as u64);
        let period = rule.period().as_micros() as u64;
        let mut waiting: Vec<(String, u64, (u64, u64))> = Vec::new();
        let (mut waited, mut cancelled) = (0, 0);
        for step in 0..300 {
            let advance = match random.below(6) {
                0 | 1 => 0,
                2 => random.below(period / 4 + 1),
                3 => random.below(2 * period + 2),
                _ => 1,
            };
            clock.advance(Duration::from_micros(advance));
            now += advance;
            let at = Duration::from_micros(now);
            let key = format!("limiter:wait:{}:{r}:{}", algorithm.name(), random.below(2));
            let cost = 1 + random.below(rule.capacity().min(3));
            let what = format!("{algorithm:?} {rule:?}: step {step}, key {key}, now {now}");
            match random.below(5) {
                0 => {
                    let m = memory.check_now(&rule, &key, cost);
                    let d = redis.check_at(&rule, &key, cost, at).await.unwrap();
                    assert_eq!(d, m, "check: {what}");
                }
                1 if !waiting.is_empty() => {
                    let (key, cost, ticket) =
                        waiting.swap_remove(random.below(waiting.len() as u64) as usize);
                    let m = memory_cancel(&memory, &rule, &key, cost, ticket);
                    let d = redis
                        .cancel_at(&rule, &key, cost, ticket, at)
                        .await
                        .unwrap();
                    assert_eq!(d, m, "cancel: {what}");
                    cancelled += 1;
                }
                _ => {
                    let max_wait = Duration::from_micros(random.below(3 * period));
                    let m: WaitAnswer =
                        memory_reserve(&memory, &rule, &key, cost, max_wait).unwrap();
                    let d = redis
                        .reserve_at(&rule, &key, cost, max_wait, at)
                        .await
                        .unwrap();
                    assert_eq!(d, m, "reserve, {max_wait:?}: {what}");
                    if let Some(ticket) = m.2 {
                        waited += 1;
                        waiting.push((key, cost, ticket));
                    }
                }
            }
        }
        assert!(waited > 20 && cancelled > 5, "{rule:?}: {waited} waits");
    }
}

macro_rules! equivalence {
    ($($module:ident => $backend:path),* $(,)?) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test]
                async fn gcra() {
                    let server = RedisServer::start();
                    same_reservations(&$backend(&server).await, Algorithm::Gcra).await;
                    server.assert_no_key_without_ttl("limiter:*");
                }

                #[tokio::test]
                async fn token_bucket() {
                    let server = RedisServer::start();
                    same_reservations(&$backend(&server).await, Algorithm::TokenBucket).await;
                    server.assert_no_key_without_ttl("limiter:*");
                }
            }
        )*
    };
}

async fn batching_backend(server: &RedisServer) -> RedisBackend {
    redis_backend(server).await.batch_every_check()
}

/// The same on a cluster, alone and batched per master.
#[tokio::test]
async fn cluster_equals_memory() {
    let cluster = RedisCluster::start();
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    let redis = RedisBackend::connect(cluster.urls(), options)
        .await
        .unwrap();
    same_reservations(&redis, Algorithm::Gcra).await;
    same_reservations(&redis.batch_every_check(), Algorithm::TokenBucket).await;
}

equivalence!(
    redis_equals_memory => redis_backend,
    scripts_redis_equals_memory => redis_backend_without_functions,
    batched_redis_equals_memory => batching_backend,
);

/// A plain model of waiting, as golang.org/x/time/rate keeps it: tokens as
/// an exact count that goes below zero while reservations wait, moved on
/// to the time of each call.
#[derive(Clone, Debug)]
struct Model {
    count: i128,
    period: i128,
    capacity: i128,
    tokens: i128,
    last: i128,
}

impl Model {
    fn advance(&mut self, now: i128) {
        if now > self.last {
            self.tokens = self
                .capacity
                .min(self.tokens + (now - self.last) * self.count);
            self.last = now;
        }
    }

    /// (allowed, wait, position) of a reservation.
    fn reserve(&mut self, now: i128, cost: i128, max_wait: i128) -> (bool, i128, i128) {
        self.advance(now);
        let need = cost * self.period;
        if self.tokens >= need {
            self.tokens -= need;
            return (true, 0, 0);
        }
        let after = self.tokens - need;
        let wait = (-after + self.count - 1) / self.count;
        if wait > max_wait {
            return (false, wait, 0);
        }
        self.tokens = after;
        (true, wait, self.capacity - after)
    }

    fn cancel(&mut self, now: i128, cost: i128, at: i128, position: i128) {
        let go = at + (position - self.capacity + self.count - 1) / self.count;
        if now >= go {
            return;
        }
        self.advance(now);
        let later = self.capacity - self.tokens + (now - at) * self.count - position;
        let step = cost * self.period;
        if (0..step).contains(&later) {
            self.tokens = self.capacity.min(self.tokens + step - later);
        }
    }
}

/// A step: time advance (µs), raw cost, longest wait (µs), what to do.
type Step = (u64, u64, u64, u8);

/// count, burst, period (µs) and the steps.
fn model_case() -> impl Strategy<Value = (u64, u64, u64, Vec<Step>)> {
    (
        1u64..=5,
        1u64..=4,
        prop_oneof![Just(1_000u64), Just(7_000), Just(1_000_000)],
    )
        .prop_flat_map(|(count, burst, period)| {
            let step = (0..period, 0u64..8, 0..3 * period, 0u8..4);
            (
                Just(count),
                Just(burst),
                Just(period),
                prop::collection::vec(step, 1..60),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The memory store's reservations and cancels (both bucket
    /// algorithms) decide as the model does.
    #[test]
    fn reservations_follow_the_model((count, burst, period, steps) in model_case()) {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let rule = Rule::new(algorithm, count, Duration::from_micros(period)).with_burst(burst);
            let clock = ManualClock::new();
            let store = MemoryBackend::with_clock(clock.clone());
            let capacity = i128::from(burst * period);
            let mut model = Model {
                count: count.into(),
                period: period.into(),
                capacity,
                tokens: capacity,
                last: 0,
            };
            let mut now = 0u64;
            let mut waiting = Vec::new();
            for &(advance, raw, max_wait, what) in &steps {
                clock.advance(Duration::from_micros(advance % 3 * (advance / 3)));
                now += advance % 3 * (advance / 3);
                let cost = 1 + raw % burst;
                if what == 0 && !waiting.is_empty() {
                    let (cost, ticket): (u64, (u64, u64)) = waiting.remove(0);
                    memory_cancel(&store, &rule, "k", cost, ticket);
                    model.cancel(now.into(), cost.into(), ticket.0.into(), ticket.1.into());
                    continue;
                }
                let (decision, wait, ticket) =
                    memory_reserve(&store, &rule, "k", cost, Duration::from_micros(max_wait)).unwrap();
                let (allowed, model_wait, position) = model.reserve(now.into(), cost.into(), max_wait.into());
                let at = format!("{algorithm:?} at {now}, cost {cost}, max wait {max_wait}");
                prop_assert_eq!(decision.allowed, allowed, "{}", at);
                if allowed {
                    prop_assert_eq!(wait.as_micros() as i128, model_wait, "{}", at);
                    prop_assert_eq!(ticket.map(|t| i128::from(t.1)), (model_wait > 0).then_some(position), "{}", at);
                } else {
                    prop_assert_eq!(decision.retry_after.as_micros() as i128, model_wait, "{}", at);
                }
                if let Some(ticket) = ticket {
                    waiting.push((cost, ticket));
                }
            }
        }
    }
}

const PACED: Rule = Rule::gcra(4, Duration::from_secs(1)).with_burst(1);

/// A wait that cannot be met is refused at once, not after sleeping, and
/// records nothing: the call after it is served as if it never came.
#[tokio::test]
async fn a_wait_that_cannot_be_met_is_refused_at_once() {
    let server = RedisServer::start();
    let redis = RateLimiter::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    for limiter in [RateLimiter::in_memory(), redis] {
        let first = limiter
            .until_ready(&PACED, "limiter:now", 1, Duration::ZERO)
            .await
            .unwrap();
        assert!(first.allowed);
        let started = Instant::now();
        let refused = limiter
            .until_ready(&PACED, "limiter:now", 1, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(!refused.allowed, "{refused:?}");
        assert!(
            started.elapsed() < Duration::from_millis(60),
            "refused at once"
        );
        assert!(refused.retry_after > Duration::from_millis(100));
        // Nothing was reserved: the next call waits one interval, not two.
        let started = Instant::now();
        let next = limiter
            .until_ready(&PACED, "limiter:now", 1, Duration::from_secs(2))
            .await
            .unwrap();
        assert!(next.allowed);
        let waited = started.elapsed();
        assert!(waited < Duration::from_millis(400), "waited {waited:?}");
    }
}

/// `until_ready_with_jitter` adds its random pause after the turn: a call
/// never goes before its reserved time, nor later than the turn plus the
/// jitter (with a margin for a busy machine), and the pauses do vary; only
/// `max_wait` decides, so a wait that cannot be met is refused at once
/// however large the jitter.
#[tokio::test]
async fn jitter_comes_after_the_turn_and_never_decides() {
    const TENTHS: Rule = Rule::gcra(10, Duration::from_secs(1)).with_burst(1);
    let (turn, jitter) = (Duration::from_millis(100), Duration::from_millis(300));
    let limiter = RateLimiter::in_memory();
    let mut extra = Vec::new();
    for sample in 0..6 {
        let key = format!("limiter:jitter:{sample}");
        let started = Instant::now();
        let first = limiter.until_ready(&TENTHS, &key, 1, Duration::ZERO).await;
        assert!(first.unwrap().allowed);
        let go = limiter
            .until_ready_with_jitter(&TENTHS, &key, 1, turn, jitter)
            .await
            .unwrap();
        assert!(go.allowed);
        let took = started.elapsed();
        assert!(took >= turn, "never before its turn: {took:?}");
        assert!(
            took < turn + jitter + Duration::from_millis(300),
            "at most the turn plus the jitter: {took:?}"
        );
        extra.push(took - turn);
    }
    let most = extra.iter().max().unwrap();
    assert!(*most > Duration::from_millis(20), "jitter added: {extra:?}");

    let key = "limiter:jitter:late";
    let first = limiter.until_ready(&TENTHS, key, 1, Duration::ZERO).await;
    assert!(first.unwrap().allowed);
    let started = Instant::now();
    let refused = limiter
        .until_ready_with_jitter(
            &TENTHS,
            key,
            1,
            Duration::from_millis(10),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(!refused.allowed, "{refused:?}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(60),
        "refused at once: {took:?}"
    );
}

/// A caller that stops waiting (an outer timeout drops its future) gives
/// its slot back: the next caller is served when it would have been.
#[tokio::test]
async fn a_cancelled_wait_gives_its_slot_back() {
    let server = RedisServer::start();
    let redis = RateLimiter::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    for limiter in [RateLimiter::in_memory(), redis] {
        limiter
            .until_ready(&PACED, "limiter:cancel", 1, Duration::ZERO)
            .await
            .unwrap();
        let wait = limiter.until_ready(&PACED, "limiter:cancel", 1, Duration::from_secs(2));
        let gone = tokio::time::timeout(Duration::from_millis(20), wait).await;
        assert!(gone.is_err(), "it was still waiting");
        // Given back from a task on Redis: let it run.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let started = Instant::now();
        let next = limiter
            .until_ready(&PACED, "limiter:cancel", 1, Duration::from_secs(2))
            .await
            .unwrap();
        assert!(next.allowed);
        let waited = started.elapsed();
        // Its own slot: 250 ms after the first call, about 200 ms from here
        // (had the cancelled one kept its slot, about 450 ms).
        assert!(waited < Duration::from_millis(350), "waited {waited:?}");
        assert!(waited > Duration::from_millis(100), "waited {waited:?}");
    }
}

/// Windows and leases keep no future slot: waiting on them is a typed
/// error, as on a custom backend.
#[tokio::test]
async fn window_and_concurrency_rules_cannot_wait() {
    let limiter = RateLimiter::in_memory();
    for rule in [
        Rule::fixed_window(1, Duration::from_secs(1)),
        Rule::sliding_window(1, Duration::from_secs(1)),
        Rule::sliding_log(1, Duration::from_secs(1)),
        Rule::concurrency(1, Duration::from_secs(1)),
    ] {
        let error = limiter
            .until_ready(&rule, "k", 1, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Unsupported(_)), "{error}");
    }
}

/// A Redis that is down answers a waiting call by the failure policy, at
/// once: `deny` is the error, `local` reserves in process memory.
#[tokio::test]
async fn a_dead_redis_answers_a_wait_by_the_policy_at_once() {
    let mut server = RedisServer::start();
    let url = server.url();
    let build = |policy| {
        RateLimiter::builder()
            .redis(url.as_str())
            .on_backend_error(policy)
            .timeout(Duration::from_millis(50))
            .build()
    };
    let deny = build(OnError::Deny).await.unwrap();
    let local = build(OnError::Local).await.unwrap();
    let allow = build(OnError::Allow).await.unwrap();
    server.kill();
    // `allow`: every call goes at once, unchecked.
    let started = Instant::now();
    for _ in 0..5 {
        let go = allow
            .until_ready(&PACED, "limiter:dead", 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(go.allowed, "{go:?}");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_millis(500), "at once: {took:?}");
    let started = Instant::now();
    let error = deny
        .until_ready(&PACED, "limiter:dead", 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Backend(_)), "{error}");
    assert!(started.elapsed() < Duration::from_millis(500));
    let started = Instant::now();
    for _ in 0..3 {
        let go = local
            .until_ready(&PACED, "limiter:dead", 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(go.allowed);
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(2),
        "paced in process: {took:?}"
    );
}

/// The time calls waited, through the `metrics` facade: one sample per call
/// that went (labelled with the rule's name from the attribute), zero for
/// one that went at once; a refusal is none.
/// The recorder is this test's thread's alone (on a current-thread
/// runtime), so no other test adds samples.
#[test]
fn the_time_spent_waiting_is_a_histogram() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(waits_metered()));

    let (mut plain, mut by_rule) = (Vec::new(), Vec::new());
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if let ("ratelimit_wait_seconds", DebugValue::Histogram(values)) = (key.name(), value) {
            let values: Vec<f64> = values.iter().map(|v| v.0).collect();
            match key.labels().find(|l| l.key() == "rule") {
                Some(rule) => {
                    assert_eq!(rule.value(), "metered");
                    by_rule.extend(values);
                }
                None => plain.extend(values),
            }
        }
    }
    for samples in [&plain, &by_rule] {
        assert_eq!(samples.len(), 2, "{samples:?}");
        assert_eq!(samples[0], 0.0, "the first went at once");
        assert!((0.2..0.5).contains(&samples[1]), "{samples:?}");
    }
}

/// Two waits through `until_ready` and two through the attribute, each
/// one at once and one after waiting its turn; and one refusal.
async fn waits_metered() {
    #[ratelimit_runtime::rate_limit(key = "metered", count = 4, algorithm = gcra, burst = 1, wait = "1s")]
    async fn metered() -> Result<(), ratelimit_runtime::RateLimited> {
        Ok(())
    }
    let limiter = RateLimiter::in_memory();
    for _ in 0..2 {
        let go = limiter
            .until_ready(&PACED, "limiter:metered", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(go.allowed);
    }
    let refused = limiter
        .until_ready(&PACED, "limiter:metered", 1, Duration::ZERO)
        .await
        .unwrap();
    assert!(!refused.allowed);
    metered().await.unwrap();
    metered().await.unwrap();
}
