use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "user:{usr}", count = 3)]
async fn typo(user: &str, page: u32) -> Result<(), RateLimited> {
    let _ = (user, page);
    Ok(())
}

#[rate_limit(key = "user:{id}", count = 3)]
async fn no_params() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "user:{}", count = 3)]
async fn empty(id: u32) -> Result<(), RateLimited> {
    let _ = id;
    Ok(())
}

fn main() {}
