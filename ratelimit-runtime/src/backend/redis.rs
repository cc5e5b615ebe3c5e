//! Redis: every check is one Lua script run by `EVALSHA` on one multiplexed
//! connection shared by all tasks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind};

use super::{Backend, fixed_window_decision};
use crate::{Algorithm, Decision, Error, Rule};

/// How long one check may wait for Redis before it counts as failed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// How long [`RedisBackend::connect`] may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Budgets kept in Redis, shared by every instance of the application.
///
/// One script per algorithm (in `src/scripts/`), each touching exactly one key
/// and using the Redis server's clock; every key it writes has a TTL. Scripts
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
    fixed_window: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            fixed_window: Script::new(include_str!("../scripts/fixed_window.lua")),
        }
    }

    fn all(&self) -> [&Script; 1] {
        [&self.fixed_window]
    }

    fn for_rule(&self, rule: &Rule) -> &Script {
        match rule.algorithm() {
            Algorithm::FixedWindow => &self.fixed_window,
        }
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
            for script in scripts.all() {
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

    async fn eval(&self, rule: &Rule, key: &str, cost: u64) -> Result<(i64, i64, i64), RedisError> {
        let script = self.scripts.for_rule(rule);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(1)
            .arg(key)
            .arg(rule.count())
            .arg(rule.period_ms())
            .arg(cost);
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut conn).await?;
                cmd.query_async(&mut conn).await
            }
            reply => reply,
        }
    }
}

impl Backend for RedisBackend {
    async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        let (allowed, remaining, reset_ms) =
            match tokio::time::timeout(self.timeout, self.eval(rule, key, cost)).await {
                Ok(reply) => reply.map_err(Error::backend)?,
                Err(_) => return Err(Error::backend(TimedOut(self.timeout))),
            };
        let remaining = u64::try_from(remaining).unwrap_or(0);
        let reset_after = Duration::from_millis(u64::try_from(reset_ms).unwrap_or(0));
        Ok(match rule.algorithm() {
            Algorithm::FixedWindow => {
                fixed_window_decision(rule, allowed == 1, remaining, reset_after, cost)
            }
        })
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
