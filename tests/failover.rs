//! A backend of the application's own fails over as Redis does: the failure
//! policy answers its failed calls (in process memory for `local`), a circuit
//! breaker spares it calls while it fails, and what the insurance limiter
//! took is given back there.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratelimit_runtime::{
    Backend, Decision, Error, OnError, RateLimited, RateLimiter, Rule, rate_limit,
};

/// A backend that allows everything (and says so with 42 units left) while
/// up, and fails every call while down; it counts the calls that reach it.
#[derive(Debug, Clone, Default)]
struct Flaky {
    down: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
    releases: Arc<AtomicUsize>,
}

impl Flaky {
    fn answer(&self, rule: &Rule) -> Result<Decision, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::backend(std::io::Error::other("flaky is down")));
        }
        Ok(Decision {
            allowed: true,
            limit: rule.count(),
            remaining: 42,
            reset_after: Duration::ZERO,
            retry_after: Duration::ZERO,
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Backend for Flaky {
    async fn check(&self, rule: &Rule, _key: &str, _cost: u64) -> Result<Decision, Error> {
        self.answer(rule)
    }

    async fn acquire(
        &self,
        rule: &Rule,
        _key: &str,
        _cost: u64,
        _lease: u64,
    ) -> Result<Decision, Error> {
        self.answer(rule)
    }

    async fn release(
        &self,
        _rule: &Rule,
        _key: &str,
        _cost: u64,
        _lease: u64,
    ) -> Result<(), Error> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

const RULE: Rule = Rule::fixed_window(2, Duration::from_secs(60));
const LEASES: Rule = Rule::concurrency(1, Duration::from_secs(60));

/// `local` (the default) checks the rule in process memory while the
/// backend fails; the circuit opens after three failed calls, so the
/// backend is spared; its charges and leases are given back to the
/// insurance limiter, never to the backend. (A custom backend used to get
/// no failover: every failed call was refused.)
#[tokio::test]
async fn a_custom_backend_fails_over_to_memory_and_its_circuit_opens() {
    let flaky = Flaky::default();
    let limiter = RateLimiter::builder()
        .backend(flaky.clone())
        .probe_interval(Duration::from_secs(600))
        .build()
        .await
        .unwrap();
    assert_eq!(limiter.backend_name(), "custom");
    let up = limiter.check(&RULE, "k").await.unwrap();
    assert_eq!(up.remaining, 42, "the backend answers while up");

    flaky.down.store(true, Ordering::SeqCst);
    let first = limiter.acquire(&RULE, "k", 1).await.unwrap();
    assert!(first.decision().allowed && first.decision().remaining == 1);
    assert!(limiter.check(&RULE, "k").await.unwrap().allowed);
    let third = limiter.check(&RULE, "k").await.unwrap();
    assert!(!third.allowed, "the insurance limiter holds the rule");
    assert_eq!(flaky.calls(), 4, "one call up, three failed");

    for _ in 0..10 {
        assert!(!limiter.check(&RULE, "k").await.unwrap().allowed);
    }
    assert_eq!(flaky.calls(), 4, "the circuit is open: no call reaches it");

    // What the insurance limiter charged, it gives back (the backend has
    // no refunds: it would answer `Unsupported`).
    let charge = first.charge().expect("an allowed call");
    assert!(limiter.refund(&RULE, "k", charge).await.unwrap().allowed);
    assert!(limiter.check(&RULE, "k").await.unwrap().allowed);

    // A lease the insurance limiter took is released there, at once.
    let lease = limiter.acquire(&LEASES, "l", 1).await.unwrap();
    assert!(lease.decision().allowed);
    assert!(
        !limiter
            .acquire(&LEASES, "l", 1)
            .await
            .unwrap()
            .decision()
            .allowed
    );
    drop(lease);
    assert!(
        limiter
            .acquire(&LEASES, "l", 1)
            .await
            .unwrap()
            .decision()
            .allowed
    );
    assert_eq!(flaky.releases.load(Ordering::SeqCst), 0);
    assert_eq!(flaky.calls(), 4);
}

#[rate_limit(key = "f_deny", count = 5, limiter = "flaky", on_error = deny)]
async fn deny_when_broken() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "f_allow", count = 1, limiter = "flaky", on_error = allow)]
async fn allow_when_broken() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "f_local", count = 1, period = 60, limiter = "flaky", on_error = local)]
async fn local_when_broken() -> Result<(), RateLimited> {
    Ok(())
}

/// Each rule's `on_error` decides for a custom backend too (the limiter's
/// own policy is `deny` here), and once the backend answers a probe, it
/// decides again.
#[tokio::test]
async fn each_rules_policy_decides_for_a_custom_backend_until_it_answers() {
    let flaky = Flaky::default();
    RateLimiter::builder()
        .backend(flaky.clone())
        .on_backend_error(OnError::Deny)
        .probe_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap()
        .install_as("flaky")
        .unwrap();
    flaky.down.store(true, Ordering::SeqCst);
    let refused = deny_when_broken().await.unwrap_err();
    assert!(refused.is_backend_failure(), "{refused:?}");
    for _ in 0..3 {
        assert!(
            allow_when_broken().await.is_ok(),
            "allow lets calls through"
        );
    }
    assert!(local_when_broken().await.is_ok());
    let limited = local_when_broken().await.unwrap_err();
    assert!(!limited.is_backend_failure(), "local: the insurance limits");

    flaky.down.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while local_when_broken().await.is_err() {
        assert!(Instant::now() < deadline, "the circuit never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        assert!(
            local_when_broken().await.is_ok(),
            "the backend decides again"
        );
    }
}

/// A backend that keeps no turns: it allows the first `count` calls of a
/// rule and refuses the rest, for a minute.
#[derive(Debug, Clone, Default)]
struct Counting {
    calls: Arc<AtomicUsize>,
}

impl Counting {
    fn answer(&self, rule: &Rule) -> Result<Decision, Error> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        let allowed = n <= rule.count();
        Ok(Decision {
            allowed,
            limit: rule.count(),
            remaining: rule.count().saturating_sub(n),
            reset_after: Duration::from_secs(60),
            retry_after: if allowed {
                Duration::ZERO
            } else {
                Duration::from_secs(60)
            },
        })
    }
}

impl Backend for Counting {
    async fn check(&self, rule: &Rule, _key: &str, _cost: u64) -> Result<Decision, Error> {
        self.answer(rule)
    }
}

#[rate_limit(key = "c_wait", by = arg(user), count = 2, period = 60, algorithm = gcra, limiter = "counting", wait = "5s")]
async fn waits_on_a_custom_backend(user: &str) -> Result<(), RateLimited> {
    Ok(())
}

/// A custom backend cannot reserve a turn: a `wait` rule on it checks its
/// calls without waiting, so a call over the limit is refused with its
/// `RateLimited` (it used to pass unchecked, with an error logged with the
/// key on every call); that is said once, without the key.
/// `until_ready` itself answers `Unsupported`.
#[tokio::test]
async fn a_wait_on_a_custom_backend_checks_without_waiting() {
    let logs = common::Logs::default();
    let _scope = tracing::subscriber::set_default(
        logs.subscriber(tracing_subscriber::filter::LevelFilter::INFO),
    );
    let counting = Counting::default();
    let limiter = RateLimiter::builder()
        .backend(counting.clone())
        .build()
        .await
        .unwrap();
    const GCRA: Rule = Rule::gcra(2, Duration::from_secs(60));
    assert!(matches!(
        limiter
            .until_ready(&GCRA, "k", 1, Duration::from_secs(1))
            .await,
        Err(Error::Unsupported(_))
    ));
    limiter.install_as("counting").unwrap();

    let start = Instant::now();
    assert!(waits_on_a_custom_backend("user-7").await.is_ok());
    assert!(waits_on_a_custom_backend("user-7").await.is_ok());
    for _ in 0..5 {
        let refused = waits_on_a_custom_backend("user-7").await.unwrap_err();
        assert!(!refused.is_backend_failure(), "{refused:?}");
        assert_eq!(refused.retry_after, Duration::from_secs(60));
    }
    assert!(start.elapsed() < Duration::from_secs(3), "nothing waited");
    assert_eq!(counting.calls.load(Ordering::SeqCst), 7);

    let logged = logs.text();
    assert_eq!(
        logged.matches("cannot reserve a turn").count(),
        1,
        "{logged}"
    );
    assert!(!logged.contains("user-7"), "no key in the log: {logged}");
    assert!(!logged.contains("ERROR"), "{logged}");
}

/// A store that cannot reserve turns does not use up the breaker's probe:
/// after an outage, a limiter asked to wait (which checks without waiting
/// on a custom backend) still lets the next call probe, and the circuit
/// closes. (The reservation used to take the probe slot and give nothing
/// back, so a limiter serving `wait` calls stayed on its failure policy.)
#[tokio::test]
async fn a_wait_on_a_custom_backend_leaves_the_probe_to_the_next_call() {
    const PACED: Rule = Rule::gcra(10, Duration::from_secs(1));
    let flaky = Flaky::default();
    let limiter = RateLimiter::builder()
        .backend(flaky.clone())
        .probe_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    flaky.down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let _ = limiter.check(&PACED, "p").await;
    }
    let failed = flaky.calls();
    assert!(limiter.check(&PACED, "p").await.is_ok());
    assert_eq!(flaky.calls(), failed, "the circuit is open");

    flaky.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(matches!(
        limiter
            .until_ready(&PACED, "p", 1, Duration::from_secs(1))
            .await,
        Err(Error::Unsupported(_))
    ));
    let probe = limiter.check(&PACED, "p").await.unwrap();
    assert_eq!(
        (probe.remaining, flaky.calls()),
        (42, failed + 1),
        "the call after the wait probes the backend, which answers"
    );
}
