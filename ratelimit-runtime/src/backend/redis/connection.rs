//! The connection: one multiplexed connection (or cluster connection)
//! shared by all tasks, made again after a failure; script calls that
//! reload a script or library the server lost.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisError, RetryMethod, Script, ServerErrorKind, Value,
};

use super::nodes::SlotMap;
use super::scripts::{Library, Scripts};
use super::within;
use crate::error::Error;

/// How long a script call's answer is still waited for once every caller of
/// it has been answered (by its deadline): an allowed check it holds is
/// then given back.
pub(super) const LATE_ANSWER: Duration = Duration::from_secs(2);

/// How long the connection waits for any answer: past every deadline, so
/// that a late answer still arrives (see [`LATE_ANSWER`]).
pub(super) fn response_timeout(timeout: Duration) -> Duration {
    timeout.max(LATE_ANSWER)
}

/// What is told of a key whose units were given back.
pub(crate) type GivenBack = Box<dyn Fn(&str) + Send + Sync>;

/// Counts one script call on its way while it lives.
pub(super) struct Busy<T: Deref<Target = AtomicUsize>>(T);

impl<T: Deref<Target = AtomicUsize>> Busy<T> {
    pub(super) fn enter(counter: T) -> Busy<T> {
        counter.fetch_add(1, Ordering::Relaxed);
        Busy(counter)
    }
}

impl<T: Deref<Target = AtomicUsize>> Drop for Busy<T> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where to connect, and the connection once made.
pub(super) struct Conn {
    pub(super) endpoint: Endpoint,
    /// The connection, once made (made again after [`Conn::forget`]).
    pub(super) live: std::sync::RwLock<Option<Live>>,
    /// Held while connecting: one attempt at a time.
    pub(super) connecting: tokio::sync::Mutex<()>,
    /// Whether an attempt to connect goes on in a task of its own, after
    /// the checks that started it ran out of time (one such task at most).
    pub(super) finishing: AtomicBool,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    /// Whether to load the batch script as a function library (asked for,
    /// and coalescing on one server).
    pub(super) try_functions: bool,
    /// Whether batches go by `FCALL` (the library is loaded) or `EVALSHA`.
    pub(super) functions: AtomicBool,
    /// After the library was refused (or found missing), when (ms from
    /// `origin`) it is tried again, and the wait before the try after that.
    pub(super) functions_retry: (AtomicU64, AtomicU64),
    /// Whether a try of the library is on its way.
    pub(super) restoring: AtomicBool,
    /// Told each key whose units were given back for a caller that had
    /// stopped waiting (the limiter's over-limit cache forgets it).
    pub(super) given_back: OnceLock<GivenBack>,
    /// A cluster's masters by slot, as it last said (`None`: not known, or
    /// not a cluster): checks are coalesced per master where it is known.
    pub(super) slots: std::sync::RwLock<Option<std::sync::Arc<SlotMap>>>,
    /// Where the local times below count from.
    pub(super) origin: tokio::time::Instant,
    /// The server's clock less ours (µs), at most what it is: the largest
    /// of the server's times an answer carried less when it arrived here
    /// (`i64::MIN` until one has). A single server's only: a cluster's
    /// nodes keep clocks of their own.
    pub(super) server_offset: AtomicI64,
}

/// What a [`RedisTarget`](super::RedisTarget) resolves to: what the
/// connection is made from.
// One per limiter; a plain client (larger with TLS) is the common case.
#[allow(clippy::large_enum_variant)]
pub(super) enum Endpoint {
    Single(redis::Client),
    // Boxed: a cluster client is twice a plain one, and both live once per limiter.
    Cluster(Box<ClusterClient>),
    /// A connection manager the user made (their TLS, auth, pool settings).
    Manager(ConnectionManager),
    /// The master a set of Sentinels names, asked again at each connect.
    #[cfg(feature = "sentinel")]
    Sentinel(Resolve),
}

/// Asks the Sentinels for the master's client. A trait object: the
/// Sentinel client's own types nest too deep for the compiler to prove
/// every future that holds a limiter `Send` (in the user's crate too).
#[cfg(feature = "sentinel")]
pub(super) type Resolve = Box<
    dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = redis::RedisResult<redis::Client>> + Send>>
        + Send
        + Sync,
>;

impl Endpoint {
    pub(super) fn describe(&self) -> String {
        match self {
            Endpoint::Single(client) => format!("Redis at {}", client.get_connection_info().addr()),
            Endpoint::Cluster(_) => "the Redis Cluster".to_owned(),
            Endpoint::Manager(_) => "the Redis of the given connection".to_owned(),
            #[cfg(feature = "sentinel")]
            Endpoint::Sentinel(_) => "the Redis master the Sentinels name".to_owned(),
        }
    }
}

#[derive(Clone)]
pub(super) enum Live {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Live {
    pub(super) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Live::Single(conn) => cmd.query_async(conn).await,
            Live::Cluster(conn) => {
                // The client retries nothing (see `cluster_builder`): a request
                // is sent again here only when the node answered that it did
                // not run it (a redirect, a replica's READONLY, TRYAGAIN,
                // CLUSTERDOWN, LOADING) or it was never sent (no connection
                // to the slot's node). A dropped connection is the caller's
                // error: the node may have run the script. An ASK (the key's
                // slot is migrating, and the key is not on the node that
                // serves it) goes at once to the node it names, after ASKING.
                let mut tries = 0;
                let mut asked = None;
                loop {
                    let reply = match asked.take() {
                        None => cmd.query_async(conn).await,
                        Some(node) => ask(conn, cmd, node).await,
                    };
                    match reply {
                        Err(e) if tries < CLUSTER_TRIES && e.kind() == ASK => {
                            tries += 1;
                            asked = e.redirect_node().and_then(|(node, _)| {
                                let (host, port) = node.rsplit_once(':')?;
                                Some((host.to_owned(), port.parse().ok()?))
                            });
                            if asked.is_none() {
                                return Err(e);
                            }
                        }
                        Err(e) if tries < CLUSTER_TRIES && (not_run(&e) || refused_write(&e)) => {
                            // Time for the client to learn the new slot map
                            // (or the node to be ready): 20, 40, 80 ms.
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(10 << tries)).await;
                        }
                        reply => return reply,
                    }
                }
            }
        }
    }

    pub(super) async fn load(&mut self, script: &Script) -> Result<(), RedisError> {
        match self {
            Live::Single(conn) => script.load_async(conn).await.map(drop),
            Live::Cluster(conn) => script.load_async(conn).await.map(drop),
        }
    }

    /// Sends `cmd` as [`Live::query`] does or, given a `route` (a call of
    /// the library's `node` function, whose keys go as arguments), to the
    /// cluster master that serves that key's slot. A routed call is not sent
    /// again on a redirect: the caller sends its calls one by one instead.
    pub(super) async fn query_at<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        route: Option<&[u8]>,
    ) -> Result<T, RedisError> {
        match (self, route) {
            (Live::Cluster(conn), Some(key)) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::with_key(key, SlotAddr::Master),
                ));
                // A server's error comes back as a value: made an error
                // again (not a type error), so that the caller sees what it
                // says (a function missing, a refusal).
                let value = conn.route_command(cmd.clone(), route).await?;
                Ok(T::from_redis_value(value.extract_error()?)?)
            }
            (live, _) => live.query(cmd).await,
        }
    }

    /// The cluster's slot map, `None` for a single server or a reply that
    /// does not parse.
    pub(super) async fn slot_map(&mut self) -> Option<SlotMap> {
        let Live::Cluster(conn) = self else {
            return None;
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
        match conn.route_command(cmd, route).await {
            Ok(reply) => SlotMap::parse(&reply),
            Err(error) => {
                tracing::debug!(%error, "no slot map; cluster checks go one by one");
                None
            }
        }
    }

    /// Makes sure the library can be called: calls its function once with
    /// an empty batch (which answers nothing), and where it is not loaded,
    /// loads it and calls it again. On a cluster every master is asked (one
    /// may have lost it while the others have it), and it is loaded on
    /// every master. A user may be allowed `FCALL` but not `FUNCTION`, or
    /// the other way round.
    pub(super) async fn load_library(&mut self, library: &Library) -> Result<(), RedisError> {
        let probe = probe(library);
        match self.everywhere(&probe).await {
            Err(error) if function_missing(&error) => {}
            reply => return reply,
        }
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&library.source);
        self.everywhere(&load).await?;
        self.everywhere(&probe).await
    }

    /// Sends `cmd` to the server, or to every master of a cluster: the
    /// first error any of them answered.
    async fn everywhere(&mut self, cmd: &Cmd) -> Result<(), RedisError> {
        let Live::Cluster(conn) = self else {
            return self.query::<Value>(cmd).await.map(drop);
        };
        let route = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // Each master's answer, by its address.
        match conn.route_command(cmd.clone(), route).await? {
            Value::Map(answers) => answers
                .into_iter()
                .try_for_each(|(_, answer)| answer.extract_error().map(drop)),
            answer => answer.extract_error().map(drop),
        }
    }
}

/// A call of the library's function with an empty batch (which answers
/// nothing), all of text: whatever the server answers, the client reads it.
fn probe(library: &Library) -> Cmd {
    let mut probe = redis::cmd("FCALL");
    probe
        .arg(&library.function)
        .arg(0)
        .arg("")
        .arg("")
        .arg("")
        .arg(0)
        .arg("")
        .arg("");
    probe
}

/// The first key of a script call (`FCALL`/`EVALSHA`, name, key count,
/// keys..): what a cluster routes it by.
fn first_key(cmd: &Cmd) -> Option<Vec<u8>> {
    let mut args = cmd.args_iter().skip(2).map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let keys = std::str::from_utf8(args.next()??).ok()?;
    if keys.parse::<u64>().ok()? == 0 {
        return None;
    }
    Some(args.next()??.to_vec())
}

/// A pipeline of `ASKING` and `cmd`, to the node `host:port`: `cmd`'s answer.
async fn ask<T: FromRedisValue>(
    conn: &mut ClusterConnection,
    cmd: &Cmd,
    (host, port): (String, u16),
) -> Result<T, RedisError> {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    let mut values = conn.route_pipeline(pipe, 1, 1, route).await?;
    let value = values.pop().unwrap_or(Value::Nil);
    Ok(T::from_redis_value(value.extract_error()?)?)
}

/// A `node` call where the library is not in use: only `FCALL` takes keys
/// of several slots. Nothing was sent.
fn node_call_without_functions() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "a batch of keys of several slots needs the function library",
    ))
}

/// Whether `error` says a call was not sent: a `node` call without the
/// library.
pub(super) fn not_sent(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Client
}

/// Whether `error` says a script's write was refused by a node that no
/// longer serves its key's slot (a key made anew in a migrating slot). The
/// scripts make a key anew only where it held no state of theirs, so what
/// the call wrote before counted nothing: it is sent again.
fn refused_write(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.contains("attempted to access a non local key"))
}

/// An `ASK` redirect.
const ASK: ErrorKind = ErrorKind::Server(ServerErrorKind::Ask);

/// Whether `error` says the function called is not loaded (the server
/// restarted, or its functions were flushed).
pub(super) fn function_missing(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// Whether `error` is a refusal of `FCALL` itself, so that it did not run:
/// the function is not loaded, the user may not call it (an ACL), or the
/// server has no such command (older, or a proxy).
pub(super) fn functions_refused(error: &RedisError) -> bool {
    function_missing(error)
        || error.code() == Some("NOPERM")
        || error.detail().is_some_and(|detail| {
            detail.starts_with("unknown command") || detail.starts_with("unknown subcommand")
        })
}

/// The first wait before the library is tried again after a refusal, and
/// the longest (each try that fails doubles it).
const FUNCTIONS_RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(8));

/// [`FUNCTIONS_RETRY`]'s first wait, in ms.
pub(super) const FIRST_FUNCTIONS_RETRY_MS: u64 = FUNCTIONS_RETRY.0.as_millis() as u64;

/// The head of a script call: `FCALL` of the library's function `name`, or
/// `EVALSHA` of `script`.
pub(super) fn script_call(function: bool, name: &str, script: &Script) -> Cmd {
    let mut cmd;
    if function {
        cmd = redis::cmd("FCALL");
        cmd.arg(name);
    } else {
        cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash());
    }
    cmd
}

/// One script call: an `FCALL` of the library's function (`call(true)`,
/// sent to the master of `route`'s slot when given) where the library is
/// loaded, else an `EVALSHA` of `script` (`call(false)`). A refusal of
/// `FCALL` (the library lost to a restart or `FUNCTION FLUSH`, an ACL that
/// denies it, a server without it) sends the call once more by `EVALSHA`
/// (but a `node` call, whose keys `EVALSHA` cannot take: that refusal is the
/// caller's to handle), and leaves scripts in use until the library is
/// loaded again, which is tried later in the background (see
/// [`Conn::restore_functions`]). An answer to `FCALL` that does not parse
/// (a server without `FCALL` quotes the call's bytes in its "unknown
/// command") is followed by a call of text to the same node: where that is
/// refused as above, the call did not run and goes on as above; else it
/// fails, and scripts are used all the same. A script the server lost
/// (`NOSCRIPT`) is loaded again and the call sent once more.
pub(super) async fn call_script<T: FromRedisValue>(
    live: &mut Live,
    conn: &Conn,
    library: &Library,
    script: &Script,
    route: Option<&[u8]>,
    call: impl Fn(bool) -> Cmd,
) -> Result<T, RedisError> {
    if conn.functions.load(Ordering::Relaxed) {
        let cmd = call(true);
        // A `node` call goes to the master of the key it is routed by.
        match live.query_at(&cmd, route).await {
            Err(e) if functions_refused(&e) => {
                conn.functions_refused(&e);
                if route.is_some() {
                    return Err(e);
                }
            }
            Err(e) if e.kind() == ErrorKind::Parse => {
                // An answer the client could not read: a server without
                // `FCALL` quotes the call's arguments (bytes, not text) in
                // its "unknown command". The same node is asked by a call
                // of text, whose refusal it can read: refused, the call
                // did not run either.
                let at = route.map(<[u8]>::to_vec).or_else(|| first_key(&cmd));
                match live.query_at::<Value>(&probe(library), at.as_deref()).await {
                    Err(refusal) if functions_refused(&refusal) => {
                        conn.functions_refused(&refusal);
                        if route.is_some() {
                            return Err(refusal);
                        }
                    }
                    _ => {
                        conn.functions_refused(&e);
                        return Err(e);
                    }
                }
            }
            reply => return reply,
        }
    } else if route.is_some() {
        return Err(node_call_without_functions());
    }
    let cmd = call(false);
    match live.query(&cmd).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            live.load(script).await?;
            live.query(&cmd).await
        }
        reply => reply,
    }
}

/// How many times a cluster request a node did not run is sent.
const CLUSTER_TRIES: u32 = 3;

/// Whether `error` says the request was not run: sending it again cannot
/// count it twice.
pub(super) fn not_run(error: &RedisError) -> bool {
    matches!(
        error.retry_method(),
        RetryMethod::MovedRedirect
            | RetryMethod::AskRedirect
            | RetryMethod::RefreshSlotsAndRetry
            | RetryMethod::WaitAndRetry
            | RetryMethod::ReconnectFromInitialConnections
    ) && !matches!(error.kind(), ErrorKind::Io)
}

impl Conn {
    /// `FCALL` was refused (`error`): calls go by `EVALSHA` until the
    /// library is loaded again, tried at once where it was only missing,
    /// else after a wait.
    pub(super) fn functions_refused(&self, error: &RedisError) {
        if self.functions.swap(false, Ordering::AcqRel) {
            tracing::warn!(%error, "the function library was refused; checks go by EVALSHA");
        }
        let now = self.origin.elapsed().as_millis() as u64;
        let wait = if function_missing(error) {
            0
        } else {
            self.functions_retry.1.load(Ordering::Relaxed)
        };
        self.functions_retry.0.store(now + wait, Ordering::Release);
    }

    /// Where the library was refused and its time to be tried again has
    /// come, tries it in the background (one try at a time): it is called,
    /// and loaded where it is missing. Calls go by `FCALL` again once it
    /// answers; each try that fails doubles the wait before the next.
    pub(super) fn restore_functions(self: &Arc<Conn>, scripts: &Arc<super::scripts::Scripts>) {
        if !self.try_functions
            || self.functions.load(Ordering::Relaxed)
            || (self.origin.elapsed().as_millis() as u64)
                < self.functions_retry.0.load(Ordering::Acquire)
            || self.restoring.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (conn, scripts) = (Arc::clone(self), Arc::clone(scripts));
        tokio::spawn(async move {
            let tried = match conn.get(&scripts).await {
                Ok(mut live) => live.load_library(&scripts.library).await.map(|()| live),
                Err(_) => Err(RedisError::from((ErrorKind::Io, "no connection"))),
            };
            let (first, longest) = FUNCTIONS_RETRY;
            match tried {
                Ok(mut live) => {
                    conn.functions_retry
                        .1
                        .store(first.as_millis() as u64, Ordering::Relaxed);
                    conn.learn_slots(&mut live).await;
                    conn.functions.store(true, Ordering::Release);
                    tracing::info!("the function library answers again; checks go by FCALL");
                }
                Err(error) => {
                    tracing::debug!(%error, "the function library is still refused");
                    let wait = conn.functions_retry.1.load(Ordering::Relaxed);
                    let now = conn.origin.elapsed().as_millis() as u64;
                    conn.functions_retry.0.store(now + wait, Ordering::Release);
                    let next = (wait * 2).min(longest.as_millis() as u64);
                    conn.functions_retry.1.store(next, Ordering::Relaxed);
                }
            }
            conn.restoring.store(false, Ordering::Release);
        });
    }

    /// Learns from an answer the server's time (µs) as the script read it.
    /// The largest offset seen is kept: on a cluster, that of the node whose
    /// clock is furthest ahead, so a deadline is never earlier in any node's
    /// time than ours (a node whose clock is behind is lenient by the skew).
    pub(super) fn saw_server_time(&self, server_us: u64) {
        let here = self.origin.elapsed().as_micros();
        let offset = i128::from(server_us) - i128::try_from(here).unwrap_or(i128::MAX);
        if let Ok(offset) = i64::try_from(offset) {
            self.server_offset.fetch_max(offset, Ordering::AcqRel);
        }
    }

    /// A local deadline in the server's time, `margin` earlier: never later
    /// than the server's clock reads when ours reaches it. `None` before an
    /// answer told the server's time.
    pub(super) fn server_deadline(
        &self,
        deadline: tokio::time::Instant,
        margin: Duration,
    ) -> Option<u64> {
        let offset = self.server_offset.load(Ordering::Acquire);
        if offset == i64::MIN {
            return None;
        }
        let here = deadline
            .checked_sub(margin)?
            .saturating_duration_since(self.origin)
            .as_micros();
        u64::try_from(i128::try_from(here).ok()? + i128::from(offset)).ok()
    }

    /// The connection, made now if it was not yet (one attempt, bounded by
    /// the connect timeout).
    pub(super) async fn get(&self, scripts: &Scripts) -> Result<Live, Error> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        // Boxed: connecting is rare and its future is large; inline, it would
        // make every check's future (and every move of it) kilobytes bigger.
        let connect = Box::pin(async {
            let _one_attempt = self.connecting.lock().await;
            if let Some(live) = self.current() {
                return Ok(live);
            }
            let live = self.connect(scripts).await?;
            *self.live.write().unwrap_or_else(PoisonError::into_inner) = Some(live.clone());
            Ok(live)
        });
        within(self.connect_timeout, connect).await
    }

    pub(super) fn current(&self) -> Option<Live> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops a connection that `error` says is gone or in the wrong place,
    /// so that the next call connects again:
    /// - a cluster's: its task ended (with the runtime the limiter was built
    ///   on, or its nodes all gone) and it does not come back by itself;
    /// - a Sentinel master's: the master may have failed over, so the
    ///   Sentinels are asked again (a server that answers `READONLY` was
    ///   demoted).
    ///
    /// A single server's connection manager reconnects on its own.
    pub(super) fn forget(&self, error: &RedisError) {
        let gone = match &self.endpoint {
            // A node gone (a failover): a new connection learns the slots
            // anew (the client retries nothing, so it would not).
            Endpoint::Cluster(_) => {
                error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || error.kind() == ErrorKind::ClusterConnectionNotFound
            }
            #[cfg(feature = "sentinel")]
            Endpoint::Sentinel(_) => {
                error.is_connection_dropped()
                    || error.is_io_error()
                    || error.is_timeout()
                    || error.code() == Some("READONLY")
            }
            _ => false,
        };
        if gone {
            *self.live.write().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// A connection manager for `client`, with the limiter's timeouts.
    async fn manager(&self, client: &redis::Client) -> Result<ConnectionManager, Error> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(response_timeout(self.timeout)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| self.failed(e))
    }

    pub(super) async fn connect(&self, scripts: &Scripts) -> Result<Live, Error> {
        let mut live = match &self.endpoint {
            Endpoint::Single(client) => Live::Single(self.manager(client).await?),
            Endpoint::Manager(manager) => Live::Single(manager.clone()),
            #[cfg(feature = "sentinel")]
            Endpoint::Sentinel(resolve) => {
                let client = resolve().await.map_err(|e| self.failed(e))?;
                Live::Single(self.manager(&client).await?)
            }
            Endpoint::Cluster(client) => Live::Cluster(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| self.failed(e))?,
            ),
        };
        if let Live::Single(_) = live {
            let info: String = live
                .query(&redis::cmd("INFO"))
                .await
                .map_err(|e| self.failed(e))?;
            check_server(&info)?;
        }
        for script in scripts.all() {
            live.load(script).await.map_err(|e| self.failed(e))?;
        }
        if self.try_functions {
            // Redis before 7, or a user whose ACL denies FUNCTION: the
            // batch script goes by EVALSHA (and the library is tried again
            // later).
            match live.load_library(&scripts.library).await {
                Ok(()) => self.functions.store(true, Ordering::Relaxed),
                Err(error) => {
                    tracing::debug!(%error, "no function library; batches go by EVALSHA");
                    let now = self.origin.elapsed().as_millis() as u64;
                    let wait = self.functions_retry.1.load(Ordering::Relaxed);
                    self.functions_retry.0.store(now + wait, Ordering::Release);
                }
            }
        }
        // A cluster's checks are coalesced per master with the library's
        // `node` function only.
        if self.functions.load(Ordering::Relaxed) {
            self.learn_slots(&mut live).await;
        }
        Ok(live)
    }
}

impl Conn {
    /// Asks the cluster which master serves each slot (nothing for a single
    /// server).
    pub(super) async fn learn_slots(&self, live: &mut Live) {
        let map = live.slot_map().await.map(std::sync::Arc::new);
        *self.slots.write().unwrap_or_else(PoisonError::into_inner) = map;
    }

    /// The slot map, where checks are coalesced per master.
    pub(super) fn slot_map(&self) -> Option<std::sync::Arc<SlotMap>> {
        if !self.functions.load(Ordering::Relaxed) {
            return None;
        }
        self.slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A connection's failure, saying where.
    fn failed(&self, error: RedisError) -> Error {
        let at = self.endpoint.describe();
        // Credentials refused, or a user not allowed the commands: wrong
        // configuration, not a Redis that is down (`build` says so).
        let refused = error.kind() == ErrorKind::AuthenticationFailed
            || matches!(error.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"));
        Error::backend(ConnectError { at, error, refused })
    }
}

/// Redis could not be reached or refused the limiter, and where it was.
#[derive(Debug)]
pub(super) struct ConnectError {
    at: String,
    error: RedisError,
    /// The credentials or the commands were refused.
    pub(super) refused: bool,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.refused {
            write!(
                f,
                "{} refused the limiter's credentials or commands ({}): check the user and \
                 password (redis://user:password@host:port/) and that the user may run the \
                 limiter's commands (the README's `ACL SETUSER` line lists them)",
                self.at, self.error
            )
        } else {
            write!(f, "{} cannot be reached: {}", self.at, self.error)
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The oldest Redis the scripts run on: `ZADD` with `LT` came in 6.2.
pub(super) const MIN_REDIS: (u32, u32) = (6, 2);

/// What a single server's `INFO` must say: a version the scripts run on,
/// and no cluster mode (a cluster node reached by `.redis(url)` refuses
/// batches of keys of different slots, `CROSSSLOT`, as soon as checks are
/// coalesced: that needs the list of its nodes, `.redis([..])`).
pub(super) fn check_server(info: &str) -> Result<(), Error> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if field("cluster_enabled") == Some("1") {
        return Err(Error::Config(
            "this Redis server runs in cluster mode: give the list of its nodes, \
             RateLimiter::builder().redis([url, ..]) (a Redis Cluster), not one URL"
                .to_owned(),
        ));
    }
    if let Some(version) = field("redis_version") {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if found < MIN_REDIS {
            return Err(Error::Config(format!(
                "Redis {version} is too old: the rate limiter's scripts need Redis {}.{} or later",
                MIN_REDIS.0, MIN_REDIS.1
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_must_be_new_enough_and_not_a_cluster_node() {
        let info = |version: &str, cluster: &str| {
            format!(
                "# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n\r\n\
                 # Cluster\r\ncluster_enabled:{cluster}\r\n"
            )
        };
        assert!(check_server(&info("7.0.15", "0")).is_ok());
        assert!(check_server(&info("6.2.0", "0")).is_ok());
        assert!(
            check_server(&info("7.2.4", "0")).is_ok(),
            "Valkey reports 7.2.4"
        );
        let old = check_server(&info("6.0.16", "0")).unwrap_err().to_string();
        assert!(old.contains("6.0.16") && old.contains("6.2"), "{old}");
        let cluster = check_server(&info("7.0.15", "1")).unwrap_err().to_string();
        assert!(cluster.contains("redis([url, ..])"), "{cluster}");
        assert!(
            check_server("").is_ok(),
            "a proxy that answers no INFO fields"
        );
    }
}
