//! Redis and Redis Cluster: every check is one Lua script run by `EVALSHA`
//! on one multiplexed connection (or one cluster connection) shared by all
//! tasks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind};
use tokio::sync::OnceCell;

use super::Backend;
use crate::algorithm::Outcome;
use crate::{Algorithm, Decision, Error, Rule};

/// How long one check may wait for Redis before it counts as failed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// How long connecting (and loading the scripts) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Budgets kept in Redis or Redis Cluster, shared by every instance of the
/// application.
///
/// One script per algorithm (in `src/scripts/`), each touching exactly one key
/// (so every check runs on one cluster slot) and using the Redis server's
/// clock (`TIME`, in µs); every write sets a TTL no longer than the state
/// matters. Scripts are loaded on every node when connecting and reloaded if
/// a node answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`).
/// Cheap to clone: clones share the connection, which reconnects in the
/// background after a failure. Every call has a deadline.
#[derive(Clone)]
pub struct RedisBackend {
    conn: Arc<Conn>,
    scripts: Arc<Scripts>,
    timeout: Duration,
}

/// Where to connect, and the connection once made.
struct Conn {
    target: Target,
    live: OnceCell<Live>,
    timeout: Duration,
    connect_timeout: Duration,
}

enum Target {
    Single(redis::Client),
    // Boxed: a cluster client is twice a plain one, and both live once per limiter.
    Cluster(Box<ClusterClient>),
}

#[derive(Clone)]
enum Live {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Live {
    async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Live::Single(conn) => cmd.query_async(conn).await,
            Live::Cluster(conn) => cmd.query_async(conn).await,
        }
    }

    async fn load(&mut self, script: &Script) -> Result<(), RedisError> {
        match self {
            Live::Single(conn) => script.load_async(conn).await.map(drop),
            Live::Cluster(conn) => script.load_async(conn).await.map(drop),
        }
    }
}

impl Conn {
    /// The connection, made now if it was not yet (one attempt, bounded by
    /// the connect timeout).
    async fn get(&self, scripts: &Scripts) -> Result<Live, Error> {
        if let Some(live) = self.live.get() {
            return Ok(live.clone());
        }
        // Boxed: connecting is rare and its future is large; inline, it would
        // make every check's future (and every move of it) kilobytes bigger.
        let connect = Box::pin(self.live.get_or_try_init(|| async {
            let mut live = match &self.target {
                Target::Single(client) => {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.connect_timeout))
                        .set_response_timeout(Some(self.timeout))
                        .set_number_of_retries(2)
                        .set_max_delay(Duration::from_secs(1));
                    Live::Single(client.get_connection_manager_with_config(config).await?)
                }
                Target::Cluster(client) => Live::Cluster(client.get_async_connection().await?),
            };
            for script in &scripts.by_algorithm {
                live.load(script).await?;
            }
            Ok::<_, RedisError>(live)
        }));
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(live)) => Ok(live.clone()),
            Ok(Err(e)) => Err(Error::backend(e)),
            Err(_) => Err(Error::backend(TimedOut(self.connect_timeout))),
        }
    }
}

struct Scripts {
    /// Indexed like [`Algorithm::ALL`].
    by_algorithm: [Script; 6],
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            by_algorithm: Algorithm::ALL.map(|algorithm| Script::new(source(algorithm))),
        }
    }

    fn for_rule(&self, rule: &Rule) -> &Script {
        let index = Algorithm::ALL
            .iter()
            .position(|a| *a == rule.algorithm())
            .expect("every algorithm has a script");
        &self.by_algorithm[index]
    }
}

/// The Lua source of an algorithm's script (for benchmarks that call it
/// without the limiter around it).
#[doc(hidden)]
pub fn lua_source(algorithm: Algorithm) -> &'static str {
    source(algorithm)
}

/// The Lua source of an algorithm's script: the shared prelude, then the
/// algorithm (one script each, as Redis runs them).
pub(crate) fn source(algorithm: Algorithm) -> &'static str {
    macro_rules! script {
        ($file:literal) => {
            concat!(include_str!("../scripts/prelude.lua"), include_str!($file))
        };
    }
    match algorithm {
        Algorithm::FixedWindow => script!("../scripts/fixed_window.lua"),
        Algorithm::SlidingLog => script!("../scripts/sliding_log.lua"),
        Algorithm::SlidingWindow => script!("../scripts/sliding_window.lua"),
        Algorithm::TokenBucket => script!("../scripts/token_bucket.lua"),
        Algorithm::Gcra => script!("../scripts/gcra.lua"),
        Algorithm::Concurrency => script!("../scripts/concurrency.lua"),
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn.target {
            Target::Single(_) => "single node",
            Target::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("kind", &kind)
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
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
        }
    }
}

impl RedisBackend {
    /// Connects to the Redis server at `url` (`redis://host:port/db`) with the
    /// default timeouts, and loads the scripts.
    pub async fn connect(url: &str) -> Result<RedisBackend, Error> {
        RedisBackend::connect_with(url, DEFAULT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects with a per-check `timeout` and a `connect_timeout`, and loads
    /// the scripts.
    pub async fn connect_with(
        url: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<RedisBackend, Error> {
        RedisBackend::open(
            url,
            ConnectOptions {
                timeout,
                connect_timeout,
                lazy: false,
            },
        )
        .await
    }

    /// Connects to one Redis server.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a malformed URL; [`Error::Backend`] if Redis
    /// cannot be reached within the connect timeout (unless `lazy`).
    pub async fn open(url: &str, options: ConnectOptions) -> Result<RedisBackend, Error> {
        let client = redis::Client::open(url)
            .map_err(|e| Error::Config(format!("bad Redis URL {url:?}: {e}")))?;
        RedisBackend::start(Target::Single(client), options).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`urls`).
    ///
    /// # Errors
    ///
    /// As [`open`](RedisBackend::open).
    pub async fn open_cluster(
        urls: &[String],
        options: ConnectOptions,
    ) -> Result<RedisBackend, Error> {
        let client = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.timeout)
            .build()
            .map_err(|e| Error::Config(format!("bad Redis Cluster URLs {urls:?}: {e}")))?;
        RedisBackend::start(Target::Cluster(Box::new(client)), options).await
    }

    async fn start(target: Target, options: ConnectOptions) -> Result<RedisBackend, Error> {
        let backend = RedisBackend {
            conn: Arc::new(Conn {
                target,
                live: OnceCell::new(),
                timeout: options.timeout,
                connect_timeout: options.connect_timeout,
            }),
            scripts: Arc::new(Scripts::new()),
            timeout: options.timeout,
        };
        match backend.conn.get(&backend.scripts).await {
            Ok(_) => Ok(backend),
            Err(error) if options.lazy => {
                tracing::warn!(%error, "Redis cannot be reached; starting degraded, will connect on use");
                Ok(backend)
            }
            Err(error) => Err(error),
        }
    }

    /// Runs the rule's script: one round trip (two after a `NOSCRIPT`).
    /// `now` (µs) replaces the server's clock, for tests only; `lease` is the
    /// lease id of a concurrency rule.
    async fn eval(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Option<u64>,
        lease: Option<u64>,
    ) -> Result<Decision, Error> {
        let script = self.scripts.for_rule(rule);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(1)
            .arg(key)
            .arg(rule.count())
            .arg(rule.burst())
            .arg(rule.period_us())
            .arg(cost);
        match now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        if let Some(lease) = lease {
            cmd.arg(lease);
        }
        let run = async {
            let mut live = self.conn.get(&self.scripts).await?;
            let reply = match live.query(&cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    live.load(script).await.map_err(Error::backend)?;
                    live.query(&cmd).await
                }
                reply => reply,
            };
            reply.map_err(Error::backend)
        };
        let (allowed, remaining, reset_us, retry_us): (i64, i64, i64, i64) =
            match tokio::time::timeout(self.timeout, run).await {
                Ok(reply) => reply?,
                Err(_) => return Err(Error::backend(TimedOut(self.timeout))),
            };
        let micros = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(Outcome {
            allowed: allowed == 1,
            remaining: micros(remaining),
            reset_after_us: micros(reset_us),
            retry_after_us: micros(retry_us),
        }
        .decision(rule))
    }

    /// Runs a check as if the server's clock read `now` (time since the Unix
    /// epoch). For tests that hold the Redis and the memory backend side by
    /// side; keys written this way get an hour's extra TTL, since their
    /// times are not the server's.
    #[doc(hidden)]
    pub async fn check_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Duration,
    ) -> Result<Decision, Error> {
        self.eval(rule, key, cost, Some(micros(now)), None).await
    }

    /// [`Backend::acquire`] as if the server's clock read `now`; see [`check_at`](Self::check_at).
    #[doc(hidden)]
    pub async fn acquire_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
        now: Duration,
    ) -> Result<Decision, Error> {
        self.eval(rule, key, cost, Some(micros(now)), Some(lease))
            .await
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Backend for RedisBackend {
    async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        self.eval(rule, key, cost, None, None).await
    }

    async fn acquire(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> Result<Decision, Error> {
        self.eval(rule, key, cost, None, Some(lease)).await
    }

    async fn release(&self, _rule: &Rule, key: &str, cost: u64, lease: u64) -> Result<(), Error> {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(key);
        for unit in 0..cost {
            cmd.arg(format!("{lease}:{unit}"));
        }
        let run = async {
            let mut live = self.conn.get(&self.scripts).await?;
            live.query::<i64>(&cmd)
                .await
                .map(drop)
                .map_err(Error::backend)
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(reply) => reply,
            Err(_) => Err(Error::backend(TimedOut(self.timeout))),
        }
    }
}

/// Redis did not answer within the deadline.
#[derive(Debug)]
struct TimedOut(Duration);

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redis did not answer within {} ms", self.0.as_millis())
    }
}

impl std::error::Error for TimedOut {}
