//! Distributed rate limiting in one attribute: `#[rate_limit]` on an async fn,
//! budgets checked and consumed atomically in process memory or in Redis.
//!
//! ```toml
//! [dependencies]
//! ratelimit-runtime = "0.1"
//! ```
//!
//! ```
//! use ratelimit_runtime::{rate_limit, RateLimited};
//!
//! // 3 calls per second for everyone; the 4th gets `Err(RateLimited)`.
//! #[rate_limit(key = "search", count = 3, period = 1)]
//! async fn search(q: &str) -> Result<usize, RateLimited> {
//!     Ok(q.len())
//! }
//!
//! // 5 logins per minute per user name; past that, the fallback answers.
//! #[rate_limit(key = "login:{user}", count = 5, period = "1m", fallback = slow_down)]
//! async fn login(user: &str, password: &str) -> String {
//!     format!("welcome, {user}")
//! }
//!
//! async fn slow_down(user: &str, _password: &str, limited: RateLimited) -> String {
//!     format!("{user}: too many attempts, retry in {} s", limited.retry_after.as_secs())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! for _ in 0..3 {
//!     assert!(search("rust").await.is_ok());
//! }
//! assert!(search("rust").await.is_err());
//! assert_eq!(login("ann", "pw").await, "welcome, ann");
//! # }
//! ```
//!
//! With nothing else said, budgets live in process memory. To share them
//! across every instance of the application, install a Redis-backed limiter
//! at start-up:
//!
//! ```no_run
//! # async fn start() -> Result<(), ratelimit_runtime::Error> {
//! ratelimit_runtime::RateLimiter::builder()
//!     .redis("redis://127.0.0.1:6379")
//!     .build()
//!     .await?
//!     .install()?;
//! # Ok(()) }
//! ```
//!
//! Each check is one atomic step: in Redis one Lua script (`EVALSHA`) on one
//! key, on the server's clock, with a TTL on every key it writes. If Redis
//! fails or answers too slowly, the same rules are checked in process memory
//! until it answers again.
//!
//! # Features
//!
//! - `macros` (default): the [`rate_limit`] attribute.
//! - `redis` (default): the Redis backend.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod algorithm;
pub mod backend;
mod clock;
mod decision;
mod error;
mod limiter;
mod rule;

pub use backend::Backend;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, RateLimited};
pub use error::Error;
pub use limiter::{Permit, RateLimiter, RateLimiterBuilder};
pub use rule::{Algorithm, Rule};

#[cfg(feature = "macros")]
#[doc(inline)]
pub use ratelimit_macros::rate_limit;

/// Used by the code `#[rate_limit]` generates. Not a public API: it may change
/// in any release without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::{RateLimited, Rule};
    pub use ::core::option::Option;
    pub use ::std::format;
    pub use ::std::time::Duration;

    use crate::RateLimiter;

    /// Checks one call against the global limiter: `Some` if it is rejected.
    pub async fn check(rule: &Rule, key: &str) -> Option<RateLimited> {
        match RateLimiter::global().check(rule, key).await {
            Ok(decision) => decision.rate_limited(),
            // Only a custom backend's failure gets here (the built-in ones
            // answer from memory when Redis fails): let the call through
            // rather than fail requests because the limiter is broken.
            Err(error) => {
                tracing::error!(%error, key, "rate limiter failed; letting the call through");
                None
            }
        }
    }

    /// How a fn's return type reports a rejection when there is no `fallback`.
    #[diagnostic::on_unimplemented(
        message = "`#[rate_limit]` cannot report a rejection through `{Self}`",
        label = "this return type cannot carry a `RateLimited`",
        note = "choose one: add `fallback = path` to the attribute, \
                return `Result<_, E>` where `E: From<RateLimited>`, \
                or make the fn an actix-web handler"
    )]
    pub trait Reject: Sized {
        /// The value the fn returns for this rejection.
        fn reject(limited: RateLimited) -> Self;
    }

    // Not recommended in diagnostics: a `Result` whose error type lacks
    // `From<RateLimited>` then gets the message above, which says what to do.
    #[diagnostic::do_not_recommend]
    impl<T, E: From<RateLimited>> Reject for Result<T, E> {
        #[inline]
        fn reject(limited: RateLimited) -> Self {
            Err(E::from(limited))
        }
    }
}
