use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 10, algorithm = gcra, burst = 2_000_000_000)]
async fn burst_too_big() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1_000_000, period = "24h", algorithm = token_bucket)]
async fn bucket_too_big_for_exact_arithmetic() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
