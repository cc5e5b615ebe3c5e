use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, burst = 5)]
async fn default_algorithm() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, algorithm = sliding_log, burst = 5)]
async fn sliding_log() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
