use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", period = 10)]
async fn f() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
