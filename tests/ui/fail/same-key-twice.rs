use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "search", count = 10, period = 1)]
#[rate_limit(key = "search", count = 1000, period = "1h")]
async fn f() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
