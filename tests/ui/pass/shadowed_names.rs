// The expansion uses absolute paths only: local items named like std's do not break it.
#![allow(dead_code)]
use ratelimit_runtime::{rate_limit, RateLimited};

struct Option;
struct Some;
struct Duration;
struct Rule;
type Result<T> = core::result::Result<T, RateLimited>;
fn format() {}
fn check() {}

#[rate_limit(key = "shadow:{id}", count = 1, period = 1)]
async fn shadowed(id: u8) -> Result<u8> {
    Ok(id)
}

fn main() {
    let _ = shadowed(1);
}
