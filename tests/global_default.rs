//! With nothing installed, an in-memory limiter serves; installing after the
//! first limited call is an error that says why.

use ratelimit_runtime::{Error, RateLimited, RateLimiter, rate_limit};

#[rate_limit(key = "d", count = 2, period = 60)]
async fn twice() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn the_in_memory_default_serves_when_nothing_is_installed() {
    assert!(twice().await.is_ok());
    assert!(twice().await.is_ok());
    assert!(twice().await.is_err());
    assert_eq!(RateLimiter::global().backend_name(), "memory");
    let late = RateLimiter::in_memory().install().unwrap_err();
    assert!(matches!(late, Error::AlreadyInstalled));
    assert!(
        late.to_string().contains("before any limited call"),
        "{late}"
    );
}
