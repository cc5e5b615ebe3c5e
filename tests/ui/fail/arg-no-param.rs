use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, by = arg(usr))]
async fn typo(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

fn main() {}
