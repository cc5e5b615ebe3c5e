//! Coalescing: checks that wait for one Redis server at the same moment go
//! together in one call of the batch script, each still atomic.

use std::fmt;
use std::sync::atomic::{self, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::codec::{self, Call, Op, Ran};
use super::connection::{
    Busy, Conn, Endpoint, LATE_ANSWER, call_script, functions_refused, not_run, not_sent,
    script_call,
};
use super::give_back::Delivered;
use super::nodes;
use super::scripts::Scripts;
pub(super) use super::settle::give_back;
use super::settle::settle;
use super::{Expired, RedisBackend, Stopped, TimedOut};
use crate::algorithm::Outcome;
use crate::backend::StoredKey;
use crate::error::Error;

/// The most checks one batch carries (a batch holds the server for its
/// whole run: about a microsecond or two per check).
pub(super) const MAX_BATCH: usize = 128;

/// How many batches may be on their way at once. Several keep the server fed
/// while answered callers queue their next checks: at 16 and 64 tasks 8
/// measured 5-15 % faster than 2, at 256 tasks the same; 32 made batches too
/// small at 256 tasks (`cargo bench --bench load`).
pub(super) const IN_FLIGHT: usize = 8;

/// What a release's caller is told once its batch ran (the script answers
/// checks only).
pub(super) const RELEASED: Outcome = Outcome {
    allowed: true,
    remaining: 0,
    reset_after_us: 0,
    retry_after_us: 0,
    limit: 0,
};

/// Where a job's answer arrives.
pub(super) type AnswerRx = oneshot::Receiver<Result<Delivered, Error>>;

/// Where a job's answer goes.
pub(super) type AnswerTx = oneshot::Sender<Result<Delivered, Error>>;

/// What waits in the queue: one job, or a set of rules' checks (one unit of
/// a batch, all or nothing: see `lua/batch.lua`), which no batch splits.
pub(super) enum Unit {
    /// A check (or release) of its own.
    One(Job),
    /// The checks of one call under several rules, each a member of the
    /// same set ([`Call::in_set`]).
    Set(Vec<Job>),
}

impl Unit {
    fn add_to(self, jobs: &mut Vec<Job>) {
        match self {
            Unit::One(job) => jobs.push(job),
            Unit::Set(set) => jobs.extend(set),
        }
    }
}

/// One check (or release) waiting to be sent in a batch.
pub(super) struct Job {
    pub(super) key: StoredKey,
    pub(super) call: Call,
    /// When its caller stops waiting: the batch task answers it `TimedOut`
    /// by then (so a check costs no timer of its own where that task is sure
    /// to run, see [`Home`]; a batch has one).
    pub(super) deadline: Instant,
    /// Taken when the answer is given.
    pub(super) reply: Option<AnswerTx>,
}

impl Job {
    pub(super) fn new(key: &str, call: Call, deadline: Instant) -> (Job, AnswerRx) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            key: StoredKey::new(key),
            call,
            deadline,
            reply: Some(reply),
        };
        (job, answer)
    }

    fn place(&self) -> u8 {
        self.call.place()
    }

    /// Whether its caller still waits for its answer.
    fn is_waited_for(&self) -> bool {
        self.reply.as_ref().is_some_and(|reply| !reply.is_closed())
    }

    /// A job whose caller is gone, or was never there: it runs unless
    /// nothing needs it (see [`Job::must_run`]).
    pub(super) fn detached(key: StoredKey, call: Call) -> Job {
        Job {
            key,
            call,
            deadline: Instant::now() + Duration::from_secs(1),
            reply: None,
        }
    }

    fn fail(mut self, error: Error) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(Err(error));
        }
    }

    /// Whether it runs whether or not anyone waits for it: a release, and
    /// the give-backs of a caller that is gone (no reply).
    fn must_run(&self) -> bool {
        self.call.op == Op::Release || self.reply.is_none()
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
pub(super) struct Batching {
    pub(super) queue: mpsc::UnboundedSender<Unit>,
    /// The queue's receiving end, held by the running task.
    pub(super) jobs: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Unit>>>,
    /// Whether the task runs (cleared when it ends, or is dropped with its
    /// runtime).
    pub(super) running: Arc<AtomicBool>,
    /// The runtime the task was last started on.
    pub(super) home: Arc<Home>,
}

/// The runtime the batch task runs on: whether it answers a check by its
/// deadline with no timer of the check's own. A multi-thread runtime's
/// workers run the task whoever waits; a current-thread runtime runs it only
/// while it is driven, as it is when the check runs on it.
#[derive(Debug, Default)]
pub(super) struct Home {
    multi_thread: AtomicBool,
    /// A current-thread runtime's id.
    current_thread: std::sync::Mutex<Option<tokio::runtime::Id>>,
}

impl Home {
    pub(super) fn set(&self, runtime: &tokio::runtime::Handle) {
        let multi = runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        *self
            .current_thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (!multi).then(|| runtime.id());
        self.multi_thread.store(multi, Ordering::Release);
    }

    /// Whether the task answers a check made here by its deadline.
    pub(super) fn answers_here(&self) -> bool {
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
    pub(super) fn ensure_running(&self, backend: &RedisBackend) -> bool {
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
pub(super) struct Running {
    flag: Arc<AtomicBool>,
    queue: Option<OwnedMutexGuard<mpsc::UnboundedReceiver<Unit>>>,
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
pub(super) async fn run_batches(
    queue: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Unit>>>,
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
        let mut units = Vec::with_capacity(16);
        if queue.recv_many(&mut units, MAX_BATCH).await == 0 {
            return;
        }
        // A set is one unit of several checks: the units taken may hold
        // more checks than a batch, which go in batches of their own.
        let mut batches: Vec<Vec<Job>> = vec![Vec::with_capacity(units.len())];
        units
            .into_iter()
            .for_each(|unit| add_unit(&mut batches, unit));
        // Let the tasks just woken by the last answer queue their next
        // checks before this batch leaves (a lone check waits for one yield;
        // under load batches come out several times larger).
        tokio::task::yield_now().await;
        while batches.len() == 1 && batches[0].len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(unit) => add_unit(&mut batches, unit),
                Err(_) => break,
            }
        }
        // Held until every call of the batches is answered.
        let held = Arc::new((slot, Busy::enter(Arc::clone(&busy))));
        for calls in batches.into_iter().flat_map(|jobs| by_call(jobs, &conn)) {
            let (conn, scripts, held) =
                (Arc::clone(&conn), Arc::clone(&scripts), Arc::clone(&held));
            tokio::spawn(async move {
                send_batch(calls, &conn, &scripts, timeout).await;
                drop(held);
            });
        }
    }
}

/// Adds `unit` to the last of `batches`, or to a new one when that one is
/// full: a batch holds at most [`MAX_BATCH`] checks, and a set's members
/// more, never more than fit the script's one-byte numbers of its rules.
fn add_unit(batches: &mut Vec<Vec<Job>>, unit: Unit) {
    if batches.last().is_none_or(|jobs| jobs.len() >= MAX_BATCH) {
        batches.push(Vec::new());
    }
    if let Some(jobs) = batches.last_mut() {
        unit.add_to(jobs);
    }
}

/// Jobs in the groups that go in one script call each: all of them on a
/// single server; on a cluster, one group per master by the slot map, or
/// each alone where no map is known (see [`nodes`]). A set's members stay
/// together, in the group of its first member's master.
pub(super) fn by_call(jobs: Vec<Job>, conn: &Conn) -> Vec<Vec<Job>> {
    if !matches!(conn.endpoint, Endpoint::Cluster(_)) {
        return vec![jobs];
    }
    let map = conn.slot_map();
    if jobs.iter().all(|job| job.call.set == 0) {
        return match map {
            Some(map) => nodes::by_master(jobs, &map, |job| job.key.as_bytes()),
            None => jobs.into_iter().map(|job| vec![job]).collect(),
        };
    }
    let mut units: Vec<Vec<Job>> = Vec::with_capacity(jobs.len());
    let mut sets: Vec<(u32, usize)> = Vec::new();
    for job in jobs {
        let set = job.call.set;
        match sets.iter().find(|(s, _)| set != 0 && *s == set) {
            Some(&(_, at)) => units[at].push(job),
            None => {
                if set != 0 {
                    sets.push((set, units.len()));
                }
                units.push(vec![job]);
            }
        }
    }
    match map {
        Some(map) => nodes::by_master(units, &map, |unit| unit[0].key.as_bytes())
            .into_iter()
            .map(|group| group.into_iter().flatten().collect())
            .collect(),
        None => units,
    }
}

/// A cluster master answered that a key of its batch is not its own (the
/// slot map was out of date): nothing of the batch ran. A set of rules met
/// by it is answered so, and its caller sends it by itself.
#[derive(Debug)]
pub(super) struct NotHere;

impl fmt::Display for NotHere {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key of the batch is not on the master it was sent to")
    }
}

impl std::error::Error for NotHere {}

/// Runs one batch and hands each check its answer, or `TimedOut` at its own
/// deadline, whichever comes first.
///
/// A check whose caller gave up before it left is not sent; one that waited
/// in the queue past its deadline is answered `Expired` without being sent
/// (a release is sent all the same: a lease must not stay held). Each check
/// carries its deadline in the server's time, estimated from the times
/// earlier answers carried, so that the script does not run a check whose
/// caller stopped waiting (Redis paused or slow): it would be counted in
/// Redis after the caller was answered by the failure policy. A check the
/// script ran in time whose answer came back after its caller stopped
/// waiting (Redis stalled between running it and answering) is given back:
/// its lease released, or its cost refunded. So Redis keeps only what
/// callers were told it allowed.
pub(super) async fn send_batch(
    mut jobs: Vec<Job>,
    conn: &Arc<Conn>,
    scripts: &Arc<Scripts>,
    timeout: Duration,
) {
    // A check whose caller gave up (cancelled) is not run.
    jobs.retain(|job| job.must_run() || job.is_waited_for());
    let now = Instant::now();
    for late in jobs.extract_if(.., |job| !job.must_run() && job.deadline <= now) {
        late.fail(Error::backend(Expired(timeout)));
    }
    let Some(latest) = jobs.iter().map(|job| job.deadline).max() else {
        return;
    };
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("ratelimit_batch_size").record(jobs.len() as f64);
    // The checks that keep a string state first (each key's first one read
    // ahead), then the other checks, then the releases (see batch.lua).
    jobs.sort_unstable_by_key(Job::place);
    let checks = jobs.partition_point(|job| job.place() < 3);
    let strings = jobs.partition_point(|job| job.place() < 1);
    let read_ahead = firsts_first(&mut jobs[..strings]);
    // Each check's deadline in the server's time, less a margin for its
    // answer's way back.
    let margin = timeout / 5;
    for job in jobs[..checks].iter_mut().filter(|job| !job.must_run()) {
        job.call.deadline = conn.server_deadline(job.deadline, margin);
    }
    // The answers go out as they are due: each job's own reply.
    let mut replies: Vec<(Instant, Option<AnswerTx>)> = jobs
        .iter_mut()
        .map(|job| (job.deadline, job.reply.take()))
        .collect();
    // The call, owning what it sends (it may outlive this function): FCALL
    // of the library's function, or EVALSHA of the script.
    let wire: Arc<[(StoredKey, Call)]> = jobs.into_iter().map(|job| (job.key, job.call)).collect();
    let run = {
        let (conn, scripts, wire) = (Arc::clone(conn), Arc::clone(scripts), Arc::clone(&wire));
        Box::pin(async move {
            let script = scripts.for_calls(wire.iter().map(|(_, call)| call));
            // Several calls on a cluster: keys of several slots, which one
            // master serves (see `by_call`), go as arguments of the
            // library's `node` function, sent to the master of the first.
            let spread = matches!(conn.endpoint, Endpoint::Cluster(_)) && wire.len() > 1;
            let call = |function: bool| {
                if function && let [(key, call)] = &wire[..] {
                    // Alone: the library's leaner function for one call.
                    let mut cmd = redis::cmd("FCALL");
                    cmd.arg(&scripts.library.one);
                    codec::encode_one(&mut cmd, key.as_bytes(), call);
                    return cmd;
                }
                let mut cmd = if function && spread {
                    let mut cmd = redis::cmd("FCALL");
                    cmd.arg(&scripts.library.node).arg(0);
                    cmd
                } else {
                    script_call(function, &scripts.library.function, script)
                };
                let calls = wire.iter().map(|(key, call)| (key.as_bytes(), call));
                codec::encode(&mut cmd, calls, read_ahead);
                cmd
            };
            let route = spread.then(|| wire[0].0.as_bytes());
            conn.restore_functions(&scripts);
            let mut live = conn.get(&scripts).await?;
            let reply =
                call_script::<Vec<u8>>(&mut live, &conn, &scripts.library, script, route, call)
                    .await;
            // A refusal just met: the library is tried again at once where
            // it was only missing.
            conn.restore_functions(&scripts);
            match reply {
                Ok(reply) if codec::not_here(&reply) => Err(Error::backend(NotHere)),
                // A redirect, a node not ready, or the library refused:
                // nothing ran (alone, each call goes by EVALSHA).
                Err(error)
                    if spread
                        && (not_run(&error) || functions_refused(&error) || not_sent(&error)) =>
                {
                    Err(Error::backend(NotHere))
                }
                Ok(reply) => Ok(reply),
                Err(error) => {
                    // A cluster connection that is gone is made again next time.
                    conn.forget(&error);
                    Err(Error::backend(error))
                }
            }
        })
    };
    // Give-backs alone (no caller waits for an answer): whoever sends them
    // waits until they ran (a refused set's caller is answered only once
    // what the set took is given back), within the late answers' bound.
    if replies.iter().all(|(_, reply)| reply.is_none()) {
        if let Ok(reply) = tokio::time::timeout(LATE_ANSWER.max(timeout), run).await {
            settle(reply, &wire, checks, replies, conn, scripts, timeout);
        }
        return;
    }
    // One timer at a time: the next caller's deadline. Once every caller
    // is answered, the answer is waited for in the background. Callers
    // that stop waiting share one failure: this round trip's, which the
    // breaker counts once however many checks it carried.
    let timed_out = Shared::new(Error::backend(TimedOut(timeout)));
    let mut run = run;
    let reply = loop {
        let next = replies
            .iter()
            .filter(|(_, reply)| reply.is_some())
            .map(|(deadline, _)| *deadline)
            .min();
        let Some(next) = next.filter(|_| Instant::now() < latest) else {
            break None;
        };
        tokio::select! {
            reply = &mut run => break Some(reply),
            () = tokio::time::sleep_until(next) => {
                // These callers stop waiting now; their checks may still be
                // in the script's queue, which skips them past their
                // deadline.
                let now = Instant::now();
                for (deadline, reply) in &mut replies {
                    if *deadline <= now
                        && let Some(reply) = reply.take()
                    {
                        let _ = reply.send(Err(Error::backend(timed_out.clone())));
                    }
                }
            }
        }
    };
    let Some(reply) = reply else {
        for (_, reply) in &mut replies {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Err(Error::backend(timed_out.clone())));
            }
        }
        if conn.current().is_none() && !conn.finishing.swap(true, Ordering::AcqRel) {
            // The connection was being made when the checks ran out of
            // time: an attempt goes on (within the connect timeout) for
            // the checks to come.
            let (conn, scripts) = (Arc::clone(conn), Arc::clone(scripts));
            tokio::spawn(async move {
                let _ = conn.get(&scripts).await;
                conn.finishing.store(false, Ordering::Release);
            });
        }
        // Nobody waits for the answer any more, but it may still come.
        let (conn, scripts) = (Arc::clone(conn), Arc::clone(scripts));
        tokio::spawn(async move {
            if let Ok(reply) = tokio::time::timeout(LATE_ANSWER, run).await {
                let now = Instant::now();
                let replies = (0..wire.len()).map(|_| (now, None)).collect();
                settle(reply, &wire, checks, replies, &conn, &scripts, timeout);
            }
        });
        return;
    };
    settle(reply, &wire, checks, replies, conn, scripts, timeout);
}

/// A job's answer. The batch task gives it by the job's deadline, or drops
/// the job when the task is gone (its runtime ended).
pub(super) async fn answered(
    answer: impl Future<Output = Result<Result<Delivered, Error>, oneshot::error::RecvError>>,
) -> Result<Ran, Error> {
    match answer.await {
        Ok(answer) => answer.map(Delivered::read),
        Err(_) => Err(Error::backend(Stopped)),
    }
}

/// Puts the first check of each key first, and a key's later checks (a hot
/// key checked again in the same batch) after all of those: the script reads
/// the first ones' states ahead, in one `MGET` of distinct keys, and each
/// later one its own, after its key's first check has written it. Answers
/// how many come first. Checks that wait at the same moment have no order
/// among them, so any order of a key's checks is right.
pub(super) fn firsts_first(jobs: &mut [Job]) -> usize {
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
pub(super) struct Shared {
    error: Arc<Error>,
    /// The failed round trip's number: the same for every check of the
    /// batch, another for every batch.
    trip: u64,
}

impl Shared {
    pub(super) fn new(error: Error) -> Shared {
        static TRIPS: AtomicU64 = AtomicU64::new(1);
        Shared {
            error: Arc::new(error),
            trip: TRIPS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The failed round trip this error came from.
    pub(super) fn round_trip(&self) -> u64 {
        self.trip
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.error {
            Error::Backend(source) => fmt::Display::fmt(source, f),
            other => fmt::Display::fmt(other, f),
        }
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.error {
            Error::Backend(source) => source.source(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::TimeSource;
    use super::*;
    use crate::rule::{Algorithm, Rule};

    fn jobs(keys: &[&str]) -> Vec<Job> {
        let rule = Rule::new(Algorithm::FixedWindow, 10, Duration::from_secs(1));
        keys.iter()
            .map(|key| {
                let call = Call::new(
                    Op::Check(rule.algorithm()),
                    &rule,
                    1,
                    TimeSource::Server,
                    None,
                );
                Job::new(key, call, Instant::now()).0
            })
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
