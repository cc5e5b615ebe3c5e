use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "per-user", count = 10, limiter = "primary")]
#[rate_limit(key = "global", count = 1000, limiter = "secondary")]
async fn search() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "a", count = 10, limiter = "primary")]
#[rate_limit(key = "b", count = 1000)]
async fn list() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
