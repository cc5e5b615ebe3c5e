//! The global limiter: installed once; a second install is an error value.

use std::time::Duration;

use ratelimit_runtime::{Backend, Decision, Error, RateLimited, RateLimiter, Rule, rate_limit};

/// A backend of our own that allows everything and says so.
#[derive(Debug)]
struct AllowAll;

impl Backend for AllowAll {
    async fn check(&self, rule: &Rule, _key: &str, _cost: u64) -> Result<Decision, Error> {
        Ok(Decision {
            allowed: true,
            limit: rule.count(),
            remaining: rule.count(),
            reset_after: Duration::ZERO,
            retry_after: Duration::ZERO,
        })
    }
}

#[rate_limit(key = "g", count = 1, period = 60)]
async fn once_a_minute() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_second_install_is_an_error_and_the_first_stays() {
    let custom = RateLimiter::builder()
        .backend(AllowAll)
        .build()
        .await
        .unwrap();
    custom.install().unwrap();
    let second = RateLimiter::in_memory().install();
    assert!(matches!(second, Err(Error::AlreadyInstalled)), "{second:?}");
    assert_eq!(RateLimiter::global().backend_name(), "custom");
    // The custom backend decides for the attribute: never limited.
    for _ in 0..3 {
        assert!(once_a_minute().await.is_ok());
    }
}
