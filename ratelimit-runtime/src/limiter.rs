//! The [`RateLimiter`] handle, its builder, and the global limiter the
//! attribute uses.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, PoisonError, RwLock};
#[cfg(feature = "redis")]
use std::time::Duration;

use once_cell::sync::OnceCell;

use crate::backend::Backend;
use crate::backend::memory::{MemoryBackend, Pinned};
#[cfg(feature = "redis")]
use crate::backend::redis::{
    ConnectOptions, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, RedisBackend,
};
#[cfg(feature = "redis")]
use crate::breaker::{Breaker, CircuitOpen, OverLimitCache};
use crate::clock::Clock;
use crate::{Algorithm, Decision, Error, OnError, Rule};

static GLOBAL: OnceCell<RateLimiter> = OnceCell::new();
/// Installed by name; never removed, so each lives as long as the process.
static NAMED: RwLock<Vec<(Box<str>, &'static RateLimiter)>> = RwLock::new(Vec::new());

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
    inner: Arc<Shared>,
    on_error: OnError,
    shadow: bool,
    #[cfg(feature = "actix")]
    http: Arc<crate::actix::HttpOptions>,
}

/// What every clone of a limiter shares.
struct Shared {
    store: Store,
    /// The store for as long as the process runs, once the limiter is
    /// installed (installed limiters are never dropped). A lease then holds
    /// this reference instead of a counted one: counting is a write to a
    /// cache line that every thread taking leases shares, which made two
    /// threads taking leases slower than one.
    forever: OnceCell<&'static Store>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `forever` is the store again: say only whether it is set.
        f.debug_struct("Shared")
            .field("store", &self.store)
            .field("installed", &self.forever.get().is_some())
            .finish()
    }
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
        breaker: Breaker,
        over_limit: Option<OverLimitCache>,
    },
    Custom(Box<dyn DynBackend>),
}

impl Store {
    /// Gives a lease back at once when it was taken in process memory (the
    /// memory store, or the insurance limiter while Redis failed); `false`
    /// when the backend holds it.
    fn release_in_process(&self, lease: &Lease) -> bool {
        match self {
            Store::Memory(memory) => memory.release_now(&lease.key, lease.id),
            #[cfg(feature = "redis")]
            Store::Redis { insurance, .. } if lease.held_by_insurance => {
                insurance.release_now(&lease.key, lease.id)
            }
            _ => return false,
        }
        true
    }

    /// Gives a lease back, where it was taken.
    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        if self.release_in_process(lease) {
            return Ok(());
        }
        match self {
            #[cfg(feature = "redis")]
            Store::Redis { redis, .. } => {
                Backend::release(redis, &lease.rule, &lease.key, lease.cost, lease.id).await
            }
            Store::Custom(backend) => {
                backend
                    .release(&lease.rule, &lease.key, lease.cost, lease.id)
                    .await
            }
            // Released in process above.
            Store::Memory(_) => Ok(()),
        }
    }
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
            inner: Arc::new(Shared {
                store,
                forever: OnceCell::new(),
            }),
            on_error: OnError::default(),
            shadow: false,
            #[cfg(feature = "actix")]
            http: Arc::default(),
        }
    }

    /// How this limiter deals with HTTP requests (feature `actix`).
    #[cfg(feature = "actix")]
    pub fn http_options(&self) -> &crate::actix::HttpOptions {
        &self.http
    }

    /// Whether every rule on this limiter is in shadow mode (checked and
    /// recorded, never refusing): [`RateLimiterBuilder::shadow`].
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// What this limiter does with a call when its backend fails
    /// ([`RateLimiterBuilder::on_backend_error`]; a rule may say otherwise).
    pub fn on_backend_error(&self) -> OnError {
        self.on_error
    }

    /// Makes this limiter available by `name`, for rules that say
    /// `limiter = "name"`. It stays installed, and so in memory, for the
    /// life of the process, like the global limiter.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyInstalled`] if a limiter already has that name.
    pub fn install_as(self, name: &str) -> Result<(), Error> {
        let mut named = NAMED.write().unwrap_or_else(PoisonError::into_inner);
        if named.iter().any(|(n, _)| &**n == name) {
            return Err(Error::AlreadyInstalled);
        }
        // Kept for the life of the process, as every installed limiter is.
        let kept: &'static RateLimiter = Box::leak(Box::new(self));
        kept.keep_forever();
        named.push((name.into(), kept));
        Ok(())
    }

    /// The limiter installed under `name`, if any.
    pub fn named(name: &str) -> Option<RateLimiter> {
        let named = NAMED.read().unwrap_or_else(PoisonError::into_inner);
        named
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, l)| (*l).clone())
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
        GLOBAL.set(self).map_err(|_| Error::AlreadyInstalled)?;
        if let Some(global) = GLOBAL.get() {
            global.keep_forever();
        }
        Ok(())
    }

    /// The global limiter: the installed one, else the in-memory default
    /// (which from then on stays the global limiter).
    pub fn global() -> &'static RateLimiter {
        if let Some(global) = GLOBAL.get() {
            return global;
        }
        let global = GLOBAL.get_or_init(RateLimiter::in_memory);
        global.keep_forever();
        global
    }

    /// Marks an installed limiter's store as living as long as the process
    /// (see [`Shared::forever`]).
    fn keep_forever(&'static self) {
        let _ = self.inner.forever.set(&self.inner.store);
    }

    /// What a lease holds to reach this limiter's store.
    fn holder(&self) -> Holder {
        match self.inner.forever.get() {
            Some(store) => Holder::Forever(store),
            None => Holder::Counted(Arc::clone(&self.inner)),
        }
    }

    /// The name of the backend: `"memory"`, `"redis"` or `"custom"`.
    pub fn backend_name(&self) -> &'static str {
        match &self.inner.store {
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
    /// [`Error::Backend`] if the backend failed and the limiter's policy is
    /// [`OnError::Deny`] (with `Local`, the default, the same rule is checked
    /// in process memory instead; with `Allow`, the call is allowed), and
    /// [`Error::PermitRequired`] for a `concurrency` rule.
    pub fn check<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a {
        self.check_cost(rule, key, 1)
    }

    /// Checks and consumes `cost` units of `key`'s budget under `rule`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCost`] if `cost` is 0 or over the rule's capacity (such
    /// a call could never pass), and as [`check`](RateLimiter::check).
    pub fn check_cost<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a {
        // Not an `async fn`: in process memory the answer is ready at once,
        // and no state machine is built around it.
        Deciding(if rule.algorithm() == Algorithm::Concurrency {
            crate::__private::ReadyOr::Ready(Some(Err(Error::PermitRequired)))
        } else {
            self.acquire_with(rule, key, cost, self.on_error)
        })
    }

    /// Checks and consumes `cost` units of `key`'s budget under `rule`, for
    /// the length of a call: the returned [`Permit`] holds them for a
    /// `concurrency` rule until it is dropped or
    /// [released](Permit::release) (for the other algorithms it holds nothing).
    ///
    /// The permit of an installed limiter (global or named, as the
    /// attribute's are) reaches the store by a plain reference; one that is
    /// not installed keeps the store alive with a counted reference, which
    /// threads taking leases at once all write to (two threads taking
    /// in-memory leases ran about a third slower with it).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{RateLimiter, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const EXPORTS: Rule = Rule::concurrency(1, Duration::from_secs(60));
    /// let limiter = RateLimiter::in_memory();
    /// let first = limiter.acquire(&EXPORTS, "exports", 1).await?;
    /// assert!(first.decision().allowed);
    /// assert!(!limiter.acquire(&EXPORTS, "exports", 1).await?.decision().allowed);
    /// drop(first); // the call ended: its lease is released
    /// assert!(limiter.acquire(&EXPORTS, "exports", 1).await?.decision().allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check_cost`](RateLimiter::check_cost), and [`Error::Unsupported`]
    /// from a custom backend without concurrency support.
    pub fn acquire<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + 'a {
        self.acquire_with(rule, key, cost, self.on_error)
    }

    /// [`acquire`](RateLimiter::acquire) under the failure policy `on_error`.
    ///
    /// In process memory the answer is ready at once, in a future of a few
    /// bytes; a backend's call (Redis, custom) is boxed, so its large future
    /// does not weigh on the in-memory path (every move of a future copies it).
    pub(crate) fn acquire_with<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        on_error: OnError,
    ) -> Acquiring<'a> {
        self.acquire_pinned_with(rule, key, cost, on_error, None)
    }

    /// [`acquire_with`](RateLimiter::acquire_with) for a caller whose key is
    /// always the same (see [`acquire_at_once`](RateLimiter::acquire_at_once)).
    pub(crate) fn acquire_pinned_with<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        on_error: OnError,
        pin: Option<&PinCache>,
    ) -> Acquiring<'a> {
        match self.acquire_at_once(rule, key, cost, pin) {
            Some(answer) => crate::__private::ReadyOr::Ready(Some(answer)),
            None => crate::__private::ReadyOr::Pending(Box::pin(
                self.acquire_from_backend(rule, key, cost, on_error),
            )),
        }
    }

    /// [`acquire`](RateLimiter::acquire) when the answer needs no waiting:
    /// an invalid cost, or a limiter in process memory. `None`: ask the
    /// backend ([`acquire_from_backend`](RateLimiter::acquire_from_backend)).
    ///
    /// `pin`: for a caller whose key is always the same (a call site's fixed
    /// key, a middleware's global one), which keeps the key pinned
    /// ([`Pinned`]) in process memory from its first call on.
    pub(crate) fn acquire_at_once(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        pin: Option<&PinCache>,
    ) -> Option<Result<Permit, Error>> {
        if let Err(error) = validate_cost(rule, cost) {
            return Some(Err(error));
        }
        let Store::Memory(memory) = &self.inner.store else {
            return None;
        };
        let pinned = pin.and_then(|pin| pinned_in(memory, pin, key));
        let (decision, id) = match (rule.algorithm() == Algorithm::Concurrency, pinned) {
            (true, pinned) => {
                let id = next_lease_id();
                let decision = match pinned {
                    Some(pinned) => memory.acquire_pinned(pinned, rule, cost, id),
                    None => memory.acquire_now(rule, key, cost, id),
                };
                (decision, id)
            }
            (false, Some(pinned)) => (memory.check_pinned(pinned, rule, cost), 0),
            (false, None) => (memory.check_now(rule, key, cost), 0),
        };
        Some(Ok(self.permit(rule, key, cost, id, decision, false)))
    }

    /// The permit for a decision (with a lease for an allowed concurrency call).
    fn permit(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        id: u64,
        decision: Decision,
        local: bool,
    ) -> Permit {
        let lease = (rule.algorithm() == Algorithm::Concurrency && decision.allowed).then(|| {
            Box::new(Lease {
                store: self.holder(),
                rule: *rule,
                key: key.into(),
                cost,
                id,
                held_by_insurance: local,
                released: false,
            })
        });
        Permit {
            decision,
            lease,
            local,
            unchecked: false,
        }
    }

    pub(crate) async fn acquire_from_backend(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        on_error: OnError,
    ) -> Result<Permit, Error> {
        #[cfg(not(feature = "redis"))]
        let _ = on_error; // only the Redis backend fails over
        let concurrency = rule.algorithm() == Algorithm::Concurrency;
        let id = if concurrency { next_lease_id() } else { 0 };
        let (decision, held_by_insurance) = match &self.inner.store {
            Store::Memory(memory) => (memory.check_now(rule, key, cost), false),
            #[cfg(feature = "redis")]
            Store::Redis {
                redis,
                insurance,
                breaker,
                over_limit,
            } => {
                let cache = over_limit.as_ref().filter(|_| !concurrency);
                if let Some(decision) = cache.and_then(|c| c.refused(key, cost)) {
                    return Ok(Permit {
                        decision,
                        lease: None,
                        local: false,
                        unchecked: false,
                    });
                }
                // The cache, with the time the request left (read only for it).
                let remembering = cache.map(|cache| (cache, std::time::Instant::now()));
                let answer = if !breaker.allow() {
                    Err(Error::backend(CircuitOpen))
                } else if concurrency {
                    Backend::acquire(redis, rule, key, cost, id).await
                } else {
                    Backend::check(redis, rule, key, cost).await
                };
                match answer {
                    Ok(decision) => {
                        breaker.succeeded();
                        if let Some((cache, sent)) = remembering {
                            cache.remember(key, cost, &decision, sent);
                        }
                        (decision, false)
                    }
                    Err(error) => {
                        if !matches!(&error, Error::Backend(e) if e.is::<CircuitOpen>()) {
                            breaker.failed(&error, on_error);
                        }
                        match on_error {
                            OnError::Local if concurrency => {
                                (insurance.acquire_now(rule, key, cost, id), true)
                            }
                            OnError::Local => (insurance.check_now(rule, key, cost), true),
                            OnError::Allow => return Ok(Permit::allowed_unchecked(rule)),
                            OnError::Deny => return Err(error),
                        }
                    }
                }
            }
            Store::Custom(backend) if concurrency => {
                (backend.acquire(rule, key, cost, id).await?, false)
            }
            Store::Custom(backend) => (backend.check(rule, key, cost).await?, false),
        };
        Ok(self.permit(rule, key, cost, id, decision, held_by_insurance))
    }
}

/// A call site's pinned key: the number of the store it was pinned in, and
/// its state there (`None`: that store was at its cap of keys).
pub(crate) type PinCache = std::sync::OnceLock<(u64, Option<Arc<Pinned>>)>;

/// The state of the key that `pin` keeps, if it was pinned in `memory`;
/// pinned at the key's first call, once. A call site checked through
/// another store (an app's own limiter besides the global one), or whose
/// store was full then, goes through the store's shards.
fn pinned_in<'p>(memory: &MemoryBackend, pin: &'p PinCache, key: &str) -> Option<&'p Pinned> {
    let (store, pinned) = pin.get_or_init(|| (memory.id(), memory.pin(key)));
    if *store == memory.id() {
        pinned.as_deref()
    } else {
        None
    }
}

fn validate_cost(rule: &Rule, cost: u64) -> Result<(), Error> {
    if cost == 0 || cost > rule.capacity() {
        return Err(Error::InvalidCost {
            cost,
            capacity: rule.capacity(),
        });
    }
    Ok(())
}

/// A lease id no other lease of this process, or (with 64 random bits)
/// of any other process, uses.
///
/// Each thread counts through its own block of numbers, taken from the
/// shared counter once per [`LEASE_BLOCK`] leases: a shared counter bumped
/// per lease is a write to one cache line from every thread, which with two
/// threads taking leases cost more than the rest of the lease.
fn next_lease_id() -> u64 {
    static SEED: OnceCell<RandomState> = OnceCell::new();
    static BLOCKS: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        /// The thread's next number and the end of its block.
        static NEXT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    let n = NEXT.with(|next| {
        let (mut n, mut end) = next.get();
        if n == end {
            n = BLOCKS.fetch_add(LEASE_BLOCK, AtomicOrdering::Relaxed);
            end = n + LEASE_BLOCK;
        }
        next.set((n + 1, end));
        n
    });
    SEED.get_or_init(RandomState::new).hash_one(n)
}

/// How many lease numbers a thread takes at once (see [`next_lease_id`]).
const LEASE_BLOCK: u64 = 1 << 16;

/// The future of [`RateLimiter::acquire_with`]: ready, or a backend's call.
pub(crate) type Acquiring<'a> = crate::__private::ReadyOr<'a, Result<Permit, Error>>;

/// [`RateLimiter::check_cost`]'s future: the permit's decision.
struct Deciding<'a>(Acquiring<'a>);

impl Future for Deciding<'_> {
    type Output = Result<Decision, Error>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|answer| answer.map(|permit| permit.decision))
    }
}

/// What [`RateLimiter::acquire`] answers: the decision, and for an allowed
/// call of a `concurrency` rule, the lease it holds.
///
/// Dropping the permit releases the lease: at once in process memory, and
/// from a task spawned on the current Tokio runtime where Redis or a custom
/// backend holds it (without a runtime the lease is left to expire after the
/// rule's period). So a call that ends by error, panic or cancellation gives
/// its units back too. [`release`](Permit::release) does it now and
/// reports failures.
#[derive(Debug)]
#[must_use = "dropping the permit releases its lease at once"]
pub struct Permit {
    decision: Decision,
    /// Boxed: only concurrency rules have one, and a small permit is cheap
    /// to move through the layers of a call.
    lease: Option<Box<Lease>>,
    /// Answered by the in-process insurance limiter (the backend failed).
    pub(crate) local: bool,
    /// Not checked at all: the backend failed under the `allow` policy.
    pub(crate) unchecked: bool,
}

impl Permit {
    /// An allowed call the backend could not check (policy `allow`).
    pub(crate) fn allowed_unchecked(rule: &Rule) -> Permit {
        Permit {
            decision: Decision {
                allowed: true,
                limit: rule.count(),
                remaining: rule.count(),
                reset_after: std::time::Duration::ZERO,
                retry_after: std::time::Duration::ZERO,
            },
            lease: None,
            local: false,
            unchecked: true,
        }
    }

    /// The decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Releases the lease now (if any) and waits until it is released.
    ///
    /// # Errors
    ///
    /// The backend's, if it failed; the lease then expires after the rule's period.
    pub async fn release(mut self) -> Result<(), Error> {
        match self.lease.take() {
            Some(mut lease) => {
                lease.released = true;
                lease.store.release(&lease).await
            }
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct Lease {
    /// The store alone (not the limiter, whose clone counts two references).
    store: Holder,
    rule: Rule,
    key: Box<str>,
    cost: u64,
    id: u64,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    held_by_insurance: bool,
    released: bool,
}

/// A lease's way to its store: a plain reference when the limiter is
/// installed (it lives as long as the process), else a counted one.
#[derive(Clone, Debug)]
enum Holder {
    Forever(&'static Store),
    Counted(Arc<Shared>),
}

impl std::ops::Deref for Holder {
    type Target = Store;

    fn deref(&self) -> &Store {
        match self {
            Holder::Forever(store) => store,
            Holder::Counted(shared) => &shared.store,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        // Held by the backend (Redis, custom): released from a task (without
        // a runtime, it expires after the rule's period).
        if !self.store.release_in_process(self)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let lease = Lease {
                store: self.store.clone(),
                key: std::mem::take(&mut self.key),
                released: true,
                ..*self
            };
            runtime.spawn(async move {
                if let Err(error) = lease.store.release(&lease).await {
                    tracing::debug!(%error, "could not release a concurrency lease; it will expire");
                }
            });
        }
    }
}

/// Builds a [`RateLimiter`]: pick a backend, then [`build`](RateLimiterBuilder::build).
///
/// The default backend is in process memory.
#[derive(Debug, Default)]
pub struct RateLimiterBuilder {
    backend: BackendChoice,
    on_error: OnError,
    shadow: bool,
    max_keys: Option<usize>,
    #[cfg(feature = "actix")]
    http: crate::actix::HttpOptions,
    clock: Option<Box<dyn Clock>>,
    #[cfg(feature = "redis")]
    timeout: Option<Duration>,
    #[cfg(feature = "redis")]
    connect_timeout: Option<Duration>,
    #[cfg(feature = "redis")]
    probe_interval: Option<Duration>,
    #[cfg(feature = "redis")]
    start_degraded: bool,
    #[cfg(feature = "redis")]
    over_limit_cache: bool,
    #[cfg(feature = "redis")]
    per_check_calls: bool,
    #[cfg(feature = "redis")]
    no_functions: bool,
}

#[derive(Debug, Default)]
enum BackendChoice {
    #[default]
    Memory,
    #[cfg(feature = "redis")]
    Redis(String),
    #[cfg(feature = "redis")]
    RedisCluster(Vec<String>),
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

    /// What to do with a call when the backend fails or does not answer in
    /// time: [`OnError::Local`] (the default) checks the same rule in process
    /// memory until it answers again, [`OnError::Allow`] lets calls through,
    /// [`OnError::Deny`] refuses them. A rule's `on_error` overrides it.
    pub fn on_backend_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// How to tell clients apart behind proxies, and what limited HTTP
    /// responses carry (feature `actix`).
    #[cfg(feature = "actix")]
    pub fn http(mut self, options: crate::actix::HttpOptions) -> Self {
        self.http = options;
        self
    }

    /// Keep budgets in a Redis Cluster, reached through any of these nodes
    /// (`redis://host:port`): every check runs on the one slot of its key.
    #[cfg(feature = "redis")]
    pub fn redis_cluster<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.backend = BackendChoice::RedisCluster(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// After Redis fails, how often one call probes it while the others are
    /// answered by the failure policy without waiting for it (default 250 ms).
    #[cfg(feature = "redis")]
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
    #[cfg(feature = "redis")]
    pub fn over_limit_cache(mut self, enabled: bool) -> Self {
        self.over_limit_cache = enabled;
        self
    }

    /// At most about `max_keys` keys in process memory (the in-memory store,
    /// or the insurance limiter used while Redis fails); see
    /// [`MemoryBackend::with_max_keys`] for what happens when it is reached.
    /// Default: no cap (expired keys are still reclaimed).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// Shadow mode for every rule on this limiter: calls are checked and
    /// counted but never refused (for rolling out new limits safely).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
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

    /// How long one check may wait for Redis (default 50 ms); a check that
    /// takes longer is answered by the failure policy.
    #[cfg(feature = "redis")]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Coalesce the checks that wait for one Redis server at the same moment
    /// into one script call (default `true`): each check stays atomic and
    /// keeps one round trip, the server runs many per call. `false` sends
    /// every check as its own `EVALSHA`. A cluster always does that.
    #[cfg(feature = "redis")]
    pub fn coalesce(mut self, coalesce: bool) -> Self {
        self.per_check_calls = !coalesce;
        self
    }

    /// Load the batch script that coalesced checks use as a Redis function
    /// library, called with `FCALL` (default `true`): the server skips the
    /// script's setup at every call, about 2 µs of its time. Where the
    /// server has no functions (before Redis 7) or the user may not load
    /// them, batches go by `EVALSHA` either way. The library
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

    #[cfg(feature = "redis")]
    fn redis_store(&self, redis: RedisBackend, clock: Option<Box<dyn Clock>>) -> Store {
        Store::Redis {
            redis,
            insurance: self.memory(clock),
            breaker: Breaker::new(
                self.probe_interval.unwrap_or(Duration::from_millis(250)),
                false,
            ),
            over_limit: self.over_limit_cache.then(OverLimitCache::new),
        }
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
    /// [`Error::Config`] for a malformed Redis URL, [`Error::Backend`] if
    /// Redis cannot be reached (or the scripts loaded) within the connect
    /// timeout.
    pub async fn build(mut self) -> Result<RateLimiter, Error> {
        let clock = self.clock.take();
        let backend = std::mem::take(&mut self.backend);
        let store = match backend {
            BackendChoice::Memory => Store::Memory(self.memory(clock)),
            #[cfg(feature = "redis")]
            BackendChoice::Redis(url) => {
                let redis = RedisBackend::open(&url, self.connect_options()).await?;
                self.redis_store(redis, clock)
            }
            #[cfg(feature = "redis")]
            BackendChoice::RedisCluster(nodes) => {
                let redis = RedisBackend::open_cluster(&nodes, self.connect_options()).await?;
                self.redis_store(redis, clock)
            }
            BackendChoice::Custom(backend) => Store::Custom(backend),
        };
        Ok(RateLimiter {
            on_error: self.on_error,
            shadow: self.shadow,
            #[cfg(feature = "actix")]
            http: Arc::new(self.http),
            ..RateLimiter::from_store(store)
        })
    }
}

type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// [`Backend`] made object-safe, for custom backends (the built-in ones are
/// called without boxing).
trait DynBackend: Send + Sync + fmt::Debug + 'static {
    fn check<'a>(&'a self, rule: &'a Rule, key: &'a str, cost: u64) -> CheckFuture<'a>;
    fn acquire<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        lease: u64,
    ) -> CheckFuture<'a>;
    fn release<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        lease: u64,
    ) -> ReleaseFuture<'a>;
}

type ReleaseFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

impl<B: Backend> DynBackend for B {
    fn check<'a>(&'a self, rule: &'a Rule, key: &'a str, cost: u64) -> CheckFuture<'a> {
        Box::pin(Backend::check(self, rule, key, cost))
    }

    fn acquire<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        lease: u64,
    ) -> CheckFuture<'a> {
        Box::pin(Backend::acquire(self, rule, key, cost, lease))
    }

    fn release<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        lease: u64,
    ) -> ReleaseFuture<'a> {
        Box::pin(Backend::release(self, rule, key, cost, lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A custom backend with concurrency support: the units each lease
    /// holds, in a map.
    #[derive(Debug)]
    struct Leases(Arc<Mutex<HashMap<u64, u64>>>);

    impl Backend for Leases {
        async fn check(&self, _rule: &Rule, _key: &str, _cost: u64) -> Result<Decision, Error> {
            Err(Error::Unsupported("checks"))
        }

        async fn acquire(
            &self,
            rule: &Rule,
            _key: &str,
            cost: u64,
            lease: u64,
        ) -> Result<Decision, Error> {
            let mut held = self.0.lock().unwrap();
            let used: u64 = held.values().sum();
            let allowed = used + cost <= rule.count();
            if allowed {
                held.insert(lease, cost);
            }
            Ok(Decision {
                allowed,
                limit: rule.count(),
                remaining: rule.count() - used - if allowed { cost } else { 0 },
                reset_after: Duration::ZERO,
                retry_after: Duration::ZERO,
            })
        }

        async fn release(
            &self,
            _rule: &Rule,
            _key: &str,
            _cost: u64,
            lease: u64,
        ) -> Result<(), Error> {
            self.0.lock().unwrap().remove(&lease);
            Ok(())
        }
    }

    /// A dropped permit gives a custom backend's lease back from a task on
    /// the current runtime, with or without the `redis` feature; released
    /// explicitly, at once; dropped where no runtime runs, it is left held
    /// (to expire), and nothing panics.
    #[test]
    fn a_custom_backends_lease_is_released_when_its_permit_drops() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let held = Arc::new(Mutex::new(HashMap::new()));
        let limiter = runtime
            .block_on(RateLimiter::builder().backend(Leases(held.clone())).build())
            .unwrap();
        let rule = Rule::concurrency(2, Duration::from_secs(60));
        let units =
            |held: &Arc<Mutex<HashMap<u64, u64>>>| held.lock().unwrap().values().sum::<u64>();
        runtime.block_on(async {
            let first = limiter.acquire(&rule, "k", 1).await.unwrap();
            let second = limiter.acquire(&rule, "k", 1).await.unwrap();
            assert!(first.decision().allowed && second.decision().allowed);
            assert!(
                !limiter
                    .acquire(&rule, "k", 1)
                    .await
                    .unwrap()
                    .decision()
                    .allowed
            );
            assert_eq!(units(&held), 2);

            second.release().await.unwrap();
            assert_eq!(units(&held), 1, "released at once");

            drop(first);
            for _ in 0..100 {
                if units(&held) == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(units(&held), 0, "released by the dropped permit's task");
        });

        let outside = runtime.block_on(limiter.acquire(&rule, "k", 2)).unwrap();
        assert!(outside.decision().allowed);
        drop(outside);
        assert_eq!(units(&held), 2, "no runtime: left to expire");
    }

    /// An installed limiter lives as long as the process, so its leases hold
    /// a plain reference to its store, not a counted one (counting is a
    /// write to a line every thread taking leases shares); a limiter that is
    /// not installed counts one per lease. Either way a dropped permit gives
    /// its lease back.
    #[test]
    fn leases_of_an_installed_limiter_count_no_reference() {
        fn now<F: Future>(future: F) -> F::Output {
            let mut future = std::pin::pin!(future);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match future.as_mut().poll(&mut cx) {
                std::task::Poll::Ready(output) => output,
                std::task::Poll::Pending => panic!("an in-memory answer waits for nothing"),
            }
        }
        let rule = Rule::concurrency(1, Duration::from_secs(60));
        RateLimiter::in_memory()
            .install_as("leases-count-no-reference")
            .unwrap();
        let installed = RateLimiter::named("leases-count-no-reference").unwrap();
        let local = RateLimiter::in_memory();
        for (limiter, counted) in [(&installed, 0), (&local, 1)] {
            let references = Arc::strong_count(&limiter.inner);
            let permit = now(limiter.acquire(&rule, "k", 1)).unwrap();
            assert!(permit.decision().allowed);
            assert_eq!(Arc::strong_count(&limiter.inner), references + counted);
            assert!(
                !now(limiter.acquire(&rule, "k", 1))
                    .unwrap()
                    .decision()
                    .allowed
            );
            drop(permit);
            assert_eq!(Arc::strong_count(&limiter.inner), references);
            let again = now(limiter.acquire(&rule, "k", 1)).unwrap();
            assert!(
                again.decision().allowed,
                "the dropped permit gave its lease back"
            );
        }
    }

    /// Threads count through blocks of their own; no two leases share an id,
    /// across threads and across a thread's blocks.
    #[test]
    fn lease_ids_are_unique_across_threads_and_blocks() {
        let per_thread = LEASE_BLOCK as usize + 1_000;
        let ids: Vec<u64> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| s.spawn(|| (0..per_thread).map(|_| next_lease_id()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let distinct: std::collections::HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), 3 * per_thread);
    }
}
