//! Redis failing under a limiter: paused (SIGSTOP), killed and restarted
//! under load, a server that accepts but never answers, a start without
//! Redis; and the over-limit cache. Every call has a deadline; no call hangs
//! or panics; each policy does what it says; the limiter goes back to Redis
//! by itself. Time limits are checked with wide margins.

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{Backend, Error, OnError, RateLimiter, Rule};
use ratelimit_test_support::{RedisServer, first_ok, script_calls};

mod common;

const DEADLINE: Duration = Duration::from_millis(100);

async fn limiter(url: String, on_error: OnError) -> RateLimiter {
    RateLimiter::builder()
        .redis(url)
        .timeout(DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .on_backend_error(on_error)
        .build()
        .await
        .expect("connecting to the test redis-server")
}

/// Times one check: it must come back well within a second.
async fn timed<T>(check: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = check.await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "a check took {:?}",
        started.elapsed()
    );
    out
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut server.connection())
        .map(|n| n == 1)
        .unwrap_or(false)
}

/// Waits (bounded) until `key` shows up in Redis: the limiter writes to
/// Redis again. Returns how long that took.
async fn until_in_redis(
    server: &RedisServer,
    limiter: &RateLimiter,
    rule: &Rule,
    key: &str,
) -> Duration {
    let started = Instant::now();
    while !exists(server, key) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the limiter never went back to Redis"
        );
        let _ = limiter.check(rule, key).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_hangs_no_call_and_each_policy_does_what_it_says() {
    let server = RedisServer::start();
    let local = limiter(server.url(), OnError::Local).await;
    let allow = limiter(server.url(), OnError::Allow).await;
    let deny = limiter(server.url(), OnError::Deny).await;
    let rule = Rule::fixed_window(2, Duration::from_secs(60));
    for (i, l) in [&local, &allow, &deny].into_iter().enumerate() {
        assert!(
            l.check(&rule, &format!("limiter:before:{i}"))
                .await
                .unwrap()
                .allowed
        );
    }

    server.pause();
    // local: the same rule, in process memory.
    let outcomes: Vec<bool> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(
                timed(local.check(&rule, "limiter:paused"))
                    .await
                    .unwrap()
                    .allowed,
            );
        }
        out
    };
    assert_eq!(outcomes, [true, true, false, false]);
    // allow: everything through.
    for _ in 0..4 {
        assert!(
            timed(allow.check(&rule, "limiter:paused"))
                .await
                .unwrap()
                .allowed
        );
    }
    // deny: refused, as a backend failure (not "over the limit").
    for _ in 0..4 {
        let error = timed(deny.check(&rule, "limiter:paused"))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Backend(_)), "{error}");
    }

    server.resume();
    for l in [&local, &allow, &deny] {
        let back = until_in_redis(&server, l, &rule, "limiter:after").await;
        eprintln!("back on Redis {back:?} after SIGCONT");
        assert!(
            back < Duration::from_secs(1),
            "back on Redis after {back:?}"
        );
        redis::cmd("DEL")
            .arg("limiter:after")
            .query::<()>(&mut server.connection())
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_under_load_no_call_hangs_and_redis_is_used_again() {
    let mut server = RedisServer::start();
    let limiter = limiter(server.url(), OnError::Local).await;
    // Never refuses here, and its state lives a minute (so it shows in Redis).
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let stop = Arc::new(AtomicBool::new(false));
    let slowest_ms = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..8)
        .map(|task| {
            let (limiter, stop, slowest_ms, calls) = (
                limiter.clone(),
                stop.clone(),
                slowest_ms.clone(),
                calls.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let decision = limiter.check(&rule, &format!("limiter:load:{task}")).await;
                    assert!(decision.expect("local policy: always an answer").allowed);
                    slowest_ms.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    calls.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let during_outage = calls.load(Ordering::Relaxed);
    server.restart();
    let back = until_in_redis(&server, &limiter, &rule, "limiter:load:0").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("no task panicked");
    }
    eprintln!(
        "back on Redis {back:?} after the restart; slowest call {:?}",
        Duration::from_millis(slowest_ms.load(Ordering::Relaxed))
    );
    assert!(
        back < Duration::from_secs(1),
        "back on Redis {back:?} after it restarted"
    );
    assert!(
        calls.load(Ordering::Relaxed) > during_outage,
        "calls went on"
    );
    let slowest = Duration::from_millis(slowest_ms.load(Ordering::Relaxed));
    assert!(
        slowest < Duration::from_secs(1),
        "the slowest call took {slowest:?}"
    );
    server.assert_all_keys_expire("limiter:*");
}

/// A TCP server that accepts connections and reads, but never answers.
fn silent_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut sink = [0u8; 1024];
                while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_costs_a_deadline_not_a_hang() {
    let addr = silent_server();
    let url = format!("redis://{addr}/");
    let started = Instant::now();
    let refused = RateLimiter::builder()
        .redis(url.as_str())
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await;
    assert!(matches!(refused, Err(Error::Backend(_))), "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "build took {:?}",
        started.elapsed()
    );

    let limiter = RateLimiter::builder()
        .redis(url.as_str())
        .connect_timeout(Duration::from_millis(300))
        .timeout(DEADLINE)
        .probe_interval(Duration::from_millis(250))
        .start_degraded(true)
        .build()
        .await
        .expect("a degraded start");
    let rule = Rule::sliding_log(5, Duration::from_secs(60));
    let started = Instant::now();
    let mut allowed = 0;
    for _ in 0..40 {
        if timed(limiter.check(&rule, "limiter:silent"))
            .await
            .unwrap()
            .allowed
        {
            allowed += 1;
        }
    }
    assert_eq!(
        allowed, 5,
        "the local insurance enforces the rule meanwhile"
    );
    // Without the circuit breaker, 40 checks would wait 40 deadlines (4 s).
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the breaker did not stop the waiting: {:?}",
        started.elapsed()
    );
}

/// A backend whose every check goes in a batch, with the tests' deadline.
async fn batching(url: &str, lazy: bool) -> RedisBackend {
    let options = ConnectOptions {
        timeout: DEADLINE,
        connect_timeout: Duration::from_millis(1500),
        lazy,
        ..ConnectOptions::default()
    };
    RedisBackend::connect(url, options)
        .await
        .expect("connecting to the test redis-server")
        .batch_every_check()
}

/// Checks that wait for batches have no timer of their own: the task that
/// sends the batches answers each by its deadline. With Redis paused, far
/// more checks than the batches in flight hold (8 of 128): the first
/// batches time out in Redis, the checks queued behind them in the queue,
/// each with its deadline's error and all within a few deadlines. Sent
/// batch after batch, the last would wait 20 deadlines (10 s): the bounds
/// (4 deadlines a check, 8 for all) leave room for a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_fails_every_batched_check_by_its_deadline() {
    const PAUSED_DEADLINE: Duration = Duration::from_millis(500);
    let server = RedisServer::start();
    let options = ConnectOptions {
        timeout: PAUSED_DEADLINE,
        ..ConnectOptions::default()
    };
    let backend = RedisBackend::connect(&server.url(), options)
        .await
        .expect("connecting to the test redis-server")
        .batch_every_check();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    assert!(
        backend
            .check(&rule, "limiter:batched", 1)
            .await
            .unwrap()
            .allowed
    );

    server.pause();
    let started = Instant::now();
    let checks: Vec<_> = (0..20_000)
        .map(|i| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let answer = backend
                    .check(&rule, &format!("limiter:batched:{i}"), 1)
                    .await;
                (answer, started.elapsed())
            })
        })
        .collect();
    for check in checks {
        let (answer, took) = check.await.expect("no check panicked");
        let error = answer.expect_err("Redis is paused").to_string();
        assert!(
            error.contains("did not answer within 500 ms")
                || error.contains("longer than its deadline (500ms)"),
            "{error}"
        );
        assert!(took < 4 * PAUSED_DEADLINE, "a check took {took:?}");
    }
    assert!(
        started.elapsed() < 8 * PAUSED_DEADLINE,
        "20,000 checks took {:?}",
        started.elapsed()
    );

    server.resume();
    second_call_passes(&backend, &rule, "limiter:batched", Duration::from_secs(2)).await;
}

/// A check whose caller gave up is not counted. Redis is paused while
/// checks keep coming and each times out; when it resumes, it used to run
/// every check still queued in its socket, counting calls whose callers had
/// been told "failed" (a phantom count: about a hundred a pause here, each
/// of the 32 tasks sending one check per deadline). Each check now carries
/// its deadline in the server's time and the script skips one it reaches
/// too late. What is left is an answer already on its way back as its
/// deadline passed (Redis paused between running a batch and sending its
/// answer): at most the one check each task has on its way at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_counts_only_the_checks_it_answered_in_time() {
    let server = RedisServer::start();
    let backend = batching(&server.url(), false).await;
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let key = "limiter:phantom";
    let stop = Arc::new(AtomicBool::new(false));
    let allowed = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (backend, stop, allowed) = (backend.clone(), stop.clone(), allowed.clone());
            tokio::spawn(async move {
                let mut rounds = 0;
                while !stop.load(Ordering::Relaxed) && rounds < 100_000 {
                    rounds += 1;
                    match backend.check(&rule, key, 1).await {
                        Ok(decision) => {
                            assert!(decision.allowed, "{decision:?}");
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                        // Redis did not answer in time.
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            })
        })
        .collect();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        server.pause();
        tokio::time::sleep(Duration::from_millis(400)).await;
        server.resume();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("no task panicked");
    }
    let told = allowed.load(Ordering::Relaxed);
    assert!(told > 0, "some checks were answered by Redis");
    // A check Redis ran in time whose answer came back too late is refunded
    // once the answer is in: wait for those refunds (bounded).
    let counted = || {
        let (tag, numbers) = server.stored_state(key).expect("the key's state");
        assert_eq!(tag, 'F');
        numbers[0] as u64
    };
    let settled = Instant::now() + Duration::from_secs(2);
    while counted() != told && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        counted(),
        told,
        "Redis counted other than the checks callers were told it allowed"
    );
}

/// Checks `key` until Redis answers (bounded): the key's second call, with
/// its first one kept.
async fn second_call_passes(backend: &RedisBackend, rule: &Rule, key: &str, within: Duration) {
    let started = Instant::now();
    loop {
        match backend.check(rule, key, 1).await {
            Ok(decision) => {
                assert_eq!(
                    decision.remaining,
                    rule.count() - 2,
                    "{key}: its first call kept"
                );
                return;
            }
            Err(error) => {
                assert!(
                    started.elapsed() < within,
                    "{key}: Redis does not answer again: {error}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A lazy start against a server that never answers: batched checks time
/// out by their deadline (100 ms), far shorter than the connect timeout (1.5
/// s), while connecting goes on behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_checks_do_not_wait_for_a_connection_being_made() {
    let url = format!("redis://{}/", silent_server());
    let backend = batching(&url, true).await;
    let rule = Rule::gcra(10, Duration::from_secs(1));
    for round in 0..5 {
        let checks: Vec<_> = (0..64)
            .map(|i| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let answer = backend.check(&rule, &format!("limiter:lazy:{i}"), 1).await;
                    (answer, started.elapsed())
                })
            })
            .collect();
        for check in checks {
            let (answer, took) = check.await.expect("no check panicked");
            assert!(matches!(answer, Err(Error::Backend(_))), "{answer:?}");
            assert!(
                took < Duration::from_secs(1),
                "round {round}: a check waited {took:?} (deadline 100 ms, connect timeout 1.5 s)"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_start_goes_to_redis_once_it_is_there() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let limiter = RateLimiter::builder()
        .redis(url)
        .connect_timeout(Duration::from_millis(200))
        .timeout(DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .start_degraded(true)
        .build()
        .await
        .expect("starts without Redis");
    let rule = Rule::token_bucket(10, Duration::from_secs(1));
    assert!(
        timed(limiter.check(&rule, "limiter:late"))
            .await
            .unwrap()
            .allowed
    );
    server.restart();
    let back = until_in_redis(&server, &limiter, &rule, "limiter:late").await;
    eprintln!("on Redis {back:?} after it started");
    assert!(
        back < Duration::from_secs(1),
        "on Redis {back:?} after it started"
    );
}

/// One round trip that timed out is one failure for the breaker, however
/// many checks it carried: a stall as short as a deadline (a fork for a
/// snapshot, say) does not open the circuit and refuse every call under
/// `deny`. Each caller counted as a failure of its own, so one batch of
/// three or more checks opened it.
///
/// On one thread, the checks spawned at once are all queued before the
/// batch task runs: they go in one call.
#[tokio::test]
async fn a_timed_out_batch_is_one_failure_for_the_breaker() {
    let server = RedisServer::start();
    let deny = RateLimiter::builder()
        .redis(server.url())
        .timeout(DEADLINE)
        .probe_interval(Duration::from_secs(30))
        .on_backend_error(OnError::Deny)
        .build()
        .await
        .unwrap();
    let rule = Rule::fixed_window(5, Duration::from_secs(60));
    assert!(deny.check(&rule, "limiter:warm").await.unwrap().allowed);
    server.pause();
    let checks: Vec<_> = (0..12)
        .map(|i| {
            let (deny, key) = (deny.clone(), format!("limiter:stalled:{i}"));
            tokio::spawn(async move { deny.check(&rule, &key).await })
        })
        .collect();
    for check in checks {
        let failed = check.await.unwrap();
        assert!(matches!(failed, Err(Error::Backend(_))), "{failed:?}");
    }
    server.resume();
    let after = deny.check(&rule, "limiter:after").await;
    assert!(
        after.as_ref().is_ok_and(|d| d.allowed),
        "one failed round trip left the circuit closed: {after:?}"
    );
}

/// A limiter on `server` with the over-limit cache on.
async fn caching_limiter(server: &RedisServer) -> RateLimiter {
    RateLimiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .over_limit_cache(true)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_limit_cache_refuses_locally_until_the_time_redis_named() {
    let server = RedisServer::start();
    let limiter = caching_limiter(&server).await;
    let rule = Rule::fixed_window(2, Duration::from_millis(1500));
    assert!(limiter.check(&rule, "limiter:flood").await.unwrap().allowed);
    assert!(limiter.check(&rule, "limiter:flood").await.unwrap().allowed);
    let refused = limiter.check(&rule, "limiter:flood").await.unwrap();
    assert!(!refused.allowed);
    let before = script_calls(&mut server.connection());
    for _ in 0..50 {
        let local = limiter.check(&rule, "limiter:flood").await.unwrap();
        assert!(!local.allowed);
        assert!(local.retry_after <= refused.retry_after);
    }
    assert_eq!(
        script_calls(&mut server.connection()),
        before,
        "50 refusals without a round trip"
    );
    // Other keys still go to Redis.
    assert!(limiter.check(&rule, "limiter:calm").await.unwrap().allowed);
    assert_eq!(script_calls(&mut server.connection()), before + 1);
    // Past the time Redis named, Redis decides again (and allows).
    tokio::time::sleep(refused.retry_after + Duration::from_millis(20)).await;
    assert!(limiter.check(&rule, "limiter:flood").await.unwrap().allowed);
    assert_eq!(script_calls(&mut server.connection()), before + 2);
}

/// The over-limit cache follows the rule: after an override raises `count`
/// (the pipeline then checks under the raised rule), Redis decides again at
/// once, where the cache kept refusing until the old rule's `retry_after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_limit_cache_asks_redis_again_under_a_changed_rule() {
    let server = RedisServer::start();
    let limiter = caching_limiter(&server).await;
    let written = Rule::fixed_window(1, Duration::from_secs(3600));
    let raised = Rule::fixed_window(5, Duration::from_secs(3600));
    assert!(
        limiter
            .check(&written, "limiter:raised")
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !limiter
            .check(&written, "limiter:raised")
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !limiter
            .check(&written, "limiter:raised")
            .await
            .unwrap()
            .allowed,
        "refused from the cache"
    );
    let under_raised = limiter.check(&raised, "limiter:raised").await.unwrap();
    assert!(
        under_raised.allowed,
        "the raised rule lets the call through at once: {under_raised:?}"
    );
    assert_eq!(under_raised.remaining, 3);
}

/// A limiter built on a runtime that then ends: the task that sends batched
/// checks ended with it, and the checks that waited for a batch failed from
/// then on. It starts again on the runtime that checks.
#[test]
fn a_limiter_outlives_the_runtime_it_was_built_on() {
    let server = RedisServer::start();
    let builder = RateLimiter::builder()
        .redis(server.url())
        .timeout(DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .on_backend_error(OnError::Deny);
    let rounds = common::rounds_until_it_outlives_its_runtime(builder, "limiter:outlived:");
    assert!(rounds <= 3, "took {rounds} rounds");
    for i in 0..32 {
        assert!(exists(&server, &format!("limiter:outlived:{i}")), "key {i}");
    }
}

/// The runtime that runs the batch task ends while checks made on another
/// runtime wait in its queue (Redis paused, the batches in flight stuck, the
/// deadline long). Those checks have no timer of their own: they hear at
/// once that the task stopped, instead of waiting for it; the next checks
/// start a new task on their own runtime, and pass once Redis is back.
#[test]
fn checks_queued_when_the_batch_task_ends_hear_it_at_once() {
    let server = RedisServer::start();
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let backend = batching_on(
        &first,
        &server,
        Duration::from_secs(30),
        &rule,
        "limiter:ended",
    );

    server.pause();
    let second = two_workers();
    let waiting: Vec<_> = (0..2000)
        .map(|i| {
            let backend = backend.clone();
            second
                .spawn(async move { backend.check(&rule, &format!("limiter:ended:{i}"), 1).await })
        })
        .collect();
    // The batches in flight wait on the paused server, the rest in the queue.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        waiting.iter().all(|check| !check.is_finished()),
        "a check was answered while Redis was paused and the deadline 30 s away"
    );
    first.shutdown_background();
    second.block_on(each_fails_within(
        waiting,
        Duration::from_secs(5),
        "a check still waits for the batch task that ended",
    ));

    server.resume();
    second.block_on(second_call_passes(
        &backend,
        &rule,
        "limiter:ended",
        Duration::from_secs(10),
    ));
}

/// A backend built on a current-thread runtime that is kept but no longer
/// driven: its batch task never runs again. Checks made on another runtime
/// still come back by their deadline (they keep a timer of their own there),
/// failing, not hanging.
#[test]
fn checks_whose_batch_task_is_not_driven_fail_by_their_deadline() {
    let server = RedisServer::start();
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let backend = batching_on(&first, &server, DEADLINE, &rule, "limiter:undriven");
    // `first` lives on, not driven.
    let second = two_workers();
    second.block_on(async {
        let checks: Vec<_> = (0..64)
            .map(|i| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    backend
                        .check(&rule, &format!("limiter:undriven:{i}"), 1)
                        .await
                })
            })
            .collect();
        each_fails_within(
            checks,
            Duration::from_secs(1),
            "a check waits for a batch task that never runs",
        )
        .await;
    });
    drop(first);
}

/// Each check comes back within `limit` (else fails with `hanging`), with a
/// backend error.
async fn each_fails_within<T: std::fmt::Debug>(
    checks: Vec<tokio::task::JoinHandle<Result<T, Error>>>,
    limit: Duration,
    hanging: &str,
) {
    for check in checks {
        let answer = tokio::time::timeout(limit, check)
            .await
            .expect(hanging)
            .expect("no check panicked");
        assert!(matches!(answer, Err(Error::Backend(_))), "{answer:?}");
    }
}

/// A backend whose every check goes in a batch, opened on `runtime`, which
/// then runs its batch task (its first check, of `key`, passes there).
fn batching_on(
    runtime: &tokio::runtime::Runtime,
    server: &RedisServer,
    timeout: Duration,
    rule: &Rule,
    key: &str,
) -> RedisBackend {
    let options = ConnectOptions {
        timeout,
        ..ConnectOptions::default()
    };
    let backend = runtime
        .block_on(RedisBackend::connect(&server.url(), options))
        .expect("connecting to the test redis-server")
        .batch_every_check();
    assert!(
        runtime
            .block_on(backend.check(rule, key, 1))
            .unwrap()
            .allowed
    );
    backend
}

fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A check whose reply was lost after the server ran it (the connection
/// dropped) is the caller's error, counted once by the server: the
/// connection manager does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_reply_was_lost_is_counted_once() {
    let server = RedisServer::start();
    let proxy = ratelimit_test_support::Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let redis = RedisBackend::connect(
        &url,
        ConnectOptions {
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let rule = Rule::fixed_window(10, Duration::from_secs(60));
    let key = "limiter:lost-reply";
    let counted = || server.stored_state(key).expect("a fixed window").1[0];
    assert!(redis.check(&rule, key, 1).await.unwrap().allowed);
    assert_eq!(counted(), 1.0);

    proxy.lose_reply_to(key.as_bytes());
    let lost = redis.check(&rule, key, 1).await;
    assert!(lost.is_err(), "the reply was lost: {lost:?}");
    assert_eq!(counted(), 2.0, "the server ran the check once");
    let decision = first_ok("no new connection", Duration::from_millis(50), || {
        redis.check(&rule, key, 1)
    })
    .await;
    assert_eq!(decision.remaining, 10 - 3);
}

/// A check and a lease that Redis ran in time but whose answers came back
/// after their callers' deadlines (held back on the way) are given back
/// once the answers are in: the check's cost refunded, the lease released.
/// Before, the answers were not waited for, and both stayed counted (the
/// lease for its whole period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_redis_allowed_after_its_caller_stopped_waiting_is_given_back() {
    let server = RedisServer::start();
    let proxy = ratelimit_test_support::Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let redis = RedisBackend::connect(
        &url,
        ConnectOptions {
            timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(1),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let window = Rule::fixed_window(10, Duration::from_secs(60));
    let leases = Rule::concurrency(2, Duration::from_secs(60));
    // A first call of each: the connection, the scripts, the server's time.
    assert!(
        redis
            .check(&window, "limiter:late:window", 1)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        redis
            .acquire(&leases, "limiter:late:leases", 1, 1)
            .await
            .unwrap()
            .allowed
    );

    for (key, acquire) in [
        ("limiter:late:window", false),
        ("limiter:late:leases", true),
    ] {
        proxy.delay_reply_to(key.as_bytes(), Duration::from_millis(400));
        let late = if acquire {
            redis.acquire(&leases, key, 1, 2).await
        } else {
            redis.check(&window, key, 1).await
        };
        assert!(
            late.is_err(),
            "{key}: the answer came after the deadline: {late:?}"
        );
        // The answer arrives; what it allowed is given back (bounded wait).
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            // (The connection's answers wait behind the one held back.)
            let peeked = if acquire {
                redis.peek(&leases, key).await
            } else {
                redis.peek(&window, key).await
            };
            // One call of each kept: the next leaves 8 of 10, or 0 of 2.
            let whole = if acquire { 0 } else { 8 };
            if peeked.as_ref().is_ok_and(|p| p.remaining == whole) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key}: still counted: {peeked:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
