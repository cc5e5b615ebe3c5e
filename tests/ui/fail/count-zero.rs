use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 0)]
async fn f() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = -3)]
async fn g() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 1_000_000_001)]
async fn h() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = "3")]
async fn i() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
