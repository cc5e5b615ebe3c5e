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
//! Each check is one atomic step: in Redis one Lua script run on one key, on
//! the server's clock, with a TTL on every key it writes (checks waiting at
//! the same moment share one script call: see
//! [`RateLimiterBuilder::coalesce`]). If Redis
//! fails or answers too slowly, the same rules are checked in process memory
//! until it answers again.
//!
//! # Features
//!
//! - `macros` (default): the [`rate_limit`] attribute.
//! - `redis` (default): the Redis backend.
//! - `actix`: actix-web handlers and middleware (429/503 responses with
//!   `Retry-After` and rate-limit headers, `by = ip`, `by = header(..)`).
//! - `axum`: the same for axum handlers, and the `tower` layer.
//! - `tower`: [`RateLimitLayer`], a tower `Layer` for any service of `http`
//!   requests (axum routers, tonic, hyper).
//! - `tls`: `rediss://` URLs (rustls).
//! - `sentinel`: Redis Sentinel.
//! - `toml`: overrides from a TOML file.
//! - `metrics`: counters per rule and outcome through the `metrics` facade.
//!
//! # Layout
//!
//! A call flows one way: the attribute or an HTTP adapter ([`actix`],
//! [`axum`], [`tower`]) ->
//! the decision pipeline -> the [`RateLimiter`] -> a [`backend`] ->
//! the algorithm's state machine (in Rust, or a Lua script in Redis).
//! Nothing below the pipeline knows a web framework; [`http`] holds what
//! every framework shares (client identity, header fields, the request
//! flow of the middleware and the layer, and [`http::Middleware`], the one
//! type both are). A backend other than the memory
//! store (Redis, or one of yours) is wrapped in a failover: a circuit
//! breaker and an insurance limiter in process memory, which answer by the
//! failure policy while it fails. Beside the pipeline, the registry
//! knows every rule by name (its overrides, and
//! [`reset_named`](RateLimiter::reset_named) and its kin), and the key
//! grammar (`prefix + name + subject`) is written in one module, `keys`.
#![deny(missing_docs)]
// The docs link items of every feature (docs.rs builds them all); a build
// without some features keeps its docs, with those links as plain text.
#![cfg_attr(
    not(all(feature = "macros", feature = "redis", feature = "actix")),
    allow(rustdoc::broken_intra_doc_links)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "actix")]
pub mod actix;
mod algorithm;
#[cfg(feature = "axum")]
pub mod axum;
pub mod backend;
mod clock;
mod decision;
mod error;
#[cfg(feature = "http")]
pub mod http;
mod keys;
mod limiter;
mod log_gate;
pub mod overrides;
#[cfg(feature = "tower")]
pub mod pace;
mod pipeline;
mod registry;
mod rule;
mod secret;
mod site;
#[cfg(feature = "tower")]
pub mod tower;

pub use backend::Backend;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Cause, Charge, Decision, RateLimited};
pub use error::{Error, OnError};
pub use limiter::{Permit, Permits, RateLimiter, RateLimiterBuilder, Verdict};
pub use rule::{Algorithm, Rule, SubjectLimit};

#[cfg(feature = "actix")]
pub use actix::{RateLimit, RateLimitService};
#[cfg(feature = "http")]
pub use http::{ClientHeader, HeaderStyle, HttpOptions, UnknownClient};
#[cfg(any(feature = "actix", feature = "axum"))]
pub use http::{HttpCall, Reply};
#[cfg(feature = "tower")]
pub use tower::RateLimitLayer;

#[cfg(feature = "macros")]
#[doc(inline)]
pub use ratelimit_macros::rate_limit;

/// Names the code `#[rate_limit]` generates, by absolute paths, so it never
/// depends on what the user imported. Re-exports only; not a public API: it
/// may change in any release without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::keys::{ARG, DEFAULT_PREFIX, HEADER_SUBJECTS, SafePart, as_str, concat, len};
    pub use crate::pipeline::{Reject, check, check_all, reject};
    pub use crate::registry::SITES;
    pub use crate::site::Site;
    pub use crate::{Algorithm, OnError, Rule};
    pub use ::core::option::Option;
    pub use ::core::result::Result;
    pub use ::linkme;
    pub use ::std::format;
    pub use ::std::time::Duration;

    pub use crate::__rate_limit_http_handler as http_handler;
    pub use crate::__rate_limit_static_key as static_key;

    /// HTTP handlers (actix-web, axum).
    #[cfg(any(feature = "actix", feature = "axum"))]
    pub mod http {
        pub use crate::http::handler::{By, HttpCall, Reply, check};
        pub use crate::http::handler_set::check_all;
        pub use crate::pipeline::Report;
    }
}

/// Hooks for this repository's tests (feature `testing`). Not a public API:
/// it may change in any release without notice.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod __testing {
    pub use crate::backend::redis::hooks::RedisTestHooks;
    pub use crate::backend::redis::hooks::{WaitAnswer, memory_cancel, memory_reserve};
}

/// A key made at compile time of constant parts (`&'static str`s), for
/// `#[rate_limit]`'s expansion: one `&'static str`.
#[doc(hidden)]
#[macro_export]
macro_rules! __rate_limit_static_key {
    ($($part:expr),+ $(,)?) => {{
        const __RATELIMIT_KEY: &str = {
            const PARTS: &[&str] = &[$($part),+];
            const BYTES: [u8; $crate::__private::len(PARTS)] = $crate::__private::concat(PARTS);
            $crate::__private::as_str(&BYTES)
        };
        __RATELIMIT_KEY
    }};
}

/// An HTTP handler's expansion by `#[rate_limit]`: `{ handler } { fn as
/// written }`. With the `actix` or `axum` feature, the handler.
#[cfg(any(feature = "actix", feature = "axum"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __rate_limit_http_handler {
    ($why:literal { $($handler:tt)* } { $($written:tt)* }) => {
        $($handler)*
    };
}

/// An HTTP handler's expansion by `#[rate_limit]`: `{ handler } { fn as
/// written }`. Without the `actix` and `axum` features, the error that
/// names them (the only one: the fn stays as written).
#[cfg(not(any(feature = "actix", feature = "axum")))]
#[doc(hidden)]
#[macro_export]
macro_rules! __rate_limit_http_handler {
    ($why:literal { $($handler:tt)* } { $($written:tt)* }) => {
        ::core::compile_error!($why);
        $($written)*
    };
}
