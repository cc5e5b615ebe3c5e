//! Stacked `#[rate_limit]` attributes are one decision, in either order:
//! a call refused by one rule takes nothing from the others. The budgets
//! left are read through the rules' own names, on memory and on Redis.

use std::time::Duration;

use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};
use ratelimit_test_support::RedisServer;

#[rate_limit(key = "m-user-first", by = arg(user), count = 5, period = 60, limiter = "memory")]
#[rate_limit(
    key = "m-user-first-global",
    count = 3,
    period = 60,
    limiter = "memory"
)]
async fn memory_user_first(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

#[rate_limit(
    key = "m-global-first-global",
    count = 3,
    period = 60,
    limiter = "memory"
)]
#[rate_limit(key = "m-global-first", by = arg(user), count = 5, period = 60, limiter = "memory")]
async fn memory_global_first(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

#[rate_limit(key = "r-user-first", by = arg(user), count = 5, period = 60, limiter = "redis")]
#[rate_limit(key = "r-user-first-global", count = 3, period = 60, limiter = "redis")]
async fn redis_user_first(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

#[rate_limit(
    key = "r-global-first-global",
    count = 3,
    period = 60,
    limiter = "redis"
)]
#[rate_limit(key = "r-global-first", by = arg(user), count = 5, period = 60, limiter = "redis")]
async fn redis_global_first(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// Units left of a rule's budget, by its name and subject.
async fn left(limiter: &RateLimiter, name: &str, subject: &str) -> u64 {
    let peek = limiter.peek_named(name, subject).await.unwrap();
    if peek.allowed { peek.remaining + 1 } else { 0 }
}

#[tokio::test]
async fn stacked_attributes_are_one_decision_in_memory() {
    let limiter = RateLimiter::in_memory();
    limiter.clone().install_as("memory").unwrap();
    let mut passed = 0;
    for _ in 0..10 {
        passed += usize::from(memory_user_first("ann").await.is_ok());
    }
    assert_eq!(passed, 3);
    assert_eq!(left(&limiter, "m-user-first", "arg:user:ann").await, 2);
    assert_eq!(left(&limiter, "m-user-first-global", "").await, 0);
    let refused = memory_user_first("ann").await.unwrap_err();
    assert_eq!(refused.name, "m-user-first-global");

    let mut passed = 0;
    for _ in 0..10 {
        passed += usize::from(memory_global_first("bob").await.is_ok());
    }
    assert_eq!(passed, 3);
    assert_eq!(left(&limiter, "m-global-first", "arg:user:bob").await, 2);
    assert_eq!(left(&limiter, "m-global-first-global", "").await, 0);
}

#[tokio::test]
async fn stacked_attributes_are_one_decision_on_redis() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    limiter.clone().install_as("redis").unwrap();
    // Tasks at once: exactly 3 pass, and Ann keeps 2.
    let tasks: Vec<_> = (0..10)
        .map(|_| tokio::spawn(redis_user_first("ann")))
        .collect();
    let mut passed = 0;
    for task in tasks {
        passed += usize::from(task.await.unwrap().is_ok());
    }
    assert_eq!(passed, 3);
    assert_eq!(left(&limiter, "r-user-first", "arg:user:ann").await, 2);
    assert_eq!(left(&limiter, "r-user-first-global", "").await, 0);

    let tasks: Vec<_> = (0..10)
        .map(|_| tokio::spawn(redis_global_first("bob")))
        .collect();
    let mut passed = 0;
    for task in tasks {
        passed += usize::from(task.await.unwrap().is_ok());
    }
    assert_eq!(passed, 3);
    assert_eq!(left(&limiter, "r-global-first", "arg:user:bob").await, 2);
    assert_eq!(left(&limiter, "r-global-first-global", "").await, 0);
}
