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
//! - `actix`: actix-web handlers (429/503 responses with `Retry-After`,
//!   `by = ip`, `by = header(..)`).
#![deny(missing_docs)]
// The docs link items of every feature (docs.rs builds them all); a build
// without some features keeps its docs, with those links as plain text.
#![cfg_attr(
    not(all(feature = "macros", feature = "redis", feature = "actix")),
    allow(rustdoc::broken_intra_doc_links)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "actix")]
mod actix;
mod algorithm;
pub mod backend;
#[cfg(feature = "redis")]
mod breaker;
mod clock;
mod decision;
mod error;
pub mod keys;
mod limiter;
pub mod overrides;
mod rule;

pub use backend::Backend;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Cause, Decision, RateLimited};
pub use error::{Error, OnError};
pub use limiter::{Permit, RateLimiter, RateLimiterBuilder};
pub use rule::{Algorithm, Rule};

#[cfg(feature = "actix")]
pub use actix::{
    ClientHeader, HeaderStyle, HttpOptions, RateLimit, RateLimitService, UnknownClient,
};

#[cfg(feature = "macros")]
#[doc(inline)]
pub use ratelimit_macros::rate_limit;

/// Used by the code `#[rate_limit]` generates. Not a public API: it may change
/// in any release without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::keys::SafePart;
    pub use crate::{Algorithm, OnError, Permit, RateLimited, Rule};
    pub use ::core::option::Option;
    pub use ::core::result::Result;
    pub use ::linkme;
    pub use ::std::format;
    pub use ::std::string::String;
    pub use ::std::time::Duration;

    use std::sync::OnceLock;

    use crate::{Error, RateLimiter};

    /// Every `#[rate_limit]` rule of the program (gathered by the linker), so
    /// overrides can be checked against their names at start-up.
    #[linkme::distributed_slice]
    pub static SITES: [&'static Site];

    /// One `#[rate_limit]` rule where it is written: a `static` per call site.
    #[derive(Debug)]
    pub struct Site {
        name: &'static str,
        rule: Rule,
        cost: u64,
        limiter: Option<&'static str>,
        on_error: Option<OnError>,
        shadow: bool,
        named: OnceLock<RateLimiter>,
        #[cfg(feature = "metrics")]
        counters: OnceLock<[::metrics::Counter; 5]>,
        /// Its `RateLimit-Policy` item, rendered at the first response.
        #[cfg(feature = "actix")]
        policy: OnceLock<crate::actix::Policy>,
        /// Its key's state in process memory, when the key is fixed: pinned
        /// at the first call ([`check_fixed`]).
        pinned: crate::limiter::PinCache,
    }

    impl Site {
        /// A call site's rule and options.
        pub const fn new(
            name: &'static str,
            rule: Rule,
            cost: u64,
            limiter: Option<&'static str>,
            on_error: Option<OnError>,
            shadow: bool,
        ) -> Site {
            Site {
                name,
                rule,
                cost,
                limiter,
                on_error,
                shadow,
                named: OnceLock::new(),
                #[cfg(feature = "metrics")]
                counters: OnceLock::new(),
                #[cfg(feature = "actix")]
                policy: OnceLock::new(),
                pinned: OnceLock::new(),
            }
        }

        /// Counts one outcome of this rule (`ratelimit_calls_total{rule, outcome}`
        /// with the `metrics` feature; nothing without it).
        fn record(&self, outcome: Outcome) {
            #[cfg(feature = "metrics")]
            {
                let counters = self.counters.get_or_init(|| {
                    Outcome::ALL.map(|o| {
                        ::metrics::counter!("ratelimit_calls_total", "rule" => self.name, "outcome" => o.label())
                    })
                });
                counters[outcome as usize].increment(1);
            }
            #[cfg(not(feature = "metrics"))]
            let _ = outcome;
        }

        /// The rule's name (its `key` as written).
        pub fn name(&self) -> &'static str {
            self.name
        }

        /// The rule as written.
        pub fn rule(&self) -> &Rule {
            &self.rule
        }

        /// The units one call takes.
        pub fn cost(&self) -> u64 {
            self.cost
        }

        fn limiter(&self) -> Option<&RateLimiter> {
            let Some(name) = self.limiter else {
                return Some(RateLimiter::global());
            };
            if let Some(limiter) = self.named.get() {
                return Some(limiter);
            }
            let limiter = RateLimiter::named(name)?;
            Some(self.named.get_or_init(|| limiter))
        }
    }

    /// What happened to a call, for the counters.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Outcome {
        Allowed,
        Limited,
        ShadowLimited,
        BackendError,
        LocalFallback,
    }

    impl Outcome {
        #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
        const ALL: [Outcome; 5] = [
            Outcome::Allowed,
            Outcome::Limited,
            Outcome::ShadowLimited,
            Outcome::BackendError,
            Outcome::LocalFallback,
        ];

        #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
        fn label(self) -> &'static str {
            match self {
                Outcome::Allowed => "allowed",
                Outcome::Limited => "limited",
                Outcome::ShadowLimited => "shadow_limited",
                Outcome::BackendError => "backend_error",
                Outcome::LocalFallback => "local_fallback",
            }
        }
    }

    /// Checks one call: `Ok` with the permit to hold while the call runs,
    /// `Err` with the rejection.
    #[inline]
    pub fn check<'a>(site: &'static Site, key: &'a str) -> Checking<'a> {
        check_on(site, site.limiter(), key, false)
    }

    /// [`check`] of a call site whose key is fixed (no placeholder, no
    /// subject): every call checks the same key, so in process memory its
    /// state is pinned to a cache line of its own, reached without the
    /// store's shards (one cache line moves between the threads that take
    /// turns on it, not two or three).
    #[inline]
    pub fn check_fixed(site: &'static Site, key: &'static str) -> Checking<'static> {
        check_on(site, site.limiter(), key, true)
    }

    /// What [`check`] answers: in process memory the answer is there at
    /// once, in a small future with no state machine to build or move; a
    /// backend's call is one boxed future.
    pub type Checking<'a> = ReadyOr<'a, Result<Permit, RateLimited>>;

    /// A future that is either its answer already or one boxed future.
    pub enum ReadyOr<'a, T> {
        /// Decided already (taken when polled).
        Ready(Option<T>),
        /// Waiting on the backend.
        Pending(::core::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>),
    }

    impl<T> ::core::fmt::Debug for ReadyOr<'_, T> {
        fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
            f.write_str(match self {
                ReadyOr::Ready(_) => "Ready",
                ReadyOr::Pending(_) => "Pending",
            })
        }
    }

    // The answer is only ever moved out, never pinned; the pending future
    // is pinned in its own box.
    impl<T> Unpin for ReadyOr<'_, T> {}

    impl<T> Future for ReadyOr<'_, T> {
        type Output = T;

        #[inline]
        fn poll(
            mut self: ::core::pin::Pin<&mut Self>,
            cx: &mut ::core::task::Context<'_>,
        ) -> ::core::task::Poll<T> {
            match &mut *self {
                ReadyOr::Ready(answer) => {
                    ::core::task::Poll::Ready(answer.take().expect("polled after it was ready"))
                }
                ReadyOr::Pending(future) => future.as_mut().poll(cx),
            }
        }
    }

    fn check_on<'a>(
        site: &'static Site,
        limiter: Option<&'a RateLimiter>,
        key: &'a str,
        fixed: bool,
    ) -> Checking<'a> {
        match decide_now(site, limiter, key, fixed) {
            Ok(answer) => ReadyOr::Ready(Some(answer)),
            Err(later) => ReadyOr::Pending(Box::pin(later.decide(site, key))),
        }
    }

    /// [`check_on`] with a key of its own, which a pending check keeps in
    /// its box.
    #[cfg_attr(not(feature = "actix"), allow(dead_code))]
    fn check_on_owned<'a>(
        site: &'static Site,
        limiter: Option<&'a RateLimiter>,
        key: String,
    ) -> Checking<'a> {
        match decide_now(site, limiter, &key, false) {
            Ok(answer) => ReadyOr::Ready(Some(answer)),
            Err(later) => ReadyOr::Pending(Box::pin(async move { later.decide(site, &key).await })),
        }
    }

    /// A check that waits: on a backend, or on the failure policy of a
    /// limiter that is not installed.
    enum Later<'a> {
        Backend {
            limiter: &'a RateLimiter,
            rule: Rule,
            shadow: bool,
        },
        MissingLimiter,
    }

    impl Later<'_> {
        async fn decide(self, site: &'static Site, key: &str) -> Result<Permit, RateLimited> {
            match self {
                Later::Backend {
                    limiter,
                    rule,
                    shadow,
                } => {
                    let on_error = site.on_error.unwrap_or(limiter.on_backend_error());
                    let answer = limiter
                        .acquire_from_backend(&rule, key, site.cost, on_error)
                        .await;
                    conclude(site, &rule, shadow, key, answer)
                }
                Later::MissingLimiter => missing_limiter(site, key).await,
            }
        }
    }

    /// The answer, if the limiter has it at once (in process memory).
    #[inline]
    fn decide_now<'a>(
        site: &'static Site,
        limiter: Option<&'a RateLimiter>,
        key: &str,
        fixed: bool,
    ) -> Result<Result<Permit, RateLimited>, Later<'a>> {
        let Some(limiter) = limiter else {
            return Err(Later::MissingLimiter);
        };
        let shadow = site.shadow || limiter.is_shadow();
        let (rule, shadow) = crate::overrides::effective(site.name, &site.rule, shadow)
            .unwrap_or((site.rule, shadow));
        let pin = fixed.then_some(&site.pinned);
        match limiter.acquire_at_once(&rule, key, site.cost, pin) {
            Some(answer) => Ok(conclude(site, &rule, shadow, key, answer)),
            None => Err(Later::Backend {
                limiter,
                rule,
                shadow,
            }),
        }
    }

    /// The call's fate once the limiter has answered: counted, logged, and
    /// turned into a permit or a rejection (shadow rules only log theirs).
    fn conclude(
        site: &'static Site,
        rule: &Rule,
        shadow: bool,
        key: &str,
        answer: Result<Permit, Error>,
    ) -> Result<Permit, RateLimited> {
        let refused = match answer {
            Ok(permit) => {
                if permit.local {
                    site.record(Outcome::LocalFallback);
                }
                if permit.unchecked {
                    site.record(Outcome::BackendError);
                }
                if permit.decision().allowed {
                    site.record(Outcome::Allowed);
                    tracing::debug!(
                        rule = site.name,
                        key,
                        remaining = permit.decision().remaining,
                        "allowed"
                    );
                    return Ok(permit);
                }
                RateLimited::from_decision(permit.decision()).with_rule(rule.period(), site.name)
            }
            Err(Error::Backend(_)) => {
                site.record(Outcome::BackendError);
                RateLimited::backend_unavailable(rule.count())
            }
            // Costs are checked when the code is compiled (and overrides
            // against them when set); anything else is a bug of ours: let the
            // call through rather than fail it.
            Err(error) => {
                tracing::error!(%error, key, "rate limiter failed; letting the call through");
                return Ok(Permit::allowed_unchecked(rule));
            }
        };
        if shadow {
            site.record(Outcome::ShadowLimited);
            tracing::info!(rule = site.name, key, %refused, "shadow rate limit exceeded; call allowed");
            return Ok(Permit::allowed_unchecked(rule));
        }
        if !refused.is_backend_failure() {
            site.record(Outcome::Limited);
        }
        tracing::debug!(rule = site.name, key, %refused, "rate limited");
        Err(refused)
    }

    /// `limiter = "name"` with no limiter installed under that name: handled
    /// like a backend failure (the in-memory default answers for `local`).
    async fn missing_limiter(site: &'static Site, key: &str) -> Result<Permit, RateLimited> {
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        static FALLBACK: OnceLock<RateLimiter> = OnceLock::new();
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(
                limiter = site.limiter,
                "no rate limiter installed under this name (RateLimiter::install_as); \
                 applying the rule's failure policy"
            );
        }
        match site.on_error.unwrap_or_default() {
            OnError::Allow => Ok(Permit::allowed_unchecked(&site.rule)),
            OnError::Deny if site.shadow => Ok(Permit::allowed_unchecked(&site.rule)),
            OnError::Deny => Err(RateLimited::backend_unavailable(site.rule.count())),
            OnError::Local => {
                let limiter = FALLBACK.get_or_init(RateLimiter::in_memory);
                match limiter
                    .acquire_with(&site.rule, key, site.cost, OnError::Local)
                    .await
                {
                    Ok(permit) if !permit.decision().allowed && !site.shadow => {
                        Err(RateLimited::from_decision(permit.decision())
                            .with_rule(site.rule.period(), site.name))
                    }
                    _ => Ok(Permit::allowed_unchecked(&site.rule)),
                }
            }
        }
    }

    /// The value a fn returns for a rejection, by its return type.
    #[inline]
    pub fn reject<R: Reject>(limited: RateLimited) -> R {
        R::reject(limited)
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

    /// actix-web glue.
    #[cfg(feature = "actix")]
    pub mod actix {
        pub use crate::actix::{Report, allowed, demoted, limiter_for, refused, respond};
        pub use ::actix_web::{HttpRequest, HttpResponse};

        use super::{Checking, Permit, RateLimited, ReadyOr, Site, check_on, check_on_owned};
        use crate::RateLimiter;
        use crate::actix::{header_subject, ip_subject};

        /// Whose budget, for a handler.
        #[derive(Clone, Copy, Debug)]
        pub enum By {
            /// Everyone's.
            Global,
            /// Everyone's, under a key fixed at compile time (see
            /// [`check_fixed`](super::check_fixed)).
            GlobalFixed,
            /// The client address's.
            Ip,
            /// The header value's.
            Header(&'static str),
        }

        /// Checks one call of a handler: the limiter is the site's named one,
        /// else `app`, the request's ([`limiter_for`]: the app's, else the
        /// global one); `by` is resolved under it. In process memory the
        /// answer is there at once, as [`check`](super::check)'s is.
        pub fn check<'a>(
            site: &'static Site,
            base: &'a str,
            by: By,
            req: &HttpRequest,
            app: &'a RateLimiter,
        ) -> Checking<'a> {
            let limiter = match site.limiter {
                Some(_) => site.limiter(),
                None => Some(app),
            };
            let key = match by {
                By::Global => return check_on(site, limiter, base, false),
                By::GlobalFixed => return check_on(site, limiter, base, true),
                By::Ip => {
                    let subject = match limiter.map(|l| ip_subject(l, req)) {
                        Some(Ok(subject)) => subject,
                        Some(Err(())) => {
                            return ReadyOr::Ready(Some(Err(RateLimited::unknown_client(
                                site.rule.count(),
                            )
                            .with_rule(site.rule.period(), site.name))));
                        }
                        None => ":ip:unknown".to_owned(),
                    };
                    [base, &subject].concat()
                }
                By::Header(name) => [base, &header_subject(req, name)].concat(),
            };
            check_on_owned(site, limiter, key)
        }

        /// What the rate-limit headers say of a rule the call passed: the
        /// rule in force (an override's period, if any).
        pub fn report(site: &'static Site, permit: &Permit) -> Option<Report> {
            let rule = crate::overrides::effective(site.name, &site.rule, false)
                .map_or(site.rule, |(rule, _)| rule);
            Some(Report::new(site.name, &rule, permit.decision()).with_policy(&site.policy))
        }

        /// An actix handler returning `HttpResponse` answers 429 (or 503).
        #[diagnostic::do_not_recommend]
        impl super::Reject for HttpResponse {
            #[inline]
            fn reject(limited: super::RateLimited) -> Self {
                ::actix_web::ResponseError::error_response(&limited)
            }
        }
    }
}
