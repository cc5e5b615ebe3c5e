//! `#[rate_limit]` with a Redis limiter installed as the global one: the
//! budget lives in Redis, under the prefix, with a TTL.

use std::time::Duration;

use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};
use ratelimit_test_support::RedisServer;

#[rate_limit(key = "k", count = 3, period = 1)]
async fn f() -> Result<u32, RateLimited> {
    Ok(1)
}

#[rate_limit(key = "user:{id}", count = 1, period = 10, fallback = later)]
async fn per_user(id: u32) -> String {
    format!("hello {id}")
}

async fn later(id: u32, limited: RateLimited) -> String {
    format!(
        "later {id} ({} of {} left)",
        limited.remaining, limited.limit
    )
}

// One test in this binary: the global limiter is installed once per process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributed_fns_share_their_budget_through_redis() {
    let server = RedisServer::start();
    RateLimiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
        .install()
        .unwrap();
    assert_eq!(RateLimiter::global().backend_name(), "redis");

    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(f().await);
    }
    assert_eq!(
        outcomes.iter().filter(|o| o.is_ok()).count(),
        3,
        "{outcomes:?}"
    );
    assert!(outcomes[3..].iter().all(|o| o.is_err()));

    // The budget is in Redis: another client sees the counter.
    let (tag, numbers) = server
        .stored_state("limiter:k")
        .expect("a fixed-window state");
    assert_eq!((tag, numbers[0]), ('F', 3.0), "3 units used: {numbers:?}");

    assert_eq!(per_user(42).await, "hello 42");
    assert_eq!(per_user(42).await, "later 42 (0 of 1 left)");
    assert_eq!(per_user(43).await, "hello 43");
    server.assert_all_keys_expire("limiter:*");
    assert_eq!(server.keys_with_pttl("limiter:user:*").len(), 2);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(f().await, Ok(1), "the budget returns after the period");
}
