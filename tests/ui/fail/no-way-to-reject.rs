use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3)]
async fn plain() -> u32 {
    1
}

#[rate_limit(key = "k", count = 3)]
async fn unit() {}

#[derive(Debug)]
struct NotFromRateLimited;

#[rate_limit(key = "k", count = 3)]
async fn wrong_error() -> Result<u32, NotFromRateLimited> {
    Ok(1)
}

#[rate_limit(key = "k", count = 3)]
async fn opaque() -> impl std::fmt::Display {
    1
}

fn main() {
    let _: Option<RateLimited> = None;
}
