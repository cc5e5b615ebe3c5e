use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3)]
fn f() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
