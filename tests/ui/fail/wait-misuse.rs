use std::time::Duration;

use ratelimit_runtime::{rate_limit, RateLimited, Rule};

// The default algorithm is a window: it keeps no turn to reserve.
#[rate_limit(key = "a", count = 4, wait = "2s")]
async fn fixed_window() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "b", count = 4, algorithm = concurrency, wait = "2s")]
async fn concurrency() -> Result<(), RateLimited> {
    Ok(())
}

const WINDOW: Rule = Rule::sliding_window(4, Duration::from_secs(1));

#[rate_limit(key = "c", rule = WINDOW, wait = "2s")]
async fn const_window() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "d", count = 4, algorithm = gcra, wait = "0s")]
async fn zero() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "e", count = 4, algorithm = gcra, wait = "2 days")]
async fn bad_unit() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "f", count = 4, algorithm = gcra, wait = "1s")]
#[rate_limit(key = "g", count = 100, period = "1m", algorithm = gcra)]
async fn stacked() -> Result<(), RateLimited> {
    Ok(())
}

// An HTTP handler: its client would wait on an open connection.
#[rate_limit(key = "h", count = 4, algorithm = gcra, by = ip, wait = "1s")]
async fn handler() -> &'static str {
    "h"
}

fn main() {}
