use ratelimit_runtime::{rate_limit, RateLimited};

// "x-y", "z" and "x", "y-z" would make one key.
#[rate_limit(key = "t:{a}-{b}", count = 3)]
async fn dash(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

#[rate_limit(key = "t:{a}{b}", count = 3)]
async fn nothing_between(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

// `~` only starts a digest, never kept in a value.
#[rate_limit(key = "t:{a}~{b}", count = 3)]
async fn tilde(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

// Separators values never hold: fine.
#[rate_limit(key = "t:{a}:{b}#{c}", count = 3)]
async fn separated(a: &str, b: &str, c: &str) -> Result<(), RateLimited> {
    let _ = (a, b, c);
    Ok(())
}

fn main() {}
