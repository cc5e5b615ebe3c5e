//! Redis and Redis Cluster: every check is one Lua script run by `EVALSHA`
//! on one multiplexed connection (or one cluster connection) shared by all
//! tasks. On one server, checks that wait at the same moment are coalesced
//! into one script call (see [`ConnectOptions::coalesce`]), and the scripts
//! are `FCALL`s of a function library where the server allows it
//! ([`ConnectOptions::functions`]).

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{self, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind};
use tokio::sync::{OwnedMutexGuard, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::{Backend, StoredKey};
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
///
/// On a single server, checks are coalesced: while a script call is on its
/// way, the checks that arrive meanwhile wait in a queue and go together in
/// the next call, one call of a batch script (`FCALL` of it as a function
/// library where the server allows it, else `EVALSHA`) that runs each check in
/// turn on its own key (each as atomic as alone; they share the server's
/// clock reading). A check that finds nothing on its way goes at once, alone,
/// so nothing waits when Redis keeps up; under load one round trip and one
/// script call carry many checks.
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

/// Counts one script call on its way while it lives.
struct Busy<T: Deref<Target = AtomicUsize>>(T);

impl<T: Deref<Target = AtomicUsize>> Busy<T> {
    fn enter(counter: T) -> Busy<T> {
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
struct Conn {
    target: Target,
    /// The connection, once made (made again after [`Conn::forget`]).
    live: std::sync::RwLock<Option<Live>>,
    /// Held while connecting: one attempt at a time.
    connecting: tokio::sync::Mutex<()>,
    /// Whether an attempt to connect goes on in a task of its own, after
    /// the checks that started it ran out of time (one such task at most).
    finishing: AtomicBool,
    timeout: Duration,
    connect_timeout: Duration,
    /// Whether to load the batch script as a function library (asked for,
    /// and coalescing on one server).
    try_functions: bool,
    /// Whether batches go by `FCALL` (the library is loaded) or `EVALSHA`.
    functions: AtomicBool,
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

    /// Loads the library and calls its function once with an empty batch
    /// (which answers nothing): a user may be allowed `FUNCTION` but not
    /// `FCALL`.
    async fn load_library(&mut self, library: &Library) -> Result<(), RedisError> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&library.source);
        self.query::<String>(&load).await?;
        let mut probe = redis::cmd("FCALL");
        probe
            .arg(&library.function)
            .arg(0)
            .arg("")
            .arg("")
            .arg("")
            .arg(0);
        self.query::<Vec<u8>>(&probe).await.map(drop)
    }
}

/// Whether `error` says the function called is not loaded (the server
/// restarted, or its functions were flushed).
fn function_missing(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// The head of a script call: `FCALL` of the library's function `name`, or
/// `EVALSHA` of `script`.
fn script_call(function: bool, name: &str, script: &Script) -> Cmd {
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

/// One script call: an `FCALL` of the library's function (`call(true)`)
/// where the library is loaded, else an `EVALSHA` of `script`
/// (`call(false)`). A library the server lost (a restart, `FUNCTION FLUSH`)
/// is loaded again and the call sent once more; one that cannot be loaded
/// now (Redis replaced by an older one, an ACL change) leaves scripts in use
/// from then on. A script the server lost (`NOSCRIPT`) is loaded again and
/// the call sent once more.
async fn call_script<T: FromRedisValue>(
    live: &mut Live,
    conn: &Conn,
    scripts: &Scripts,
    script: &Script,
    call: impl Fn(bool) -> Cmd,
) -> Result<T, RedisError> {
    if conn.functions.load(Ordering::Relaxed) {
        let cmd = call(true);
        match live.query(&cmd).await {
            Err(e) if function_missing(&e) => {
                if live.load_library(&scripts.library).await.is_ok() {
                    return live.query(&cmd).await;
                }
                conn.functions.store(false, Ordering::Relaxed);
            }
            reply => return reply,
        }
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

impl Conn {
    /// The connection, made now if it was not yet (one attempt, bounded by
    /// the connect timeout).
    async fn get(&self, scripts: &Scripts) -> Result<Live, Error> {
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
            let live = self.connect(scripts).await.map_err(Error::backend)?;
            *self.live.write().unwrap_or_else(PoisonError::into_inner) = Some(live.clone());
            Ok(live)
        });
        within(self.connect_timeout, connect).await
    }

    fn current(&self) -> Option<Live> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops a cluster connection that `error` says is gone, so that the next
    /// call connects again. Its task ended (with the runtime the limiter was
    /// built on, or its nodes all gone) and it does not come back by itself;
    /// a single server's connection manager reconnects on its own.
    fn forget(&self, error: &RedisError) {
        if matches!(self.target, Target::Cluster(_)) && error.is_connection_dropped() {
            *self.live.write().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    async fn connect(&self, scripts: &Scripts) -> Result<Live, RedisError> {
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
        for script in scripts.all() {
            live.load(script).await?;
        }
        if self.try_functions {
            // Redis before 7, or a user whose ACL denies FUNCTION: the
            // batch script goes by EVALSHA.
            match live.load_library(&scripts.library).await {
                Ok(()) => self.functions.store(true, Ordering::Relaxed),
                Err(error) => {
                    tracing::debug!(%error, "no function library; batches go by EVALSHA")
                }
            }
        }
        Ok(live)
    }
}

struct Scripts {
    /// Indexed like [`Algorithm::ALL`].
    by_algorithm: [Script; 6],
    /// Many checks of any algorithms, or releases, in one call.
    batch: Script,
    /// The same as a function library.
    library: Library,
}

impl Scripts {
    fn new() -> Scripts {
        let batch = Script::new(BATCH);
        Scripts {
            by_algorithm: Algorithm::ALL.map(|algorithm| Script::new(source(algorithm))),
            library: Library::new(),
            batch,
        }
    }

    fn all(&self) -> impl Iterator<Item = &Script> {
        self.by_algorithm.iter().chain([&self.batch])
    }
}

fn algorithm_index(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .expect("every algorithm has a script")
}

/// The Lua source of an algorithm's script (for benchmarks that call it
/// without the limiter around it).
#[doc(hidden)]
pub fn lua_source(algorithm: Algorithm) -> &'static str {
    source(algorithm)
}

/// The Lua source of an algorithm's own script: the shared prelude, the
/// algorithm's function, and the driver that runs it once.
pub(crate) fn source(algorithm: Algorithm) -> &'static str {
    macro_rules! script {
        ($name:literal) => {
            concat!(
                include_str!("../scripts/bind.lua"),
                include_str!("../scripts/prelude.lua"),
                include_str!(concat!("../scripts/", $name, ".lua")),
                "\nlocal check = ",
                $name,
                "\n",
                include_str!("../scripts/single.lua"),
            )
        };
    }
    match algorithm {
        Algorithm::FixedWindow => script!("fixed_window"),
        Algorithm::SlidingLog => script!("sliding_log"),
        Algorithm::SlidingWindow => script!("sliding_window"),
        Algorithm::TokenBucket => script!("token_bucket"),
        Algorithm::Gcra => script!("gcra"),
        Algorithm::Concurrency => script!("concurrency"),
    }
}

/// The library functions the scripts use, bound to locals.
const BIND: &str = include_str!("../scripts/bind.lua");

/// The prelude and every algorithm: what the batch script defines before its
/// driver.
macro_rules! batch_body {
    () => {
        concat!(
            include_str!("../scripts/prelude.lua"),
            include_str!("../scripts/fixed_window.lua"),
            include_str!("../scripts/sliding_log.lua"),
            include_str!("../scripts/sliding_window.lua"),
            include_str!("../scripts/token_bucket.lua"),
            include_str!("../scripts/gcra.lua"),
            include_str!("../scripts/concurrency.lua"),
        )
    };
}

/// The batch script: every algorithm, and the driver that runs many checks.
const BATCH: &str = concat!(
    include_str!("../scripts/bind.lua"),
    batch_body!(),
    include_str!("../scripts/batch.lua"),
);

/// The driver of one check alone (after `local check = <algorithm>`): the
/// end of each algorithm's own script, and of its function in the library.
const SINGLE: &str = include_str!("../scripts/single.lua");

/// The driver of a batch: the end of the batch script, and the body of the
/// library's batch function.
const BATCH_DRIVER: &str = include_str!("../scripts/batch.lua");

/// The library's release function: KEYS[1] the key, ARGV the cost and the
/// lease id; it answers as a batch of releases does, with nothing. (`text`,
/// for the members of a lease of several units, needs its table: a
/// library's is kept between calls unless made anew.)
const RELEASE_FUNCTION: &str =
    "texts = {}\nrelease(KEYS[1], tonumber(ARGV[1]), ARGV[2])\nreturn ''";

/// The batch script as a Redis function library (Redis 7 and later), called
/// with `FCALL`: its prelude and algorithms run once, when it is loaded, not
/// at every call as a script's do (about 2 µs of the server's time a call).
/// Besides the batch driver it has each algorithm's single-check driver and
/// a release, for the calls that go alone. Its names carry a hash of all it
/// runs, so instances running different versions of this crate each find
/// their own.
struct Library {
    /// The batch function.
    function: String,
    /// One check alone, per algorithm (indexed like [`Algorithm::ALL`]):
    /// the rule's own script as a function.
    singles: [String; 6],
    /// One release alone.
    release: String,
    /// The library's source, for `FUNCTION LOAD REPLACE`.
    source: String,
}

impl Library {
    fn new() -> Library {
        // What the library runs, hashed: a change to any of it is a new
        // version, with names of its own.
        let digest = sha1_smol::Sha1::from([BATCH, SINGLE, RELEASE_FUNCTION].concat())
            .digest()
            .to_string();
        let version = &digest[..16];
        let function = format!("ratelimit_batch_{version}");
        let singles = Algorithm::ALL.map(|a| format!("ratelimit_{}_{version}", a.name()));
        let release = format!("ratelimit_release_{version}");
        // bind.lua's lines `local names = values`: the names declared at
        // load, the values given at each call (`redis` and `struct` exist
        // only in a call).
        let bound: Vec<(&str, &str)> = BIND
            .lines()
            .filter_map(|line| line.strip_prefix("local ")?.split_once(" = "))
            .collect();
        let mut source = format!("#!lua name=ratelimit_{version}\n");
        for (names, _) in &bound {
            source.push_str(&format!("local {names}\n"));
        }
        source.push_str(batch_body!());
        let mut register = |name: &str, body: &str| {
            source.push_str(&format!(
                "\nredis.register_function('{name}', function(KEYS, ARGV)\n"
            ));
            for (names, values) in &bound {
                source.push_str(&format!("{names} = {values}\n"));
            }
            source.push_str(body);
            source.push_str("\nend)\n");
        };
        register(&function, BATCH_DRIVER);
        for (algorithm, name) in Algorithm::ALL.iter().zip(&singles) {
            let single = format!("local check = {}\n{SINGLE}", algorithm.name());
            register(name, &single);
        }
        register(&release, RELEASE_FUNCTION);
        Library {
            function,
            singles,
            release,
            source,
        }
    }
}

/// The most checks one batch carries (a batch holds the server for its
/// whole run: about a microsecond or two per check).
const MAX_BATCH: usize = 128;

/// How many batches may be on their way at once. Several keep the server fed
/// while answered callers queue their next checks: at 16 and 64 tasks 8
/// measured 5-15 % faster than 2, at 256 tasks the same; 32 made batches too
/// small at 256 tasks (`cargo bench --bench load`).
const IN_FLIGHT: usize = 8;

/// `what` of a release in a batch (checks are 1..=6, the algorithm's place
/// in [`Algorithm::ALL`] plus one).
const RELEASE: u8 = 7;

/// What a release's caller is told once its batch ran (the script answers
/// checks only).
const RELEASED: [i64; 4] = [1, 0, 0, 0];

/// Where a job's answer arrives.
type Answer = oneshot::Receiver<Result<[i64; 4], Error>>;

/// One check (or release) waiting in the queue for the next batch.
struct Job {
    what: u8,
    key: StoredKey,
    count: u64,
    burst: u64,
    period_us: u64,
    cost: u64,
    now: Option<u64>,
    lease: Option<u64>,
    /// When its caller stops waiting: the batch task answers it `TimedOut`
    /// by then (so a check costs no timer of its own where that task is sure
    /// to run, see [`Home`]; a batch has one).
    deadline: Instant,
    reply: oneshot::Sender<Result<[i64; 4], Error>>,
}

impl Job {
    /// Where the job goes in a batch: 0 a check whose state is a string (read
    /// ahead; a sliding log's is, until it outgrows one), 1 a concurrency
    /// check (a sorted set), 2 a release.
    fn place(&self) -> u8 {
        match Algorithm::ALL.get(usize::from(self.what) - 1) {
            Some(Algorithm::Concurrency) => 1,
            Some(_) => 0,
            None => 2,
        }
    }

    /// What a check shares with the checks of the same rule in a batch.
    fn rule(&self) -> (u8, u64, u64, u64, Option<u64>, bool) {
        let Job {
            what,
            count,
            burst,
            period_us,
            now,
            lease,
            ..
        } = *self;
        (what, count, burst, period_us, now, lease.is_some())
    }

    fn new(
        what: u8,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Option<u64>,
        lease: Option<u64>,
        deadline: Instant,
    ) -> (Job, Answer) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            what,
            key: StoredKey::new(key),
            count: rule.count(),
            burst: rule.burst(),
            period_us: rule.period_us(),
            cost,
            now,
            lease,
            deadline,
            reply,
        };
        (job, answer)
    }
}

/// The queue of the task that sends coalesced checks, and that task.
///
/// It runs on the Tokio runtime the backend was built on. When that runtime
/// ends while the backend lives on (a limiter built on a start-up runtime,
/// or in one `#[tokio::test]` and used in the next), the task ends with it;
/// the queue does not, and the next check that finds the task gone starts
/// it again on its own runtime (before, every check that waited for a batch
/// failed from then on).
#[derive(Clone)]
struct Batching {
    queue: mpsc::UnboundedSender<Job>,
    /// The queue's receiving end, held by the running task.
    jobs: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Job>>>,
    /// Whether the task runs (cleared when it ends, or is dropped with its
    /// runtime).
    running: Arc<AtomicBool>,
    /// The runtime the task was last started on.
    home: Arc<Home>,
}

/// The runtime the batch task runs on: whether it answers a check by its
/// deadline with no timer of the check's own. A multi-thread runtime's
/// workers run the task whoever waits; a current-thread runtime runs it only
/// while it is driven, as it is when the check runs on it.
#[derive(Debug, Default)]
struct Home {
    multi_thread: AtomicBool,
    /// A current-thread runtime's id.
    current_thread: std::sync::Mutex<Option<tokio::runtime::Id>>,
}

impl Home {
    fn set(&self, runtime: &tokio::runtime::Handle) {
        let multi = runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        *self
            .current_thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (!multi).then(|| runtime.id());
        self.multi_thread.store(multi, Ordering::Release);
    }

    /// Whether the task answers a check made here by its deadline.
    fn answers_here(&self) -> bool {
        if self.multi_thread.load(Ordering::Acquire) {
            return true;
        }
        let home = *self
            .current_thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        home.is_some()
            && tokio::runtime::Handle::try_current().is_ok_and(|here| Some(here.id()) == home)
    }
}

impl Batching {
    /// Starts the task of `backend`'s batches on the current runtime, unless
    /// it runs. `false` when none runs and none can start (not on a Tokio
    /// runtime).
    fn ensure_running(&self, backend: &RedisBackend) -> bool {
        if self.running.load(Ordering::Acquire)
            || self
                .running
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.running.store(false, Ordering::Release);
            return false;
        };
        self.home.set(&runtime);
        runtime.spawn(run_batches(
            Arc::clone(&self.jobs),
            Running {
                flag: Arc::clone(&self.running),
                queue: None,
            },
            Arc::clone(&backend.conn),
            Arc::clone(&backend.scripts),
            Arc::clone(&backend.busy),
            backend.timeout,
        ));
        true
    }
}

/// The running task's hold on the queue. When the task ends or is dropped
/// (with its runtime), this clears [`Batching::running`] and then drops the
/// jobs still queued, so that their callers hear `Stopped` at once instead
/// of waiting for a task that is gone (most callers wait on their answer
/// alone, with no timer of their own). A job queued after that finds the
/// flag cleared and starts a new task (see [`RedisBackend::queued`]).
struct Running {
    flag: Arc<AtomicBool>,
    queue: Option<OwnedMutexGuard<mpsc::UnboundedReceiver<Job>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::SeqCst);
        // Pairs with the fence in `queued`: a job is either seen here or
        // its caller sees the flag cleared.
        atomic::fence(Ordering::SeqCst);
        if let Some(queue) = &mut self.queue {
            while queue.try_recv().is_ok() {}
        }
    }
}

/// Takes the queued checks in batches and sends each batch as one
/// `EVALSHA`, at most [`IN_FLIGHT`] at a time. Ends when every clone of the
/// backend is gone.
async fn run_batches(
    queue: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Job>>>,
    running: Running,
    conn: Arc<Conn>,
    scripts: Arc<Scripts>,
    busy: Arc<AtomicUsize>,
    timeout: Duration,
) {
    let mut running = running;
    // Free at once, or as soon as the task this one replaces is dropped.
    let queue = running.queue.insert(queue.lock_owned().await);
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut jobs = Vec::with_capacity(16);
        if queue.recv_many(&mut jobs, MAX_BATCH).await == 0 {
            return;
        }
        // Let the tasks just woken by the last answer queue their next
        // checks before this batch leaves (a lone check waits for one yield;
        // under load batches come out several times larger).
        tokio::task::yield_now().await;
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let (conn, scripts) = (Arc::clone(&conn), Arc::clone(&scripts));
        let busy = Busy::enter(Arc::clone(&busy));
        tokio::spawn(async move {
            send_batch(jobs, &conn, &scripts, timeout).await;
            drop((slot, busy));
        });
    }
}

/// Runs one batch and hands each check its answer (or the batch's error)
/// by the checks' deadline: a check that waited past its deadline for a
/// batch is answered `TimedOut` without being sent, and a batch that Redis
/// does not answer in time (or whose connection is not made in time) times
/// out at its earliest check's deadline (`timeout` is for the message).
async fn send_batch(
    mut jobs: Vec<Job>,
    conn: &Arc<Conn>,
    scripts: &Arc<Scripts>,
    timeout: Duration,
) {
    // A check whose caller gave up (cancelled) is not run.
    jobs.retain(|job| !job.reply.is_closed());
    let now = Instant::now();
    for late in jobs.extract_if(.., |job| job.deadline <= now) {
        let _ = late.reply.send(Err(Error::backend(TimedOut(timeout))));
    }
    let Some(deadline) = jobs.iter().map(|job| job.deadline).min() else {
        return;
    };
    // The checks that keep a string state first (each key's first one read
    // ahead), then the other checks, then the releases (see batch.lua).
    jobs.sort_unstable_by_key(Job::place);
    let checks = jobs.partition_point(|job| job.place() < 2);
    let strings = jobs.partition_point(|job| job.place() < 1);
    let read_ahead = firsts_first(&mut jobs[..strings]);
    // The rules, packed (see batch.lua): each distinct one once, six numbers;
    // then one byte per check, its rule's number.
    let mut rules = Vec::new();
    let mut order = Vec::with_capacity(checks);
    for job in &jobs[..checks] {
        let rule = job.rule();
        let at = rules.iter().position(|r| *r == rule).unwrap_or_else(|| {
            rules.push(rule);
            rules.len() - 1
        });
        // At most MAX_BATCH (128) checks, so as many rules: one byte, from 1.
        order.push(at as u8 + 1);
    }
    let mut packed = Vec::with_capacity(rules.len() * 6 * 8);
    for &(what, count, burst, period_us, now, leased) in &rules {
        for number in [
            f64::from(what),
            count as f64,
            burst as f64,
            period_us as f64,
            now.map_or(-1.0, |now| now as f64),
            f64::from(u8::from(leased)),
        ] {
            packed.extend_from_slice(&number.to_be_bytes());
        }
    }
    // The costs, only when one is not 1.
    let costs: Vec<u8> = if jobs.iter().all(|job| job.cost == 1) {
        Vec::new()
    } else {
        jobs.iter()
            .flat_map(|job| (job.cost as f64).to_be_bytes())
            .collect()
    };
    // The call: FCALL of the library's function, or EVALSHA of the script.
    let call = |function: bool| {
        if let ([job], true, 0) = (&jobs[..], function, checks) {
            // A release alone: the library's release function, which has no
            // batch to unpack.
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(&scripts.library.release)
                .arg(1)
                .arg(job.key.as_bytes())
                .arg(job.cost)
                .arg(job.lease);
            return cmd;
        }
        let mut cmd = script_call(function, &scripts.library.function, &scripts.batch);
        cmd.arg(jobs.len());
        for job in &jobs {
            cmd.arg(job.key.as_bytes());
        }
        cmd.arg(&packed).arg(&order).arg(&costs).arg(read_ahead);
        // The lease ids, each as its own argument: the checks' that carry
        // one, in order, then the releases'.
        for lease in jobs.iter().filter_map(|job| job.lease) {
            cmd.arg(lease);
        }
        cmd
    };
    let run = async {
        let mut live = conn.get(scripts).await?;
        call_script(&mut live, conn, scripts, &scripts.batch, call)
            .await
            .map_err(Error::backend)
    };
    let reply: Result<Vec<u8>, Error> = match tokio::time::timeout_at(deadline, run).await {
        Ok(reply) => reply,
        Err(_) => {
            if conn.current().is_none() && !conn.finishing.swap(true, Ordering::AcqRel) {
                // The connection was being made when the checks ran out of
                // time: an attempt goes on (within the connect timeout) for
                // the checks to come, as a batch's did before it had a
                // deadline.
                let (conn, scripts) = (Arc::clone(conn), Arc::clone(scripts));
                tokio::spawn(async move {
                    let _ = conn.get(&scripts).await;
                    conn.finishing.store(false, Ordering::Release);
                });
            }
            Err(Error::backend(TimedOut(timeout)))
        }
    };
    match reply {
        Ok(packed) if packed.len() == 32 * checks => {
            // The checks' answers, in order; the releases after them get none.
            let mut answers = packed.chunks_exact(32);
            for job in jobs {
                let answer = answers.next().map_or(RELEASED, |answer| {
                    // Whole numbers below 2^53, exact as doubles.
                    let number = |i: usize| {
                        let bytes = answer[8 * i..8 * i + 8].try_into().expect("8 bytes");
                        f64::from_be_bytes(bytes) as i64
                    };
                    [number(0), number(1), number(2), number(3)]
                });
                let _ = job.reply.send(Ok(answer));
            }
        }
        failed => {
            let error = Shared(Arc::new(match failed {
                Ok(packed) => Error::Config(format!(
                    "the batch script answered {} bytes for {} checks",
                    packed.len(),
                    checks
                )),
                Err(error) => error,
            }));
            for job in jobs {
                let _ = job.reply.send(Err(Error::backend(error.clone())));
            }
        }
    }
}

/// A job's answer. The batch task gives it by the job's deadline, or drops
/// the job when the task is gone (its runtime ended).
async fn answered(
    answer: impl Future<Output = Result<Result<[i64; 4], Error>, oneshot::error::RecvError>>,
) -> Result<[i64; 4], Error> {
    answer
        .await
        .unwrap_or_else(|_| Err(Error::backend(Stopped)))
}

/// Puts the first check of each key first, and a key's later checks (a hot
/// key checked again in the same batch) after all of those: the script reads
/// the first ones' states ahead, in one `MGET` of distinct keys, and each
/// later one its own, after its key's first check has written it. Answers
/// how many come first. Checks that wait at the same moment have no order
/// among them, so any order of a key's checks is right.
fn firsts_first(jobs: &mut [Job]) -> usize {
    if jobs.len() < 2 {
        return jobs.len();
    }
    jobs.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    // Each key's first, in order, to the front (what `Vec::dedup` keeps);
    // the repeats end up behind them.
    let mut firsts = 1;
    for i in 1..jobs.len() {
        if jobs[i].key.as_bytes() != jobs[firsts - 1].key.as_bytes() {
            jobs.swap(firsts, i);
            firsts += 1;
        }
    }
    firsts
}

/// One batch's failure, given to each of its checks.
#[derive(Clone, Debug)]
struct Shared(Arc<Error>);

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Error::Backend(source) => fmt::Display::fmt(source, f),
            other => fmt::Display::fmt(other, f),
        }
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.0 {
            Error::Backend(source) => source.source(),
            _ => None,
        }
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
    /// Coalesce checks that wait at the same moment into one script call
    /// (single server only; a cluster spreads keys over slots, so every
    /// check there is its own call). On by default.
    pub coalesce: bool,
    /// Load the scripts as a function library (Redis 7 and later): batches,
    /// and checks and releases that go alone, are then `FCALL`s of it, which
    /// cost the server about 1-2 µs less a call than `EVALSHA`. On by
    /// default, with coalescing; where the server has no functions, or the
    /// user may not load them, calls go by `EVALSHA`. Nothing is loaded
    /// without coalescing (or on a cluster), where every check is one
    /// `EVALSHA`. The library (`ratelimit_<version>`) stays in Redis like any
    /// function: `FUNCTION DELETE` removes it.
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
                ..ConnectOptions::default()
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
        let coalesce = options.coalesce && matches!(target, Target::Single(_));
        let mut backend = RedisBackend {
            conn: Arc::new(Conn {
                target,
                live: std::sync::RwLock::new(None),
                connecting: tokio::sync::Mutex::new(()),
                finishing: AtomicBool::new(false),
                timeout: options.timeout,
                connect_timeout: options.connect_timeout,
                // Without coalescing every check is its own `EVALSHA`.
                try_functions: options.functions && coalesce,
                functions: AtomicBool::new(false),
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
        let [allowed, remaining, reset_us, retry_us] = match self.queue_for_now() {
            Some(batching) => {
                let what = algorithm_index(rule.algorithm()) as u8 + 1;
                let deadline = Instant::now() + self.timeout;
                let job = Job::new(what, rule, key, cost, now, lease, deadline);
                self.queued(batching, job).await?
            }
            None => {
                let _busy = Busy::enter(&*self.busy);
                self.alone(rule, key, cost, now, lease).await?
            }
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

    /// Every check joins a batch, even when nothing is on its way (for
    /// tests of the batch script; without it, checks made one after another
    /// each go alone).
    #[doc(hidden)]
    pub fn batch_every_check(mut self) -> RedisBackend {
        self.always_queue = true;
        self
    }

    /// Queues a check (or release) for the next batch and waits for its
    /// answer, within the deadline.
    async fn queued(
        &self,
        batching: &Batching,
        (job, answer): (Job, Answer),
    ) -> Result<[i64; 4], Error> {
        if !batching.ensure_running(self) || batching.queue.send(job).is_err() {
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
        if batching.home.answers_here() {
            return answered(answer).await;
        }
        // The task runs on a current-thread runtime that is not this one,
        // and runs only while that runtime is driven (a limiter built on one
        // and used elsewhere): this check keeps a timer of its own.
        within(self.timeout, answered(answer)).await
    }

    /// The error of a call that failed (a cluster connection that is gone is
    /// made again at the next call).
    fn failed(&self, error: RedisError) -> Error {
        self.conn.forget(&error);
        Error::backend(error)
    }

    /// Runs the rule's own script for one check: one round trip (two after
    /// the server lost the script or the library). Its function in the
    /// library where that is loaded (the script's prelude and algorithms do
    /// not run again at each call), else the script.
    async fn alone(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Option<u64>,
        lease: Option<u64>,
    ) -> Result<[i64; 4], Error> {
        let index = algorithm_index(rule.algorithm());
        let scripts = &*self.scripts;
        let call = |function: bool| {
            let mut cmd = script_call(
                function,
                &scripts.library.singles[index],
                &scripts.by_algorithm[index],
            );
            cmd.arg(1)
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
            cmd
        };
        let run = async {
            let mut live = self.conn.get(scripts).await?;
            call_script(
                &mut live,
                &self.conn,
                scripts,
                &scripts.by_algorithm[index],
                call,
            )
            .await
            .map_err(|e| self.failed(e))
        };
        let (allowed, remaining, reset_us, retry_us): (i64, i64, i64, i64) =
            within(self.timeout, run).await?;
        Ok([allowed, remaining, reset_us, retry_us])
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

    async fn release(&self, rule: &Rule, key: &str, cost: u64, lease: u64) -> Result<(), Error> {
        let job = || {
            let deadline = Instant::now() + self.timeout;
            Job::new(RELEASE, rule, key, cost, None, Some(lease), deadline)
        };
        if let Some(batching) = self.queue_for_now() {
            return self.queued(batching, job()).await.map(drop);
        }
        let _busy = Busy::enter(&*self.busy);
        if self.batching.is_some() {
            // Coalescing, and nothing on its way: a batch of this one
            // release, sent now (so releases always run in a script,
            // whichever way they go: the library's release function where
            // it is loaded, else the batch script).
            let (job, answer) = job();
            let run = async {
                send_batch(vec![job], &self.conn, &self.scripts, self.timeout).await;
                answer.await
            };
            return answered(run).await.map(drop);
        }
        // The members concurrency.lua adds: "lease" for one unit, else
        // "lease:unit" for each.
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(key);
        if cost == 1 {
            cmd.arg(lease);
        } else {
            for unit in 0..cost {
                cmd.arg(format!("{lease}:{unit}"));
            }
        }
        let run = async {
            let mut live = self.conn.get(&self.scripts).await?;
            match live.query::<i64>(&cmd).await {
                Ok(_) => Ok(()),
                // Another algorithm's state took the key over (a rule
                // changed): no lease of ours is left there to give back.
                Err(e) if e.code() == Some("WRONGTYPE") => Ok(()),
                Err(e) => Err(self.failed(e)),
            }
        };
        within(self.timeout, run).await
    }
}

/// `work`'s result, or [`TimedOut`] once `limit` has passed.
async fn within<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| Err(Error::backend(TimedOut(limit))))
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

/// The task that sends coalesced checks is gone (its Tokio runtime ended).
#[derive(Debug)]
struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the Redis backend's task has stopped (its Tokio runtime ended)")
    }
}

impl std::error::Error for Stopped {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library declares at load, and sets at each call, every name
    /// bind.lua binds (a line of another shape would leave a name unset),
    /// and is named after one version of all it runs: its functions'
    /// names carry it too, and every function is registered.
    #[test]
    fn the_library_binds_what_the_scripts_bind() {
        let library = Library::new();
        let version = library
            .source
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("#!lua name=ratelimit_"))
            .expect("a library header");
        assert_eq!(version.len(), 16);
        assert_eq!(library.function, format!("ratelimit_batch_{version}"));
        assert_eq!(library.release, format!("ratelimit_release_{version}"));
        for (algorithm, single) in Algorithm::ALL.iter().zip(&library.singles) {
            assert_eq!(*single, format!("ratelimit_{}_{version}", algorithm.name()));
        }
        for function in library
            .singles
            .iter()
            .chain([&library.function, &library.release])
        {
            let registered = format!("redis.register_function('{function}', function(KEYS, ARGV)");
            assert_eq!(library.source.matches(&registered).count(), 1, "{function}");
        }
        // Each function sets what bind.lua binds before its body runs.
        assert_eq!(
            library
                .source
                .matches("redis_call, redis_pcall = redis.call, redis.pcall\n")
                .count(),
            8
        );
        for name in [
            "redis_call",
            "redis_pcall",
            "struct_pack",
            "struct_unpack",
            "string_byte",
        ] {
            let declared = library.source.lines().take(3).any(|line| {
                line.strip_prefix("local ")
                    .is_some_and(|names| names.split(", ").any(|n| n == name))
            });
            assert!(declared, "{name} not declared at load");
        }
        let code_lines = BIND.lines().filter(|line| !line.starts_with("--")).count();
        assert_eq!(code_lines, 2, "bind.lua: only `local names = values` lines");
    }

    fn jobs(keys: &[&str]) -> Vec<Job> {
        let rule = Rule::new(Algorithm::FixedWindow, 10, Duration::from_secs(1));
        keys.iter()
            .map(|key| Job::new(1, &rule, key, 1, None, None, Instant::now()).0)
            .collect()
    }

    fn keys(jobs: &[Job]) -> Vec<&str> {
        jobs.iter()
            .map(|job| std::str::from_utf8(job.key.as_bytes()).unwrap())
            .collect()
    }

    #[test]
    fn each_key_comes_first_once_and_its_later_checks_after_all_firsts() {
        let mut batch = jobs(&["b", "a", "b", "c", "a", "b"]);
        let firsts = firsts_first(&mut batch);
        assert_eq!(firsts, 3);
        assert_eq!(keys(&batch[..firsts]), ["a", "b", "c"]);
        let mut repeats = keys(&batch[firsts..]);
        repeats.sort_unstable();
        assert_eq!(repeats, ["a", "b", "b"]);
        // Keys held in place and keys too long for that sort alike.
        let long = "k".repeat(crate::backend::INLINE_KEY + 1);
        let mut batch = jobs(&[&long, "a", &long, "a"]);
        assert_eq!(firsts_first(&mut batch), 2);
        assert_eq!(keys(&batch[..2]), ["a", long.as_str()]);
        let mut repeats = keys(&batch[2..]);
        repeats.sort_unstable();
        assert_eq!(repeats, ["a", long.as_str()]);
    }

    #[test]
    fn distinct_keys_are_all_read_ahead() {
        for n in 0..4 {
            let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let mut batch = jobs(&names.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(firsts_first(&mut batch), n);
        }
        let mut same = jobs(&["k"; 5]);
        assert_eq!(firsts_first(&mut same), 1);
    }
}
