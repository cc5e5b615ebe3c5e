//! What each option of `#[rate_limit]` does, on plain async fns. The global
//! limiter is the in-memory default; every fn has its own key.

use std::time::Duration;

use ratelimit_runtime::{ManualClock, RateLimited, RateLimiter, Rule, rate_limit};
use ratelimit_test_support::RedisServer;
use tokio::sync::oneshot;

#[rate_limit(key = "stack-a", count = 2, period = 60)]
#[rate_limit(key = "stack-b", count = 1, period = 60)]
async fn stacked() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn stacked_rules_are_one_decision() {
    assert!(stacked().await.is_ok());
    // The second rule refuses, and the first is not charged for it.
    for _ in 0..3 {
        let refused = stacked().await.unwrap_err();
        assert_eq!(refused.limit, 1, "refused by the second rule");
        assert_eq!(refused.name, "stack-b");
    }
    let limiter = RateLimiter::global();
    let first = limiter.peek_named("stack-a", "").await.unwrap();
    assert!(first.allowed);
    assert_eq!(
        first.remaining, 0,
        "one unit taken, one left for the next call"
    );
}

#[rate_limit(key = "shadow", count = 1, period = 60, shadow)]
async fn shadowed() -> Result<u32, RateLimited> {
    Ok(1)
}

#[tokio::test]
async fn shadow_rules_never_refuse() {
    for _ in 0..5 {
        assert_eq!(shadowed().await, Ok(1));
    }
}

#[rate_limit(key = "exports", count = 1, period = 60, algorithm = concurrency)]
async fn export(
    started: Option<oneshot::Sender<()>>,
    done: oneshot::Receiver<()>,
) -> Result<&'static str, RateLimited> {
    if let Some(started) = started {
        let _ = started.send(());
    }
    let _ = done.await;
    Ok("exported")
}

/// A call that ends at once.
async fn quick_export() -> Result<&'static str, RateLimited> {
    let (finish, done) = oneshot::channel();
    finish.send(()).unwrap();
    export(None, done).await
}

#[tokio::test]
async fn a_concurrency_rule_holds_its_lease_while_the_call_runs() {
    let (started, has_started) = oneshot::channel();
    let (finish, done) = oneshot::channel();
    let running = tokio::spawn(export(Some(started), done));
    // The body runs only after the check: the lease is held from here on.
    has_started.await.unwrap();
    let refused = quick_export().await.unwrap_err();
    assert_eq!((refused.limit, refused.remaining), (1, 0));
    finish.send(()).unwrap();
    assert_eq!(running.await.unwrap(), Ok("exported"));
    // The call ended: its lease is back.
    assert_eq!(quick_export().await, Ok("exported"));
    // A call cancelled mid-way (its future dropped) gives the lease back too.
    let (_never, done) = oneshot::channel::<()>();
    assert!(
        tokio::time::timeout(Duration::from_millis(20), export(None, done))
            .await
            .is_err()
    );
    assert_eq!(quick_export().await, Ok("exported"));
}

struct Account {
    id: u64,
    writes: u32,
}

impl Account {
    #[rate_limit(key = "read:{self.id}", count = 1, period = 60, fallback = Self::later)]
    async fn read(&self, what: &str) -> String {
        format!("{}:{what}", self.id)
    }

    async fn later(&self, what: &str, _limited: RateLimited) -> String {
        format!("{}:{what} later", self.id)
    }

    #[rate_limit(key = "write:{self.id}", count = 2, period = 60)]
    async fn write(&mut self) -> Result<u32, RateLimited> {
        self.writes += 1;
        Ok(self.writes)
    }
}

#[tokio::test]
async fn methods_use_fields_of_self_in_keys() {
    let (mut a, b) = (Account { id: 1, writes: 0 }, Account { id: 2, writes: 0 });
    assert_eq!(a.read("x").await, "1:x");
    assert_eq!(a.read("x").await, "1:x later");
    assert_eq!(b.read("x").await, "2:x");
    assert_eq!(a.write().await, Ok(1));
    assert_eq!(a.write().await, Ok(2));
    assert!(a.write().await.is_err());
}

#[rate_limit(key = "upload", count = 5, period = 60, cost = 2)]
async fn upload() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn cost_takes_several_units_per_call() {
    assert!(upload().await.is_ok());
    assert!(upload().await.is_ok());
    let refused = upload().await.unwrap_err();
    assert_eq!(refused.remaining, 1);
}

const SEARCH: Rule = Rule::sliding_log(2, Duration::from_secs(60));

#[rate_limit(key = "search", rule = SEARCH)]
async fn search() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "login", count = 1, period = 60, by = arg(user))]
async fn login(user: &str) -> Result<String, RateLimited> {
    Ok(user.to_owned())
}

#[rate_limit(key = "gen:{id}", count = 1, period = 60, algorithm = gcra, burst = 1)]
async fn generic<T: std::fmt::Display + Send + Sync>(id: T) -> Result<String, RateLimited> {
    Ok(id.to_string())
}

#[tokio::test]
async fn const_rules_arg_subjects_and_generic_fns() {
    assert!(search().await.is_ok());
    assert!(search().await.is_ok());
    assert!(search().await.is_err());
    assert!(login("ann").await.is_ok());
    assert!(login("ann").await.is_err());
    assert!(login("bob").await.is_ok());
    assert!(generic(7u8).await.is_ok());
    assert!(
        generic("7").await.is_err(),
        "\"7\" and 7 render the same key"
    );
    assert!(generic(8u64).await.is_ok());
}

#[rate_limit(key = "named", count = 1, period = 10, limiter = "manual")]
async fn on_named_limiter() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_named_limiter_serves_rules_that_name_it() {
    let clock = ManualClock::new();
    RateLimiter::in_memory_with_clock(clock.clone())
        .install_as("manual")
        .unwrap();
    assert!(on_named_limiter().await.is_ok());
    assert!(on_named_limiter().await.is_err());
    clock.advance(Duration::from_secs(10));
    assert!(
        on_named_limiter().await.is_ok(),
        "its own clock, not the global limiter's"
    );
    assert!(matches!(
        RateLimiter::in_memory().install_as("manual"),
        Err(ratelimit_runtime::Error::AlreadyInstalled)
    ));
}

#[rate_limit(key = "nowhere", count = 1, period = 60, limiter = "not-installed")]
async fn on_missing_limiter() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_missing_named_limiter_falls_back_to_memory() {
    assert!(on_missing_limiter().await.is_ok());
    assert!(
        on_missing_limiter().await.is_err(),
        "the limit still holds, per process"
    );
}

#[rate_limit(key = "deny", count = 5, limiter = "flaky", on_error = deny)]
async fn deny_when_broken() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "allow", count = 1, limiter = "flaky", on_error = allow)]
async fn allow_when_broken() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "local", count = 1, period = 60, limiter = "flaky")]
async fn local_when_broken() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_decides_when_redis_is_down() {
    let mut server = RedisServer::start();
    RateLimiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap()
        .install_as("flaky")
        .unwrap();
    assert!(deny_when_broken().await.is_ok());
    assert!(allow_when_broken().await.is_ok());
    server.kill();
    let started = std::time::Instant::now();
    let refused = deny_when_broken().await.unwrap_err();
    assert!(
        refused.is_backend_failure(),
        "limiter broken, not over the limit: {refused:?}"
    );
    assert!(refused.to_string().contains("unavailable"));
    for _ in 0..3 {
        assert!(
            allow_when_broken().await.is_ok(),
            "allow lets calls through"
        );
    }
    assert!(local_when_broken().await.is_ok());
    let limited = local_when_broken().await.unwrap_err();
    assert!(
        !limited.is_backend_failure(),
        "local: the in-memory insurance limits"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "no call hung");
}
