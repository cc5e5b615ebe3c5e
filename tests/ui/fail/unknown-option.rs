use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", cout = 3)]
async fn typo() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, colour = "blue")]
async fn unrelated() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
