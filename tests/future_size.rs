//! A check's future stays small: every layer of a call moves it, and a
//! future of kilobytes (a Redis connection's setup inlined) made in-memory
//! checks a third slower. Regression test for that.

use std::time::Duration;

use ratelimit_runtime::{RateLimited, RateLimiter, Rule, rate_limit};

#[rate_limit(key = "size", count = 10)]
async fn attributed() -> Result<(), RateLimited> {
    Ok(())
}

#[test]
fn check_futures_stay_small() {
    let limiter = RateLimiter::in_memory();
    let rule = Rule::fixed_window(1, Duration::from_secs(1));
    let sizes = [
        ("check", std::mem::size_of_val(&limiter.check(&rule, "k"))),
        (
            "acquire",
            std::mem::size_of_val(&limiter.acquire(&rule, "k", 1)),
        ),
        ("attributed fn", std::mem::size_of_val(&attributed())),
    ];
    for (what, size) in sizes {
        assert!(size <= 512, "the future of {what} is {size} bytes");
    }
}
