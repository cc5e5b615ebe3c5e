use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, by = ip)]
async fn plain() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, by = header("x-api-key"))]
async fn plain_header(id: u32) -> Result<u32, RateLimited> {
    Ok(id)
}

fn main() {}
