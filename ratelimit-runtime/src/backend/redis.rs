//! Redis: every check is one Lua script run by `EVALSHA` on one multiplexed
//! connection shared by all tasks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind};

use super::Backend;
use crate::algorithm::Outcome;
use crate::{Algorithm, Decision, Error, Rule};

/// How long one check may wait for Redis before it counts as failed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// How long [`RedisBackend::connect`] may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Budgets kept in Redis, shared by every instance of the application.
///
/// One script per algorithm (in `src/scripts/`), each touching exactly one key
/// (so every check is Redis Cluster safe) and using the Redis server's clock
/// (`TIME`, in µs); every write sets a TTL no longer than the state matters. Scripts
/// are loaded when connecting and reloaded if Redis answers `NOSCRIPT` (after
/// a restart or `SCRIPT FLUSH`). Cheap to clone: clones share the connection,
/// which reconnects in the background after a failure.
#[derive(Clone)]
pub struct RedisBackend {
    conn: ConnectionManager,
    scripts: Arc<Scripts>,
    timeout: Duration,
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

/// The Lua source of an algorithm's script.
pub(crate) fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => include_str!("../scripts/fixed_window.lua"),
        Algorithm::SlidingLog => include_str!("../scripts/sliding_log.lua"),
        Algorithm::SlidingWindow => include_str!("../scripts/sliding_window.lua"),
        Algorithm::TokenBucket => include_str!("../scripts/token_bucket.lua"),
        Algorithm::Gcra => include_str!("../scripts/gcra.lua"),
        Algorithm::Concurrency => include_str!("../scripts/concurrency.lua"),
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to the Redis server at `url` (`redis://host:port/db`) with the
    /// default timeouts, and loads the scripts.
    pub async fn connect(url: &str) -> Result<RedisBackend, Error> {
        RedisBackend::connect_with(url, DEFAULT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects with a per-check `timeout` and a `connect_timeout` for this
    /// call, and loads the scripts.
    pub async fn connect_with(
        url: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<RedisBackend, Error> {
        let client = redis::Client::open(url)
            .map_err(|e| Error::Config(format!("bad Redis URL {url:?}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout))
            .set_max_delay(Duration::from_secs(2));
        let connect = async {
            let mut conn = client.get_connection_manager_with_config(config).await?;
            let scripts = Scripts::new();
            for script in &scripts.by_algorithm {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(RedisBackend {
                conn,
                scripts: Arc::new(scripts),
                timeout,
            })
        };
        match tokio::time::timeout(connect_timeout, connect).await {
            Ok(Ok(backend)) => Ok(backend),
            Ok(Err(e)) => Err(Error::backend(e)),
            Err(_) => Err(Error::backend(TimedOut(connect_timeout))),
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
            let mut conn = self.conn.clone();
            match cmd.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                reply => reply,
            }
        };
        let (allowed, remaining, reset_us, retry_us): (i64, i64, i64, i64) =
            match tokio::time::timeout(self.timeout, run).await {
                Ok(reply) => reply.map_err(Error::backend)?,
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
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, cmd.query_async::<i64>(&mut conn)).await {
            Ok(reply) => reply.map(drop).map_err(Error::backend),
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
