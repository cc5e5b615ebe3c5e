use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "a", count = 100, local_quota = 10, subject_limits)]
async fn with_quota() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "b", count = 100, subject_limits = 5)]
async fn not_a_flag() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
