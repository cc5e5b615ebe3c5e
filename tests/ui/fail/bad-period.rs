use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 1, period = 0)]
async fn zero() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1, period = "0ms")]
async fn zero_ms() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1, period = -5)]
async fn negative() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1, period = "10 parsecs")]
async fn unit() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1, period = "10")]
async fn no_unit() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1, period = 1.5)]
async fn float() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1, period = "9000h")]
async fn too_long() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
