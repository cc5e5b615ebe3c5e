//! Fleet-wide overrides (`RateLimiterBuilder::fleet_overrides`) against a
//! real redis-server: two processes see an `HSET` made with a plain Redis
//! client within a second or two; an `HDEL` gives back the next source's
//! value (the environment's); an override made in code wins over the
//! fleet's; a bad value is logged once and the rest applies; with Redis
//! gone the values last read stay in force, and when it is back (empty)
//! they go. On a cluster, and a limiter dropped takes its fleet values with
//! it.
//!
//! The workers are this test binary run again: the ignored test `worker`,
//! given the Redis URL in `RATELIMIT_FLEET_WORKER` and told what to do on
//! its standard input.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use ratelimit_runtime::overrides::{self, RuleOverride};
use ratelimit_runtime::{Error, RateLimited, RateLimiter, rate_limit};
use ratelimit_test_support::{RedisCluster, RedisServer};

const WORKER_ENV: &str = "RATELIMIT_FLEET_WORKER";
const KEY: &str = "limiter:overrides";
/// The count of `fleet-search` (5 as written) in the workers' environment.
const ENV_COUNT: u64 = 7;
/// How long a change may take to be seen everywhere: read every 500 ms,
/// with room for a loaded machine.
const SEEN_WITHIN: Duration = Duration::from_secs(2);

#[rate_limit(key = "fleet-search", count = 5, period = 3600)]
async fn search() -> Result<(), RateLimited> {
    Ok(())
}

/// One worker process, and the way to talk to it.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    /// Its replies, read from its output by a thread of their own, so a
    /// worker that stops answering fails the test instead of hanging it.
    replies: std::sync::mpsc::Receiver<String>,
}

/// What a worker sees of rule `fleet-search`: its count (from `peek_named`)
/// and whether it is in shadow (from how many of `count + 1` calls pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct View {
    count: u64,
    shadow: bool,
}

impl Worker {
    fn start(url: &str) -> Worker {
        let mut child = common::talking_worker(
            "worker",
            &[
                (WORKER_ENV, url),
                (
                    "RATELIMIT_OVERRIDES",
                    &format!("fleet-search.count={ENV_COUNT}"),
                ),
            ],
        );
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || read_replies(stdout, send));
        let mut worker = Worker {
            child,
            stdin,
            replies,
        };
        assert_eq!(worker.reply(), "ready");
        worker
    }

    fn reply(&mut self) -> String {
        self.replies
            .recv_timeout(Duration::from_secs(30))
            .expect("the worker answers")
    }

    fn ask(&mut self, request: &str) -> String {
        writeln!(self.stdin, "{request}").unwrap();
        self.stdin.flush().unwrap();
        self.reply()
    }

    fn view(&mut self) -> View {
        // A reading that an override's change crossed (the count read
        // before it, the calls made after) is taken again.
        let mut readings = Vec::new();
        while readings.len() < 5 {
            let reply = self.ask("show");
            let (count, passed) = reply.split_once(' ').unwrap();
            let (count, passed): (u64, u64) = (count.parse().unwrap(), passed.parse().unwrap());
            // Of count + 1 calls, count pass, or all of them in shadow.
            if passed == count || passed == count + 1 {
                return View {
                    count,
                    shadow: passed > count,
                };
            }
            readings.push(reply);
        }
        panic!("calls that do not keep the count they read: {readings:?}");
    }

    /// Lines of the worker's log that hold `text`.
    fn log_lines(&mut self, text: &str) -> usize {
        self.ask(&format!("logs {text}")).parse().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends each reply in `output` (what follows `REPLY `; the test harness may
/// have written its own words before it on the line).
fn read_replies(mut output: BufReader<ChildStdout>, replies: std::sync::mpsc::Sender<String>) {
    let mut line = String::new();
    while output.read_line(&mut line).is_ok_and(|read| read > 0) {
        if let Some((_, reply)) = line.trim_end().split_once("REPLY ")
            && replies.send(reply.to_owned()).is_err()
        {
            return;
        }
        line.clear();
    }
}

/// Waits until every worker sees `want`; how long that took.
fn until_seen(workers: &mut [&mut Worker], want: View, what: &str) -> Duration {
    let start = Instant::now();
    for worker in workers.iter_mut() {
        loop {
            let seen = worker.view();
            if seen == want {
                break;
            }
            assert!(
                start.elapsed() < SEEN_WITHIN * 3,
                "{what}: a worker still sees {seen:?}, not {want:?}, after {:?}",
                start.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    start.elapsed()
}

fn hset(conn: &mut redis::Connection, pairs: &[(&str, &str)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(KEY);
    for (field, value) in pairs {
        cmd.arg(*field).arg(*value);
    }
    let _: i64 = cmd.query(conn).unwrap();
}

fn hdel(conn: &mut redis::Connection, field: &str) {
    let _: i64 = redis::cmd("HDEL").arg(KEY).arg(field).query(conn).unwrap();
}

fn view(count: u64, shadow: bool) -> View {
    View { count, shadow }
}

#[test]
fn two_processes_see_a_fleet_override_and_keep_it_while_redis_is_gone() {
    let mut server = RedisServer::start();
    let mut conn = server.connection();
    let (mut a, mut b) = (Worker::start(&server.url()), Worker::start(&server.url()));
    assert_eq!(a.view(), view(ENV_COUNT, false), "the environment's count");
    assert_eq!(b.view(), view(ENV_COUNT, false));

    hset(
        &mut conn,
        &[
            ("fleet-search.count", "20"),
            ("fleet-search.shadow", "true"),
        ],
    );
    let took = until_seen(&mut [&mut a, &mut b], view(20, true), "HSET");
    eprintln!("an HSET seen by both workers after {took:?}");
    assert!(took < SEEN_WITHIN, "seen by both after {took:?}");

    hdel(&mut conn, "fleet-search.count");
    let took = until_seen(&mut [&mut a, &mut b], view(ENV_COUNT, true), "HDEL count");
    assert!(took < SEEN_WITHIN, "seen by both after {took:?}");

    // Code's override comes first: `a` keeps 3 whatever the fleet says.
    assert_eq!(a.ask("set 3"), "ok");
    assert_eq!(a.view(), view(3, true));
    hset(&mut conn, &[("fleet-search.count", "30")]);
    until_seen(&mut [&mut b], view(30, true), "HSET under an API override");
    assert_eq!(a.view(), view(3, true), "set() wins over the fleet's");
    assert_eq!(a.ask("clear"), "ok");
    until_seen(&mut [&mut a], view(30, true), "API override cleared");

    // A bad value is logged once and left out; the rest applies.
    hset(&mut conn, &[("fleet-search.period", "soon")]);
    let bad = "`fleet-search.period`";
    for worker in [&mut a, &mut b] {
        let start = Instant::now();
        while worker.log_lines(bad) == 0 {
            assert!(
                start.elapsed() < SEEN_WITHIN * 3,
                "the bad value was not logged"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    hset(&mut conn, &[("fleet-search.count", "40")]);
    until_seen(
        &mut [&mut a, &mut b],
        view(40, true),
        "HSET beside a bad value",
    );
    // Reads went on meanwhile (they brought 40), the bad value still there.
    assert_eq!(a.log_lines(bad), 1, "logged once");
    assert_eq!(b.log_lines(bad), 1, "logged once");

    // Redis gone: the values last read stay.
    server.kill();
    let down = "cannot be read from Redis";
    for worker in [&mut a, &mut b] {
        let start = Instant::now();
        while worker.log_lines(down) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no failed read logged"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Several more reads fail meanwhile (one every 500 ms).
    std::thread::sleep(Duration::from_millis(2_000));
    for worker in [&mut a, &mut b] {
        assert_eq!(worker.view(), view(40, true), "the last values stay");
        assert_eq!(worker.log_lines(down), 1, "one line, not one per read");
    }

    // Back, and empty (the server kept nothing): the environment's count.
    server.restart();
    until_seen(
        &mut [&mut a, &mut b],
        view(ENV_COUNT, false),
        "Redis back, without the hash",
    );
    assert_eq!(a.log_lines("read from Redis again"), 1);
}

/// Run by the test above in child processes; does nothing on its own.
#[test]
#[ignore = "a worker process of the fleet override tests"]
fn worker() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let logs = common::Logs::default();
    tracing::subscriber::set_global_default(
        logs.subscriber(tracing_subscriber::filter::LevelFilter::INFO),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    overrides::load_env().unwrap();
    let _limiter = runtime.block_on(async {
        RateLimiter::builder()
            .redis(url.as_str())
            .fleet_overrides(true)
            .build()
            .await
            .unwrap()
    });
    println!("REPLY ready");
    for line in std::io::stdin().lines() {
        let line = line.unwrap();
        let reply = match line.split_once(' ').unwrap_or((&line, "")) {
            ("show", _) => runtime.block_on(async {
                // In process memory (the global default): Redis may be gone.
                let count = RateLimiter::in_memory()
                    .peek_named("fleet-search", "")
                    .await
                    .unwrap()
                    .limit;
                let mut passed = 0;
                for _ in 0..=count {
                    passed += u64::from(search().await.is_ok());
                }
                RateLimiter::global()
                    .reset_named("fleet-search", "")
                    .await
                    .unwrap();
                format!("{count} {passed}")
            }),
            ("set", count) => {
                let change = RuleOverride {
                    count: Some(count.parse().unwrap()),
                    ..RuleOverride::default()
                };
                overrides::set("fleet-search", change).unwrap();
                "ok".to_owned()
            }
            ("clear", _) => {
                overrides::clear("fleet-search");
                "ok".to_owned()
            }
            ("logs", text) => logs
                .text()
                .lines()
                .filter(|l| l.contains(text))
                .count()
                .to_string(),
            (other, _) => panic!("unknown request {other:?}"),
        };
        println!("REPLY {reply}");
    }
}

/// The registry is the process's: one test of this process at a time.
static OVERRIDES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn until_in_force(want: Option<RuleOverride>, what: &str) {
    let start = Instant::now();
    while overrides::in_force("fleet-search") != want {
        assert!(
            start.elapsed() < SEEN_WITHIN * 3,
            "{what}: {:?}, not {want:?}",
            overrides::in_force("fleet-search")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn count(count: u64) -> Option<RuleOverride> {
    Some(RuleOverride {
        count: Some(count),
        ..RuleOverride::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_override_on_a_cluster() {
    let _one = OVERRIDES.lock().await;
    let cluster = RedisCluster::start();
    let limiter = RateLimiter::builder()
        .redis(cluster.urls())
        .fleet_overrides(true)
        .build()
        .await
        .unwrap();
    let mut conn = cluster.connection(cluster.master_for(KEY));
    hset(&mut conn, &[("fleet-search.count", "20")]);
    until_in_force(count(20), "HSET on the cluster").await;
    hdel(&mut conn, "fleet-search.count");
    until_in_force(None, "HDEL on the cluster").await;
    drop(limiter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_values_go_with_the_limiter_that_reads_them() {
    let _one = OVERRIDES.lock().await;
    let server = RedisServer::start();
    let mut conn = server.connection();
    hset(&mut conn, &[("fleet-search.count", "20")]);
    let limiter = RateLimiter::builder()
        .redis(server.url().as_str())
        .fleet_overrides(true)
        .build()
        .await
        .unwrap();
    assert_eq!(
        overrides::in_force("fleet-search"),
        count(20),
        "read when built"
    );
    let clone = limiter.clone();
    drop(limiter);
    assert_eq!(
        overrides::in_force("fleet-search"),
        count(20),
        "a clone lives"
    );
    drop(clone);
    assert_eq!(overrides::in_force("fleet-search"), None);
    hset(&mut conn, &[("fleet-search.count", "30")]);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(overrides::in_force("fleet-search"), None, "no longer read");
}

#[tokio::test]
async fn fleet_overrides_need_redis() {
    let error = RateLimiter::builder()
        .fleet_overrides(true)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Config(why) if why.contains("Redis")),
        "{error}"
    );
}
