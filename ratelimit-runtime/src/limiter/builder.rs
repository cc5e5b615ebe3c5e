//! [`RateLimiterBuilder`]: the backend, its failure policy and its options.

use std::fmt;
use std::sync::Arc;

use std::time::Duration;

use super::RateLimiter;
use super::store::{CustomBackend, Store};
use crate::backend::Backend;
use crate::backend::memory::MemoryBackend;
#[cfg(feature = "redis")]
use crate::backend::redis::{
    ConnectOptions, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, RedisBackend, RedisTarget,
};
#[cfg(feature = "redis")]
use crate::backend::{Failover, LocalQuotas, OverLimitCache};
use crate::clock::Clock;
use crate::error::{Error, OnError};
use crate::secret::KeySecret;

/// Builds a [`RateLimiter`]: pick a backend, then [`build`](RateLimiterBuilder::build).
///
/// The default backend is in process memory.
#[derive(Default)]
pub struct RateLimiterBuilder {
    backend: BackendChoice,
    on_error: OnError,
    shadow: bool,
    max_keys: Option<usize>,
    key_secret: Option<KeySecret>,
    public_key_secret: bool,
    clock: Option<Box<dyn Clock>>,
    #[cfg(feature = "redis")]
    timeout: Option<Duration>,
    #[cfg(feature = "redis")]
    connect_timeout: Option<Duration>,
    probe_interval: Option<Duration>,
    #[cfg(feature = "redis")]
    start_degraded: bool,
    #[cfg(feature = "redis")]
    over_limit_cache: bool,
    #[cfg(feature = "redis")]
    per_check_calls: bool,
    #[cfg(feature = "redis")]
    no_functions: bool,
    /// The hash of the fleet's overrides, when read.
    #[cfg(feature = "redis")]
    fleet_overrides: Option<String>,
}

/// What a builder prints: no password of a URL, no key secret, no
/// certificate.
impl fmt::Debug for RateLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("RateLimiterBuilder");
        out.field("backend", &self.backend)
            .field("on_error", &self.on_error)
            .field("shadow", &self.shadow)
            .field("max_keys", &self.max_keys)
            .field("key_secret", &self.key_secret)
            .field("public_key_secret", &self.public_key_secret);
        #[cfg(feature = "redis")]
        out.field("timeout", &self.timeout)
            .field("over_limit_cache", &self.over_limit_cache)
            .field("start_degraded", &self.start_degraded)
            .field("fleet_overrides", &self.fleet_overrides);
        out.finish_non_exhaustive()
    }
}

#[derive(Default)]
enum BackendChoice {
    #[default]
    Memory,
    #[cfg(feature = "redis")]
    Redis(RedisTarget),
    Custom(Box<dyn CustomBackend>),
}

impl fmt::Debug for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendChoice::Memory => f.write_str("Memory"),
            #[cfg(feature = "redis")]
            BackendChoice::Redis(target) => f.debug_tuple("Redis").field(target).finish(),
            BackendChoice::Custom(backend) => f.debug_tuple("Custom").field(backend).finish(),
        }
    }
}

impl RateLimiterBuilder {
    /// Keep budgets in process memory (the default): limits hold per process.
    pub fn in_memory(mut self) -> Self {
        self.backend = BackendChoice::Memory;
        self
    }

    /// Keep budgets in Redis: limits hold across every process that uses
    /// it. `target` is a URL (`"redis://host:port/db"`, `rediss://` for
    /// TLS), a list of a Redis Cluster's nodes (`["redis://a:7000",
    /// "redis://b:7001"]`: every check runs on the one slot of its key),
    /// [`RedisTarget::sentinel`]`(master, sentinels)`, or a `redis::Client`,
    /// `ConnectionManager` or `ClusterClient` of your own; see
    /// [`RedisTarget`]. A private certificate authority for `rediss://`:
    /// `.redis(RedisTarget::from(url).tls_root_certificate(pem))`.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, target: impl Into<RedisTarget>) -> Self {
        self.backend = BackendChoice::Redis(target.into());
        self
    }

    /// What to do with a call when the backend fails or does not answer in
    /// time: [`OnError::Local`] (the default) checks the same rule in process
    /// memory until it answers again, [`OnError::Allow`] lets calls through,
    /// [`OnError::Deny`] refuses them. A rule's `on_error` overrides it.
    pub fn on_backend_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// After the backend (Redis, or one of yours) fails, how often one call
    /// probes it while the others are answered by the failure policy without
    /// waiting for it (default 250 ms).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = Some(interval);
        self
    }

    /// Let [`build`](RateLimiterBuilder::build) succeed when Redis cannot be
    /// reached: the limiter starts degraded (the failure policy answers) and
    /// connects when Redis answers a probe.
    #[cfg(feature = "redis")]
    pub fn start_degraded(mut self, allow: bool) -> Self {
        self.start_degraded = allow;
        self
    }

    /// Remember keys Redis refused until a known time, and refuse them
    /// locally until then, without a round trip (off by default). It never
    /// lets through a call Redis would refuse, and never refuses past the
    /// time Redis named. Cuts Redis load during floods.
    ///
    /// A refund or reset through this limiter forgets the key's refusal, and
    /// so does a give-back of what Redis allowed a call whose answer came
    /// too late. One made through another instance (or in Redis directly)
    /// is not seen here: until the time Redis named, this instance still
    /// refuses the key locally.
    #[cfg(feature = "redis")]
    pub fn over_limit_cache(mut self, enabled: bool) -> Self {
        self.over_limit_cache = enabled;
        self
    }

    /// Apply the overrides kept in Redis for the whole fleet (off by
    /// default): the hash [`limiter:overrides`](crate::overrides::fleet::DEFAULT_KEY),
    /// read when the limiter is built and then twice a second, so a change
    /// made there (`redis-cli HSET limiter:overrides search.count 50`)
    /// applies on every instance within a second; while Redis cannot be
    /// read, the values last read stay in force. Their place among the
    /// other sources of overrides, the format and what happens to a bad
    /// entry: see [`overrides::fleet`](crate::overrides::fleet).
    ///
    /// Off by default because whoever may write that key then sets the
    /// program's limits, and because overrides are the process's: with
    /// several limiters in one process, one of them reads them (the last
    /// built with this on). Needs the Redis backend; reading stops when
    /// the limiter (with its clones) is dropped, and the fleet's values
    /// then no longer apply.
    #[cfg(feature = "redis")]
    pub fn fleet_overrides(mut self, enabled: bool) -> Self {
        self.fleet_overrides = enabled.then(|| crate::overrides::fleet::DEFAULT_KEY.to_owned());
        self
    }

    /// [`fleet_overrides`](Self::fleet_overrides) read from the hash at
    /// `key` instead of `limiter:overrides` (one per application sharing a
    /// Redis, or a key your ACL lets the limiter's user read).
    #[cfg(feature = "redis")]
    pub fn fleet_overrides_key(mut self, key: impl Into<String>) -> Self {
        self.fleet_overrides = Some(key.into());
        self
    }

    /// At most about `max_keys` keys in process memory (the in-memory store,
    /// or the insurance limiter used while Redis fails); see
    /// [`MemoryBackend::with_max_keys`] for what happens when it is reached
    /// (calls stay limited). Default: 1,000,000
    /// ([`DEFAULT_MAX_KEYS`](crate::backend::memory::DEFAULT_MAX_KEYS)),
    /// 76 to 154 MB by the keys' length (as measured by
    /// `tests/memory_bound.rs`); `usize::MAX` for no cap (expired keys are
    /// still reclaimed).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The secret of the keyed digests that stand for header values in keys
    /// (`by = header(..)`, a middleware's `by_header`), and client
    /// addresses with [`HttpOptions::digest_client_ips`](crate::HttpOptions::digest_client_ips):
    /// HMAC-SHA1 under it, so whoever reads keys (Redis, logs) can neither
    /// read an API key nor test guesses of one. Every instance that shares a
    /// Redis must have the same; read it from your secret store or the
    /// environment, never from the code.
    ///
    /// Without it, a limiter in process memory uses a random secret of the
    /// process (nothing else reads its keys); a limiter on Redis (or a
    /// backend of your own) fails to [`build`](Self::build) when the program
    /// has a `by = header(..)` rule, unless
    /// [`public_key_secret`](Self::public_key_secret) says otherwise; a
    /// middleware's `by_header` or digested client addresses on it refuse
    /// their requests (`500`, [`Cause::Misconfigured`](crate::Cause::Misconfigured))
    /// rather than count them per instance.
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key_secret = Some(KeySecret::Given(Arc::from(secret.as_ref())));
        self
    }

    /// With Redis (or a backend of your own) and no
    /// [`key_secret`](Self::key_secret): digest with the crate's built-in
    /// secret instead of failing to build. It is public, so keys agree
    /// across instances, but anyone who reads them can test guesses of the
    /// values offline (short API keys, and every IPv4 address). For tests
    /// and trusted setups only.
    pub fn public_key_secret(mut self, allow: bool) -> Self {
        self.public_key_secret = allow;
        self
    }

    /// The key secret for the chosen backend; `Err` when it needs one the
    /// application did not give.
    fn secret(&self) -> Result<KeySecret, Error> {
        if let Some(secret) = &self.key_secret {
            return Ok(secret.clone());
        }
        if matches!(self.backend, BackendChoice::Memory) {
            return Ok(KeySecret::Process);
        }
        if self.public_key_secret {
            return Ok(KeySecret::Public);
        }
        let headers = crate::keys::HEADER_SUBJECTS;
        if let Some(header) = headers.first() {
            return Err(Error::Config(format!(
                "this program limits by a request header (`by = header({header:?})`), and its \
                 budgets are kept in a store other instances share: set \
                 RateLimiterBuilder::key_secret (the same on every instance, read from your \
                 secret store or the environment) so the digests that stand for header \
                 values in keys cannot be guessed, or .public_key_secret(true) to accept \
                 the built-in public one"
            )));
        }
        Ok(KeySecret::Missing)
    }

    /// Shadow mode for every rule on this limiter: calls are checked and
    /// counted but never refused (for rolling out new limits safely).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Keep budgets in a backend of your own. It fails over as Redis does:
    /// a call it answers with [`Error::Backend`] goes to the failure policy
    /// ([`on_backend_error`](Self::on_backend_error), or the rule's
    /// `on_error`), and a circuit breaker spares it calls while it fails (see
    /// [`Backend`] and [`probe_interval`](Self::probe_interval)).
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

    /// How long one check may wait for Redis (default 50 ms); a check that
    /// takes longer is answered by the failure policy.
    #[cfg(feature = "redis")]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Coalesce the checks that wait for Redis at the same moment into one
    /// script call (default `true`; on a cluster, one call per master, with
    /// the function library): each check stays atomic and keeps one round
    /// trip, the server runs many per call. `false` sends every check as its
    /// own call.
    #[cfg(feature = "redis")]
    pub fn coalesce(mut self, coalesce: bool) -> Self {
        self.per_check_calls = !coalesce;
        self
    }

    /// Load the scripts as a Redis function library, called with `FCALL`
    /// (default `true`; on a cluster, on every master): the server skips
    /// the script's setup at every call, several µs of its time, and a
    /// cluster's checks can be coalesced per master. Where the server has
    /// no functions (before Redis 7) or the user may not load them, calls go
    /// by `EVALSHA` either way. The library
    /// (`ratelimit_<version>`) stays in Redis, as functions do, until
    /// `FUNCTION DELETE`; `false` leaves nothing there but the script cache.
    #[cfg(feature = "redis")]
    pub fn redis_functions(mut self, functions: bool) -> Self {
        self.no_functions = !functions;
        self
    }

    /// How long [`build`](RateLimiterBuilder::build) may take to connect to
    /// Redis and load the scripts (default 2 s).
    #[cfg(feature = "redis")]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    #[cfg(feature = "redis")]
    fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            connect_timeout: self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            lazy: self.start_degraded,
            coalesce: !self.per_check_calls,
            functions: !self.no_functions,
        }
    }

    /// How often a failed backend is probed.
    fn probe(&self) -> Duration {
        self.probe_interval.unwrap_or(Duration::from_millis(250))
    }

    #[cfg(feature = "redis")]
    fn redis_store(&self, redis: RedisBackend, clock: Option<Box<dyn Clock>>) -> Arc<dyn Store> {
        let over_limit = self.over_limit_cache.then(|| {
            Arc::new(OverLimitCache::new(
                self.max_keys
                    .unwrap_or(crate::backend::memory::DEFAULT_MAX_KEYS),
            ))
        });
        if let Some(cache) = &over_limit {
            // What a late answer allowed, given back: the key's refusal no
            // longer holds.
            let cache = Arc::clone(cache);
            redis.on_give_back(Box::new(move |key| cache.forget_key(key)));
        }
        let failover = Failover::new(redis, self.memory(clock), self.probe(), self.on_error);
        let failover = failover.with_over_limit(over_limit);
        // Rules with a local quota are served from blocks held in process.
        let max_keys = self
            .max_keys
            .unwrap_or(crate::backend::memory::DEFAULT_MAX_KEYS);
        Arc::new(LocalQuotas::new(failover, max_keys))
    }

    /// The in-process store, on the given clock or the system's.
    fn memory(&self, clock: Option<Box<dyn Clock>>) -> MemoryBackend {
        let store = match clock {
            Some(clock) => MemoryBackend::with_boxed_clock(clock),
            None => MemoryBackend::new(),
        };
        match self.max_keys {
            Some(max) => store.with_max_keys(max),
            None => store,
        }
    }

    /// Builds the limiter, connecting to Redis if one was chosen.
    ///
    /// With Redis, the connection runs on the current Tokio runtime. If that
    /// runtime ends while the limiter is still used, the connection is made
    /// again on the runtime that checks; one that lives on without being
    /// driven (a current-thread runtime outside `block_on`) leaves the
    /// limiter's checks timing out.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a malformed Redis URL (its password left out of
    /// the message), [`fleet_overrides`](Self::fleet_overrides) without
    /// the Redis backend, or a Redis (or custom) backend without a
    /// [`key_secret`](Self::key_secret) in a program that limits by a
    /// request header; [`Error::Backend`] if
    /// Redis cannot be reached (or the scripts loaded) within the connect
    /// timeout.
    pub async fn build(mut self) -> Result<RateLimiter, Error> {
        let secret = self.secret()?;
        #[cfg(feature = "redis")]
        if self.fleet_overrides.is_some() && !matches!(self.backend, BackendChoice::Redis(_)) {
            return Err(Error::Config(
                "fleet_overrides reads the overrides from Redis: choose the Redis backend \
                 (RateLimiterBuilder::redis)"
                    .to_owned(),
            ));
        }
        let clock = self.clock.take();
        let backend = std::mem::take(&mut self.backend);
        #[cfg(feature = "redis")]
        let mut fleet = None;
        let store: Arc<dyn Store> = match backend {
            BackendChoice::Memory => Arc::new(self.memory(clock)),
            #[cfg(feature = "redis")]
            BackendChoice::Redis(target) => {
                let redis = RedisBackend::connect(target, self.connect_options()).await?;
                if let Some(key) = &self.fleet_overrides {
                    fleet = Some(Arc::new(crate::overrides::fleet::start(&redis, key).await));
                }
                self.redis_store(redis, clock)
            }
            BackendChoice::Custom(backend) => {
                backend.with_failover(self.memory(clock), self.probe(), self.on_error)
            }
        };
        Ok(RateLimiter {
            on_error: self.on_error,
            shadow: self.shadow,
            secret,
            #[cfg(feature = "redis")]
            fleet,
            ..RateLimiter::from_store(store)
        })
    }
}
