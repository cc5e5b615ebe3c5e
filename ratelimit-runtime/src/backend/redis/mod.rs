//! Redis and Redis Cluster: every check is one call of a Lua function
//! library (`FCALL`, or `EVALSHA` of a script where the server has no
//! functions) on one multiplexed connection (or one cluster connection)
//! shared by all tasks. Checks that wait at the same moment are coalesced
//! into one call (see [`ConnectOptions::coalesce`]); on a cluster, one call
//! per master.

mod batch;
mod codec;
mod connection;
mod fleet;
mod give_back;
#[cfg(feature = "testing")]
pub(crate) mod hooks;
mod nodes;
mod scripts;
mod settle;
mod stacked;
mod target;
mod tls;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{self, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redis::cluster::ClusterClient;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Backend;
use super::hook::{Answered, BackendCall, Reserved, RoundTrip, Sealed, Ticket};
use crate::algorithm::{self, spec};
use crate::decision::{Charge, Decision};
use crate::error::Error;
use crate::rule::{Rule, SubjectLimit};
pub use crate::secret::redact_url;
use batch::{AnswerRx, Batching, Job, Unit, answered, send_batch};
use codec::{Call, Op, Ran, TimeSource};
use connection::{Busy, Conn, Endpoint};
use scripts::Scripts;
pub use target::RedisTarget;

/// How long one check may wait for Redis before it counts as failed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// How long connecting (and loading the scripts) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Budgets kept in Redis or Redis Cluster, shared by every instance of the
/// application.
///
/// The Lua in `lua/`, assembled from the algorithm registry: each check
/// touches exactly one key and uses the Redis server's clock (`TIME`, in
/// µs); every write sets a TTL no longer than the state matters. The scripts
/// are loaded (as a function library where the server allows it) on every
/// master when connecting, and again when a node lost them (a restart, a
/// failover, `SCRIPT FLUSH` or `FUNCTION FLUSH`).
/// Cheap to clone: clones share the connection, which reconnects in the
/// background after a failure. Every call has a deadline.
///
/// Checks are coalesced: while a script call is on its way, the checks that
/// arrive meanwhile wait in a queue and go together in the next call, one
/// call of a batch script (`FCALL` of it as a function library where the
/// server allows it, else `EVALSHA`) that runs each check in turn on its own
/// key (each as atomic as alone; they share the server's clock reading). On
/// a cluster the next call is one per master, each carrying the checks of
/// the slots that master serves (with the function library only). A check
/// that finds nothing on its way goes at once, alone, so nothing waits when
/// Redis keeps up; under load one round trip and one script call carry many
/// checks.
#[derive(Clone)]
pub struct RedisBackend {
    conn: Arc<Conn>,
    scripts: Arc<Scripts>,
    timeout: Duration,
    /// The task that sends coalesced checks, and its queue (single server).
    batching: Option<Batching>,
    /// Script calls on their way (checks sent alone, and batches).
    busy: Arc<AtomicUsize>,
    /// Queue every check, even when nothing is on its way (tests).
    always_queue: bool,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("redis", &self.conn.endpoint.describe())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// How a [`RedisBackend`] connects.
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// The deadline of every check.
    pub timeout: Duration,
    /// How long connecting (and loading the scripts) may take.
    pub connect_timeout: Duration,
    /// Start even if Redis cannot be reached; connect on first use.
    pub lazy: bool,
    /// Coalesce checks that wait at the same moment into one script call
    /// (on a cluster, one per master: a call of the library's function that
    /// may touch keys of several slots, so Redis 7 or later). On by
    /// default.
    pub coalesce: bool,
    /// Load the scripts as a function library (Redis 7 and later; on a
    /// cluster, on every master): batches, and checks and releases that go
    /// alone, are then `FCALL`s of it, which cost the server several µs less
    /// a call than `EVALSHA` of a script that defines its helpers at every
    /// call. On by default; where the server has no functions, or the user
    /// may not load them, calls go by `EVALSHA`. A call whose `FCALL` is
    /// refused (an ACL changed, the library lost to `FUNCTION FLUSH`) goes
    /// again by `EVALSHA`, and so do the calls after it until the library,
    /// tried again in the background, answers. The library
    /// (`ratelimit_<version>`) stays in Redis like any function: `FUNCTION
    /// DELETE` removes it.
    pub functions: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            coalesce: true,
            functions: true,
        }
    }
}

impl RedisBackend {
    /// Connects to `target` (a URL, a list of cluster nodes' URLs,
    /// [`RedisTarget::sentinel`], or a client or connection of your own:
    /// see [`RedisTarget`]) and loads the scripts.
    ///
    /// ```no_run
    /// use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
    /// # async fn start() -> Result<(), ratelimit_runtime::Error> {
    /// let redis = RedisBackend::connect("redis://127.0.0.1:6379", ConnectOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a malformed URL (its password left out of the
    /// message) or refused credentials; [`Error::Backend`] if Redis cannot
    /// be reached (or the scripts loaded) within the connect timeout, unless
    /// `lazy`.
    pub async fn connect(
        target: impl Into<RedisTarget>,
        options: ConnectOptions,
    ) -> Result<RedisBackend, Error> {
        let endpoint = target.into().endpoint(&options)?;
        RedisBackend::start(endpoint, options).await
    }

    async fn start(endpoint: Endpoint, options: ConnectOptions) -> Result<RedisBackend, Error> {
        let coalesce = options.coalesce;
        let mut backend = RedisBackend {
            conn: Arc::new(Conn {
                endpoint,
                live: std::sync::RwLock::new(None),
                connecting: tokio::sync::Mutex::new(()),
                finishing: AtomicBool::new(false),
                timeout: options.timeout,
                connect_timeout: options.connect_timeout,
                try_functions: options.functions,
                functions: AtomicBool::new(false),
                functions_retry: (
                    AtomicU64::new(0),
                    AtomicU64::new(connection::FIRST_FUNCTIONS_RETRY_MS),
                ),
                restoring: AtomicBool::new(false),
                given_back: std::sync::OnceLock::new(),
                slots: std::sync::RwLock::new(None),
                origin: Instant::now(),
                server_offset: std::sync::atomic::AtomicI64::new(i64::MIN),
            }),
            scripts: Arc::new(Scripts::new()),
            timeout: options.timeout,
            batching: None,
            busy: Arc::new(AtomicUsize::new(0)),
            always_queue: false,
        };
        if coalesce {
            let (queue, jobs) = mpsc::unbounded_channel();
            let batching = Batching {
                queue,
                jobs: Arc::new(tokio::sync::Mutex::new(jobs)),
                running: Arc::new(AtomicBool::new(false)),
                home: Arc::default(),
            };
            batching.ensure_running(&backend);
            backend.batching = Some(batching);
        }
        match backend.conn.get(&backend.scripts).await {
            Ok(_) => Ok(backend),
            // Refused credentials are a configuration to fix, never a
            // Redis that looks down; a degraded start does not wait for it.
            Err(Error::Backend(error))
                if error
                    .downcast_ref::<connection::ConnectError>()
                    .is_some_and(|e| e.refused) =>
            {
                Err(Error::Config(error.to_string()))
            }
            Err(error @ Error::Backend(_)) if options.lazy => {
                tracing::warn!(%error, "Redis cannot be reached; starting degraded, will connect on use");
                Ok(backend)
            }
            Err(error) => Err(error),
        }
    }

    /// Runs one call: queued for the next batch when one is on its way,
    /// else sent at once as a batch of one (one round trip; two after the
    /// server lost the script or library).
    ///
    /// A call sent alone runs in a future of its own. A caller that goes
    /// away meanwhile (its future dropped: an outer timeout, a client that
    /// left) leaves that future to finish in a task, so what Redis allowed
    /// it is given back when the answer comes, as for a call of a batch.
    async fn run(&self, key: &str, call: Call) -> Result<Ran, Error> {
        let deadline = Instant::now() + self.timeout;
        let job = Job::new(key, call, deadline);
        if let Some(batching) = self.queue_for_now() {
            return self.queued(batching, job).await;
        }
        let (job, answer) = job;
        let busy = Busy::enter(Arc::clone(&self.busy));
        let (conn, scripts, timeout) = (
            Arc::clone(&self.conn),
            Arc::clone(&self.scripts),
            self.timeout,
        );
        // Boxed: a batch's call is a large future, and inline it would make
        // every check's future (each moved into its box) as large.
        let mut sending = Unfinished(Some(Box::pin(async move {
            let _busy = busy;
            send_batch(vec![job], &conn, &scripts, timeout).await;
        })));
        if let Some(send) = &mut sending.0 {
            send.await;
        }
        sending.0 = None;
        answered(answer).await
    }

    /// A check (or a lease taken, with `lease`) on `clock`, and the stamp of
    /// what an allowed check (not a lease) charged.
    async fn eval(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        clock: TimeSource,
        lease: Option<u64>,
    ) -> Result<(Decision, Option<u64>), Error> {
        let call = Call::new(Op::Check(rule.algorithm()), rule, cost, clock, lease);
        let (outcome, now) = self.run(key, call).await?;
        let stamp = now
            .filter(|_| outcome.allowed && lease.is_none())
            .map(|now| algorithm::stamp(rule.algorithm(), rule.period_us(), now, &outcome));
        Ok((outcome.decision(rule), stamp))
    }

    /// A peek, refund (`id`: the stamp of the charge) or reset on `clock`.
    async fn look(
        &self,
        op: Op,
        rule: &Rule,
        key: &str,
        units: u64,
        clock: TimeSource,
        id: Option<u64>,
    ) -> Result<Decision, Error> {
        if matches!(op, Op::Refund(_)) && spec(rule.algorithm()).refund.is_none() {
            return Err(Error::Unsupported("refunds under a concurrency rule"));
        }
        let call = Call::new(op, rule, units, clock, id);
        Ok(self.run(key, call).await?.0.decision(rule))
    }

    /// A reservation for a caller that may wait up to `max_wait` (µs) on
    /// `clock`: its answer read, and the server's time it was made at.
    async fn reserve_on(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: u64,
        clock: TimeSource,
    ) -> Result<(algorithm::Reservation, Option<u64>), Error> {
        if spec(rule.algorithm()).wait.is_none() {
            return Err(Error::Unsupported(super::memory::UNWAITABLE));
        }
        let max_wait = max_wait.min(algorithm::wait_cap(rule));
        let call = Call::new(
            Op::Reserve(rule.algorithm()),
            rule,
            cost,
            clock,
            Some(max_wait),
        );
        let (outcome, now) = self.run(key, call).await?;
        Ok((algorithm::Reservation::read(outcome), now))
    }

    /// Gives back on `clock` a reservation that waits, made at `at` and
    /// answered `position`; then answers as a peek.
    async fn cancel_on(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        (at, position): (u64, u64),
        clock: TimeSource,
    ) -> Result<Decision, Error> {
        let mut call = Call::new(Op::Cancel(rule.algorithm()), rule, cost, clock, Some(at));
        call.position = Some(position);
        Ok(self.run(key, call).await?.0.decision(rule))
    }

    /// Gives back `charge` on `clock` (a charge with no stamp, of no
    /// built-in backend, gives nothing back: a peek).
    async fn refund_on(
        &self,
        rule: &Rule,
        key: &str,
        charge: &Charge,
        clock: TimeSource,
    ) -> Result<Decision, Error> {
        let op = match charge.stamp() {
            Some(_) => Op::Refund(rule.algorithm()),
            None if spec(rule.algorithm()).refund.is_none() => Op::Refund(rule.algorithm()),
            None => Op::Peek(rule.algorithm()),
        };
        self.look(op, rule, key, charge.units(), clock, charge.stamp())
            .await
    }

    /// Tells `given_back` each key whose units were given back for a caller
    /// that had stopped waiting (set once; the limiter's over-limit cache).
    pub(crate) fn on_give_back(&self, given_back: connection::GivenBack) {
        let _ = self.conn.given_back.set(given_back);
    }

    /// The batching, if this call should join the next batch: when
    /// coalescing and a script call is already on its way.
    fn queue_for_now(&self) -> Option<&Batching> {
        let batching = self.batching.as_ref()?;
        if self.always_queue || self.busy.load(Ordering::Relaxed) > 0 {
            Some(batching)
        } else {
            None
        }
    }

    /// Queues a check (or release) for the next batch and waits for its
    /// answer, within the deadline.
    async fn queued(
        &self,
        batching: &Batching,
        (job, answer): (Job, AnswerRx),
    ) -> Result<Ran, Error> {
        self.enqueue(batching, Unit::One(job))?;
        if batching.home.answers_here() {
            return answered(answer).await;
        }
        // The task runs on a current-thread runtime that is not this one,
        // and runs only while that runtime is driven (a limiter built on one
        // and used elsewhere): this check keeps a timer of its own.
        within(self.timeout, answered(answer)).await
    }

    /// Puts `unit` in the queue of the next batch, the task that sends them
    /// started if it is not running.
    fn enqueue(&self, batching: &Batching, unit: Unit) -> Result<(), Error> {
        if !batching.ensure_running(self) || batching.queue.send(unit).is_err() {
            return Err(Error::backend(Stopped));
        }
        // The task may have ended as the job went in (its runtime ended):
        // then the job was dropped with the queue's rest (its caller hears
        // `Stopped`), or it waits for the task started here. Pairs with the
        // fence in `Running::drop`.
        atomic::fence(Ordering::SeqCst);
        if !batching.ensure_running(self) {
            return Err(Error::backend(Stopped));
        }
        Ok(())
    }
}

/// A lone call's future, until it has finished: dropped before (its caller
/// gone), it is left to finish in a task on the current runtime.
struct Unfinished(Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(send) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(send);
        }
    }
}

/// A cluster client's settings: the limiter's timeouts, and no retries: the
/// client sends a request again when its connection drops, also a script
/// call the node already ran (a check counted twice). `Live::query` sends
/// again only what a node answered it did not run.
pub(super) fn cluster_builder(
    urls: &[String],
    options: ConnectOptions,
) -> redis::cluster::ClusterClientBuilder {
    ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(options.connect_timeout)
        .response_timeout(connection::response_timeout(options.timeout))
        .retries(0)
}

impl Backend for RedisBackend {
    async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        Ok(self
            .eval(rule, key, cost, TimeSource::Server, None)
            .await?
            .0)
    }

    async fn acquire(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> Result<Decision, Error> {
        Ok(self
            .eval(rule, key, cost, TimeSource::Server, Some(lease))
            .await?
            .0)
    }

    async fn release(&self, rule: &Rule, key: &str, cost: u64, lease: u64) -> Result<(), Error> {
        let call = Call::new(Op::Release, rule, cost, TimeSource::Server, Some(lease));
        self.run(key, call).await.map(drop)
    }

    async fn peek(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        let op = Op::Peek(rule.algorithm());
        self.look(op, rule, key, 1, TimeSource::Server, None).await
    }

    async fn refund(&self, rule: &Rule, key: &str, charge: Charge) -> Result<Decision, Error> {
        self.refund_on(rule, key, &charge, TimeSource::Server).await
    }

    async fn reset(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        let op = Op::Reset(rule.algorithm());
        self.look(op, rule, key, 1, TimeSource::Server, None).await
    }

    /// `HSET` (or `DEL`) of the hash the check's script reads (the budget
    /// key and `#limit`, see the README's "Limits per subject"), on the
    /// master of the budget key's slot.
    async fn set_limit(
        &self,
        _rule: &Rule,
        key: &str,
        limit: Option<SubjectLimit>,
    ) -> Result<(), Error> {
        let Some(at) = crate::keys::limit_key(key) else {
            return Err(Error::Config(
                "a key with a `}` but no hash tag cannot have a limit of its own".into(),
            ));
        };
        // One command, so a check never sees half of a change (a burst
        // not given is the count, as the script reads it).
        let cmd = match limit {
            Some(limit) => {
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&at)
                    .arg("count")
                    .arg(limit.count)
                    .arg("burst")
                    .arg(limit.burst.unwrap_or(limit.count));
                cmd
            }
            None => {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(&at);
                cmd
            }
        };
        let set = async {
            let mut live = self.conn.get(&self.scripts).await?;
            live.query::<()>(&cmd).await.map_err(Error::backend)
        };
        within(self.timeout, set).await
    }

    async fn __answer(&self, _: Sealed, call: BackendCall<'_>) -> Result<Answered, Error> {
        let BackendCall {
            rule,
            key,
            cost,
            lease,
            ..
        } = call;
        let (decision, stamp) = self
            .eval(rule, key, cost, TimeSource::Server, lease)
            .await?;
        Ok(Answered::by_backend(decision, stamp))
    }

    async fn __reserve(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
        max_wait: Duration,
    ) -> Result<Reserved, Error> {
        let max_wait = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let (reservation, now) = self
            .reserve_on(call.rule, call.key, call.cost, max_wait, TimeSource::Server)
            .await?;
        let decision = reservation.outcome.decision(call.rule);
        let rule = call.rule;
        let stamp = now
            .filter(|_| decision.allowed && reservation.wait_us == 0)
            .map(|now| {
                algorithm::stamp(
                    rule.algorithm(),
                    rule.period_us(),
                    now,
                    &reservation.outcome,
                )
            });
        Ok(Reserved {
            answered: Answered::by_backend(decision, stamp),
            wait: Duration::from_micros(reservation.wait_us),
            ticket: now.filter(|_| reservation.wait_us > 0).map(|at| Ticket {
                at,
                position: reservation.position,
                insurance: false,
            }),
        })
    }

    async fn __cancel(
        &self,
        _: Sealed,
        rule: &Rule,
        key: &str,
        cost: u64,
        ticket: Ticket,
    ) -> Result<(), Error> {
        let reservation = (ticket.at, ticket.position);
        self.cancel_on(rule, key, cost, reservation, TimeSource::Server)
            .await
            .map(drop)
    }

    fn __round_trip(&self, _: Sealed, error: &Error) -> RoundTrip {
        round_trip(error)
    }

    fn __name(&self, _: Sealed) -> &'static str {
        "redis"
    }

    async fn check_all(&self, checks: &[super::RuleCheck<'_>]) -> Result<Vec<Decision>, Error> {
        let answers = self.check_all_charged(checks).await?;
        Ok(answers.into_iter().map(|(decision, _)| decision).collect())
    }

    async fn __answer_all(
        &self,
        _: Sealed,
        checks: &[super::RuleCheck<'_>],
        _: crate::error::OnError,
    ) -> Result<Vec<Answered>, Error> {
        let answers = self.check_all_charged(checks).await?;
        Ok(answers
            .into_iter()
            .map(|(decision, stamp)| Answered::by_backend(decision, stamp))
            .collect())
    }
}

/// `work`'s result, or [`TimedOut`] once `limit` has passed.
pub(crate) async fn within<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| Err(Error::backend(TimedOut(limit))))
}

/// A check that waited in the client's queue past its deadline: it was
/// never sent, so it says nothing of Redis itself.
#[derive(Debug)]
pub(crate) struct Expired(Duration);

impl fmt::Display for Expired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the check waited for a batch longer than its deadline ({:?}) and was not sent",
            self.0
        )
    }
}

impl std::error::Error for Expired {}

/// The errors the checks of one failed batch get (for tests elsewhere).
#[cfg(test)]
pub(crate) fn failed_batch_errors(checks: usize) -> Vec<Error> {
    let shared = batch::Shared::new(Error::backend(TimedOut(Duration::from_millis(1))));
    (0..checks)
        .map(|_| Error::backend(shared.clone()))
        .collect()
}

/// The error of a check that expired in the queue (for tests elsewhere).
#[cfg(test)]
pub(crate) fn expired_error() -> Error {
    Error::backend(Expired(Duration::from_millis(1)))
}

/// The round trip `error` failed in.
pub(crate) fn round_trip(error: &Error) -> RoundTrip {
    let Error::Backend(source) = error else {
        return RoundTrip::Other;
    };
    if let Some(shared) = source.downcast_ref::<batch::Shared>() {
        RoundTrip::Failed(shared.round_trip())
    } else if source.is::<Expired>() {
        RoundTrip::NotSent
    } else {
        RoundTrip::Other
    }
}

/// Redis did not answer within the deadline.
#[derive(Debug)]
pub(crate) struct TimedOut(Duration);

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redis did not answer within {} ms", self.0.as_millis())
    }
}

impl std::error::Error for TimedOut {}

/// The task that sends coalesced checks is gone (its Tokio runtime ended).
#[derive(Debug)]
pub(crate) struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the Redis backend's task has stopped (its Tokio runtime ended)")
    }
}

impl std::error::Error for Stopped {}
