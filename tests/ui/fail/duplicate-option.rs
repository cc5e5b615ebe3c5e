use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, count = 4)]
async fn f() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
