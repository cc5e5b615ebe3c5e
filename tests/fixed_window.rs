//! The fixed window on both backends: the same scenarios, the same decisions.
//!
//! Memory runs on a manual clock; Redis on its own server clock, with short
//! periods and wide margins.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::{Error, ManualClock, RateLimiter, Rule};
use ratelimit_test_support::RedisServer;

enum Time {
    Manual(ManualClock),
    Real,
}

/// A limiter under test, with a way to let time pass for it.
struct Subject {
    limiter: RateLimiter,
    time: Time,
    redis: Option<RedisServer>,
}

impl Subject {
    fn memory() -> Subject {
        let clock = ManualClock::new();
        Subject {
            limiter: RateLimiter::in_memory_with_clock(clock.clone()),
            time: Time::Manual(clock),
            redis: None,
        }
    }

    async fn redis() -> Subject {
        let server = RedisServer::start();
        let limiter = RateLimiter::builder()
            .redis(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("connecting to the test redis-server");
        assert_eq!(limiter.backend_name(), "redis");
        Subject {
            limiter,
            time: Time::Real,
            redis: Some(server),
        }
    }

    async fn advance(&self, by: Duration) {
        match &self.time {
            Time::Manual(clock) => clock.advance(by),
            Time::Real => tokio::time::sleep(by).await,
        }
    }

    fn is_exact(&self) -> bool {
        matches!(self.time, Time::Manual(_))
    }
}

const PERIOD: Duration = Duration::from_millis(1000);
const THREE_PER_PERIOD: Rule = Rule::fixed_window(3, PERIOD);

async fn count_pass_then_limited_then_budget_returns(subject: Subject) {
    let limiter = &subject.limiter;
    let key = "limiter:scenario";
    for expected_remaining in [2, 1, 0] {
        let decision = limiter.check(&THREE_PER_PERIOD, key).await.unwrap();
        assert!(decision.allowed, "{decision:?}");
        assert_eq!(decision.limit, 3);
        assert_eq!(decision.remaining, expected_remaining);
    }
    for _ in 0..2 {
        let decision = limiter.check(&THREE_PER_PERIOD, key).await.unwrap();
        assert!(!decision.allowed, "{decision:?}");
        assert_eq!(decision.remaining, 0);
        let limited = decision.rate_limited().unwrap();
        assert!(limited.retry_after > Duration::ZERO && limited.retry_after <= PERIOD);
        if subject.is_exact() {
            assert_eq!(limited.retry_after, PERIOD);
        } else {
            // Only the time between the first call and this one has passed.
            assert!(limited.retry_after > PERIOD / 2, "{limited:?}");
        }
    }
    subject.advance(PERIOD + Duration::from_millis(50)).await;
    let decision = limiter.check(&THREE_PER_PERIOD, key).await.unwrap();
    assert!(
        decision.allowed,
        "the budget returns after the period: {decision:?}"
    );
    assert_eq!(decision.remaining, 2);
    if let Some(redis) = &subject.redis {
        redis.assert_all_keys_expire("limiter:*");
    }
}

async fn exactly_count_of_200_concurrent_tasks_pass(subject: Subject) {
    const RULE: Rule = Rule::fixed_window(50, Duration::from_secs(30));
    let limiter = Arc::new(subject.limiter.clone());
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.check(&RULE, "limiter:crowd").await.unwrap() })
        })
        .collect();
    let mut passed = 0;
    for task in tasks {
        if task.await.unwrap().allowed {
            passed += 1;
        }
    }
    assert_eq!(passed, 50);
    if let Some(redis) = &subject.redis {
        redis.assert_all_keys_expire("limiter:*");
    }
}

async fn cost_takes_several_units_and_over_capacity_is_an_error(subject: Subject) {
    let limiter = &subject.limiter;
    let rule = Rule::fixed_window(5, PERIOD);
    let first = limiter.check_cost(&rule, "limiter:cost", 3).await.unwrap();
    assert!(first.allowed);
    assert_eq!(first.remaining, 2);
    let refused = limiter.check_cost(&rule, "limiter:cost", 3).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 2, "a rejected call consumes nothing");
    assert!(
        limiter
            .check_cost(&rule, "limiter:cost", 2)
            .await
            .unwrap()
            .allowed
    );
    assert!(matches!(
        limiter.check_cost(&rule, "limiter:cost", 6).await,
        Err(Error::InvalidCost {
            cost: 6,
            capacity: 5
        })
    ));
    assert!(matches!(
        limiter.check_cost(&rule, "limiter:cost", 0).await,
        Err(Error::InvalidCost { cost: 0, .. })
    ));
}

async fn keys_have_separate_budgets(subject: Subject) {
    let rule = Rule::fixed_window(1, PERIOD);
    let limiter = &subject.limiter;
    assert!(limiter.check(&rule, "limiter:a").await.unwrap().allowed);
    assert!(limiter.check(&rule, "limiter:b").await.unwrap().allowed);
    assert!(!limiter.check(&rule, "limiter:a").await.unwrap().allowed);
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Subject::memory()).await;
                }
            )*
        }
        mod in_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Subject::redis().await).await;
                }
            )*
        }
    };
}

on_both_backends!(
    count_pass_then_limited_then_budget_returns,
    exactly_count_of_200_concurrent_tasks_pass,
    cost_takes_several_units_and_over_capacity_is_an_error,
    keys_have_separate_budgets,
);

mod redis_only {
    use super::*;

    #[tokio::test]
    async fn rejected_calls_do_not_increment_the_counter() {
        let subject = Subject::redis().await;
        let redis = subject.redis.as_ref().unwrap();
        for _ in 0..10 {
            subject
                .limiter
                .check(&THREE_PER_PERIOD, "limiter:c")
                .await
                .unwrap();
        }
        let (tag, numbers) = redis
            .stored_state("limiter:c")
            .expect("a fixed-window state");
        assert_eq!((tag, numbers[0]), ('F', 3.0), "{numbers:?}");
        let mut conn = redis.connection();
        let pttl: i64 = redis::cmd("PTTL")
            .arg("limiter:c")
            .query(&mut conn)
            .unwrap();
        assert!(pttl > 0 && pttl <= 1000, "PTTL {pttl}");
    }

    #[tokio::test]
    async fn scripts_are_reloaded_after_script_flush() {
        let subject = Subject::redis().await;
        let redis = subject.redis.as_ref().unwrap();
        assert!(
            subject
                .limiter
                .check(&THREE_PER_PERIOD, "limiter:f")
                .await
                .unwrap()
                .allowed
        );
        // What a restart loses: the scripts, and the function library that
        // checks going alone call where the server has one.
        for what in ["SCRIPT", "FUNCTION"] {
            let _: () = redis::cmd(what)
                .arg("FLUSH")
                .query(&mut redis.connection())
                .unwrap();
        }
        let decision = subject
            .limiter
            .check(&THREE_PER_PERIOD, "limiter:f")
            .await
            .unwrap();
        assert!(decision.allowed);
        assert_eq!(
            decision.remaining, 1,
            "answered by Redis, not by the insurance limiter"
        );
    }

    #[tokio::test]
    async fn a_foreign_value_without_ttl_is_replaced_by_one_with_a_ttl() {
        let subject = Subject::redis().await;
        let redis = subject.redis.as_ref().unwrap();
        // The seeds' bare counter, left without a TTL by a crashed INCR + EXPIRE.
        let _: () = redis::cmd("SET")
            .arg("limiter:leaked")
            .arg(3)
            .query(&mut redis.connection())
            .unwrap();
        let decision = subject
            .limiter
            .check(&THREE_PER_PERIOD, "limiter:leaked")
            .await
            .unwrap();
        assert!(decision.allowed, "not ours: treated as no state");
        assert_eq!(decision.remaining, 2);
        redis.assert_all_keys_expire("limiter:*");
    }

    #[tokio::test]
    async fn a_dead_redis_is_replaced_by_the_in_memory_insurance() {
        let mut server = RedisServer::start();
        let limiter = RateLimiter::builder()
            .redis(server.url())
            .timeout(Duration::from_millis(100))
            .build()
            .await
            .unwrap();
        let rule = Rule::fixed_window(2, Duration::from_secs(30));
        assert!(limiter.check(&rule, "limiter:d").await.unwrap().allowed);
        server.kill();
        // Answered per process from memory now, each within the deadline
        // (checked with a wide margin: these machines are slow and shared).
        for expected in [true, true, false] {
            let started = std::time::Instant::now();
            let decision = limiter.check(&rule, "limiter:d").await.unwrap();
            assert_eq!(decision.allowed, expected, "{decision:?}");
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "a check took {:?} with Redis dead",
                started.elapsed()
            );
        }
    }

    #[tokio::test]
    async fn build_fails_clearly_when_redis_is_unreachable() {
        let port = ratelimit_test_support::free_port();
        let started = std::time::Instant::now();
        let result = RateLimiter::builder()
            .redis(format!("redis://127.0.0.1:{port}/"))
            .connect_timeout(Duration::from_millis(300))
            .build()
            .await;
        assert!(matches!(result, Err(Error::Backend(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            result
                .unwrap_err()
                .to_string()
                .starts_with("rate limiter backend failed")
        );
    }

    #[tokio::test]
    async fn a_malformed_url_is_a_config_error() {
        let result = RateLimiter::builder().redis("http://nowhere").build().await;
        assert!(matches!(result, Err(Error::Config(_))), "{result:?}");
    }
}
