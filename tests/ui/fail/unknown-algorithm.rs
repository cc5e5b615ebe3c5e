use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, algorithm = token_buket)]
async fn typo() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, algorithm = leaky)]
async fn unknown() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
