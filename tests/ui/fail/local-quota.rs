use std::time::Duration;

use ratelimit_runtime::{rate_limit, RateLimited, Rule};

#[rate_limit(key = "a", count = 100, algorithm = sliding_log, local_quota = 10)]
async fn sliding() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "b", count = 5, algorithm = concurrency, local_quota = 2)]
async fn in_flight() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "c", count = 100, algorithm = gcra, burst = 20, local_quota = 50)]
async fn over_capacity() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "d", count = 100, local_quota = 0)]
async fn zero() -> Result<(), RateLimited> {
    Ok(())
}

const EXPORTS: Rule = Rule::concurrency(4, Duration::from_secs(60));

#[rate_limit(key = "e", rule = EXPORTS, local_quota = 2)]
async fn const_concurrency() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
