//! The README's first command: `cargo run --example quickstart`.
//!
//! In process memory, no Redis needed. Set `REDIS_URL` (for example
//! `redis://127.0.0.1:6379/`) to keep the budgets in Redis instead
//! (`RATELIMIT_KEY_SECRET`, the key secret, is read as in every example).

mod support;

use std::time::Duration;

use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};

/// The seed article's `limitTest`: 2 calls per second, for everyone.
#[rate_limit(key = "limitTest", count = 2, period = 1)]
async fn limit_test(call: u32) -> Result<u32, RateLimited> {
    Ok(call)
}

/// 3 attempts per 10 s per user; past that the fallback answers (the demote path).
#[rate_limit(key = "login:{user}", count = 3, period = "10s", fallback = too_many_logins)]
async fn login(user: &str, attempt: u32) -> String {
    format!("{user}: attempt {attempt} checked")
}

async fn too_many_logins(user: &str, attempt: u32, limited: RateLimited) -> String {
    format!(
        "{user}: attempt {attempt} refused, try again in {:.1} s",
        limited.retry_after.as_secs_f64()
    )
}

#[tokio::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    if let Ok(url) = std::env::var("REDIS_URL") {
        support::with_key_secret(RateLimiter::builder())
            .redis(url)
            .build()
            .await?
            .install()?;
    }
    println!("backend: {}", RateLimiter::global().backend_name());

    println!("\nlimitTest: 2 calls per second");
    for call in 1..=5 {
        report(call, limit_test(call).await);
    }
    println!("waiting 1 s for the window to end...");
    tokio::time::sleep(Duration::from_millis(1050)).await;
    report(6, limit_test(6).await);

    println!("\nlogin: 3 attempts per 10 s per user, then the fallback");
    for attempt in 1..=4 {
        println!("  {}", login("alice", attempt).await);
    }
    println!("  {}", login("bob", 1).await);
    Ok(())
}

fn report(call: u32, outcome: Result<u32, RateLimited>) {
    match outcome {
        Ok(_) => println!("  call {call}: passed"),
        Err(limited) => println!("  call {call}: limited ({limited})"),
    }
}
