//! Stacked `#[rate_limit]` attributes are one decision, in either order:
//! a call refused by one rule takes nothing from the others. The budgets
//! left are read through the rules' own names, on memory, one Redis and a
//! 3-master cluster (where a set's keys are on several masters).

use std::time::Duration;

use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};
use std::future::Future;

use ratelimit_test_support::{RedisCluster, RedisServer};

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

#[rate_limit(key = "t-{{org}}-user", by = arg(user), count = 5, period = 60, limiter = "tagged")]
#[rate_limit(key = "t-{{org}}-global", count = 3, period = 60, limiter = "tagged")]
async fn tagged(user: &str) -> Result<(), RateLimited> {
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

#[rate_limit(key = "c-user-first", by = arg(user), count = 5, period = 60, limiter = "cluster")]
#[rate_limit(
    key = "c-user-first-global",
    count = 3,
    period = 60,
    limiter = "cluster"
)]
async fn cluster_user_first(user: &'static str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

#[rate_limit(
    key = "c-global-first-global",
    count = 3,
    period = 60,
    limiter = "cluster"
)]
#[rate_limit(key = "c-global-first", by = arg(user), count = 5, period = 60, limiter = "cluster")]
async fn cluster_global_first(user: &'static str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// Ten tasks at once call `call` as `user`: exactly 3 pass (the global
/// rule's count), and the user keeps 2 of 5.
async fn at_once<F, Fut>(limiter: &RateLimiter, call: F, user: &'static str, names: [&str; 2])
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Result<(), RateLimited>> + Send + 'static,
{
    let tasks: Vec<_> = (0..10).map(|_| tokio::spawn(call(user))).collect();
    let mut passed = 0;
    for task in tasks {
        passed += usize::from(task.await.unwrap().is_ok());
    }
    assert_eq!(passed, 3, "{names:?}");
    let subject = format!("arg:user:{user}");
    assert_eq!(left(limiter, names[0], &subject).await, 2, "{names:?}");
    assert_eq!(left(limiter, names[1], "").await, 0, "{names:?}");
}

/// Keys with a hash tag (`{{org}}` in the attribute, as the README advises
/// on a cluster): the budgets are read by the rules' names as written.
#[tokio::test]
async fn budgets_of_keys_with_a_hash_tag_are_read_by_name() {
    let limiter = RateLimiter::in_memory();
    limiter.clone().install_as("tagged").unwrap();
    let mut passed = 0;
    for _ in 0..10 {
        passed += usize::from(tagged("ann").await.is_ok());
    }
    assert_eq!(passed, 3);
    assert_eq!(left(&limiter, "t-{{org}}-user", "arg:user:ann").await, 2);
    assert_eq!(left(&limiter, "t-{{org}}-global", "").await, 0);
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
    let names = ["r-user-first", "r-user-first-global"];
    at_once(&limiter, redis_user_first, "ann", names).await;
    let names = ["r-global-first", "r-global-first-global"];
    at_once(&limiter, redis_global_first, "bob", names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_attributes_are_one_decision_on_a_cluster() {
    let cluster = RedisCluster::start();
    let limiter = RateLimiter::builder()
        .redis(cluster.urls())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    limiter.clone().install_as("cluster").unwrap();
    // The set's keys are on two masters: taken one after the other, and
    // given back if the other refuses.
    assert_ne!(
        cluster.master_for("limiter:c-user-first:arg:user:ann"),
        cluster.master_for("limiter:c-user-first-global"),
    );
    let names = ["c-user-first", "c-user-first-global"];
    at_once(&limiter, cluster_user_first, "ann", names).await;
    let names = ["c-global-first", "c-global-first-global"];
    at_once(&limiter, cluster_global_first, "bob", names).await;
}
