use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, on_error = ignore)]
async fn on_error() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, by = user)]
async fn by() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, by = header(42))]
async fn header() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, limiter = "")]
async fn limiter() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, shadow = "yes")]
async fn shadow() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "id:{self.id}", count = 3)]
async fn no_receiver() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
