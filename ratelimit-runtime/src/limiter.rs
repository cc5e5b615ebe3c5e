//! The [`RateLimiter`] handle, its builder, and the global limiter the
//! attribute uses.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "redis")]
use std::time::Duration;

use once_cell::sync::OnceCell;

use crate::backend::Backend;
use crate::backend::memory::MemoryBackend;
#[cfg(feature = "redis")]
use crate::backend::redis::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, RedisBackend};
use crate::clock::{Clock, SystemClock};
use crate::{Decision, Error, Rule};

static GLOBAL: OnceCell<RateLimiter> = OnceCell::new();

/// A rate limiter: a backend to keep budgets in, and what to do when it fails.
///
/// Cheap to clone (clones share everything). Build one at start-up with
/// [`RateLimiter::builder`], then [`install`](RateLimiter::install) it as the
/// global limiter that `#[rate_limit]` uses. With nothing installed, an
/// in-memory limiter serves.
///
/// ```no_run
/// use ratelimit_runtime::RateLimiter;
///
/// # async fn start() -> Result<(), ratelimit_runtime::Error> {
/// RateLimiter::builder()
///     .redis("redis://127.0.0.1:6379")
///     .build()
///     .await?
///     .install()?;
/// # Ok(()) }
/// ```
///
/// It can also be asked directly:
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{RateLimiter, Rule};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
/// const LOGIN: Rule = Rule::fixed_window(2, Duration::from_secs(60));
/// let limiter = RateLimiter::in_memory();
/// assert!(limiter.check(&LOGIN, "login:alice").await?.allowed);
/// assert!(limiter.check(&LOGIN, "login:alice").await?.allowed);
/// let third = limiter.check(&LOGIN, "login:alice").await?;
/// assert!(!third.allowed);
/// // The window started at the first call, a moment ago.
/// assert!(third.retry_after > Duration::from_secs(59));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimiter {
    inner: Arc<Store>,
}

#[derive(Debug)]
enum Store {
    Memory(MemoryBackend),
    #[cfg(feature = "redis")]
    Redis {
        redis: RedisBackend,
        /// Checks the same rules in process memory while Redis fails, so the
        /// service stays up and each instance still enforces the limits.
        insurance: MemoryBackend,
        degraded: AtomicBool,
    },
    Custom(Box<dyn DynBackend>),
}

impl RateLimiter {
    /// Starts building a limiter; see [`RateLimiterBuilder`].
    pub fn builder() -> RateLimiterBuilder {
        RateLimiterBuilder::default()
    }

    /// An in-process limiter on the system clock: the embedded default.
    pub fn in_memory() -> RateLimiter {
        RateLimiter::from_store(Store::Memory(MemoryBackend::new()))
    }

    /// An in-process limiter on the given clock (a [`ManualClock`](crate::ManualClock)
    /// in tests, so they advance time instead of sleeping).
    pub fn in_memory_with_clock(clock: impl Clock) -> RateLimiter {
        RateLimiter::from_store(Store::Memory(MemoryBackend::with_clock(clock)))
    }

    fn from_store(store: Store) -> RateLimiter {
        RateLimiter {
            inner: Arc::new(store),
        }
    }

    /// Makes this the global limiter, the one `#[rate_limit]` uses.
    ///
    /// Call it once at start-up, before any rate-limited call: the first such
    /// call takes the in-memory default if nothing is installed yet.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyInstalled`] if a global limiter is already in place;
    /// the one in place stays.
    pub fn install(self) -> Result<(), Error> {
        GLOBAL.set(self).map_err(|_| Error::AlreadyInstalled)
    }

    /// The global limiter: the installed one, else the in-memory default
    /// (which from then on stays the global limiter).
    pub fn global() -> &'static RateLimiter {
        GLOBAL.get_or_init(RateLimiter::in_memory)
    }

    /// The name of the backend: `"memory"`, `"redis"` or `"custom"`.
    pub fn backend_name(&self) -> &'static str {
        match &*self.inner {
            Store::Memory(_) => "memory",
            #[cfg(feature = "redis")]
            Store::Redis { .. } => "redis",
            Store::Custom(_) => "custom",
        }
    }

    /// Checks and consumes one unit of `key`'s budget under `rule`.
    ///
    /// Being over the limit is not an error: it is a [`Decision`] with
    /// `allowed == false`.
    ///
    /// # Errors
    ///
    /// Only a custom backend's failure: the Redis backend falls back to an
    /// in-process limiter while Redis fails.
    pub async fn check(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.check_cost(rule, key, 1).await
    }

    /// Checks and consumes `cost` units of `key`'s budget under `rule`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCost`] if `cost` is 0 or over the rule's capacity (such
    /// a call could never pass), and as [`check`](RateLimiter::check).
    pub async fn check_cost(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        if cost == 0 || cost > rule.capacity() {
            return Err(Error::InvalidCost {
                cost,
                capacity: rule.capacity(),
            });
        }
        match &*self.inner {
            Store::Memory(memory) => Ok(memory.check_now(rule, key, cost)),
            #[cfg(feature = "redis")]
            Store::Redis {
                redis,
                insurance,
                degraded,
            } => match Backend::check(redis, rule, key, cost).await {
                Ok(decision) => {
                    if degraded.load(Ordering::Relaxed) && degraded.swap(false, Ordering::Relaxed) {
                        tracing::info!("Redis answers again; rate limits are shared again");
                    }
                    Ok(decision)
                }
                Err(error) => {
                    if !degraded.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            %error,
                            "Redis is unavailable; enforcing rate limits per process until it answers"
                        );
                    }
                    Ok(insurance.check_now(rule, key, cost))
                }
            },
            Store::Custom(backend) => DynBackend::check(&**backend, rule, key, cost).await,
        }
    }
}

/// Builds a [`RateLimiter`]: pick a backend, then [`build`](RateLimiterBuilder::build).
///
/// The default backend is in process memory.
#[derive(Debug, Default)]
pub struct RateLimiterBuilder {
    backend: BackendChoice,
    clock: Option<Box<dyn Clock>>,
    #[cfg(feature = "redis")]
    timeout: Option<Duration>,
    #[cfg(feature = "redis")]
    connect_timeout: Option<Duration>,
}

#[derive(Debug, Default)]
enum BackendChoice {
    #[default]
    Memory,
    #[cfg(feature = "redis")]
    Redis(String),
    Custom(Box<dyn DynBackend>),
}

impl RateLimiterBuilder {
    /// Keep budgets in process memory (the default): limits hold per process.
    pub fn in_memory(mut self) -> Self {
        self.backend = BackendChoice::Memory;
        self
    }

    /// Keep budgets in the Redis server at `url` (`redis://host:port/db`):
    /// limits hold across every process that uses it.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.backend = BackendChoice::Redis(url.into());
        self
    }

    /// Keep budgets in a backend of your own.
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backend = BackendChoice::Custom(Box::new(backend));
        self
    }

    /// The clock of the in-process store (and of the insurance limiter used
    /// while Redis fails); a [`ManualClock`](crate::ManualClock) in tests.
    /// Redis always uses its own server clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Box::new(clock));
        self
    }

    /// How long one check may wait for Redis (default 250 ms); a check that
    /// takes longer is answered by the in-process insurance limiter.
    #[cfg(feature = "redis")]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long [`build`](RateLimiterBuilder::build) may take to connect to
    /// Redis and load the scripts (default 2 s).
    #[cfg(feature = "redis")]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Builds the limiter, connecting to Redis if one was chosen.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a malformed Redis URL, [`Error::Backend`] if
    /// Redis cannot be reached (or the scripts loaded) within the connect
    /// timeout.
    pub async fn build(self) -> Result<RateLimiter, Error> {
        let clock = self.clock.unwrap_or_else(|| Box::new(SystemClock::new()));
        let store = match self.backend {
            BackendChoice::Memory => Store::Memory(MemoryBackend::with_boxed_clock(clock)),
            #[cfg(feature = "redis")]
            BackendChoice::Redis(url) => Store::Redis {
                redis: RedisBackend::connect_with(
                    &url,
                    self.timeout.unwrap_or(DEFAULT_TIMEOUT),
                    self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
                )
                .await?,
                insurance: MemoryBackend::with_boxed_clock(clock),
                degraded: AtomicBool::new(false),
            },
            BackendChoice::Custom(backend) => Store::Custom(backend),
        };
        Ok(RateLimiter::from_store(store))
    }
}

type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// [`Backend`] made object-safe, for custom backends (the built-in ones are
/// called without boxing).
trait DynBackend: Send + Sync + fmt::Debug + 'static {
    fn check<'a>(&'a self, rule: &'a Rule, key: &'a str, cost: u64) -> CheckFuture<'a>;
}

impl<B: Backend> DynBackend for B {
    fn check<'a>(&'a self, rule: &'a Rule, key: &'a str, cost: u64) -> CheckFuture<'a> {
        Box::pin(Backend::check(self, rule, key, cost))
    }
}
