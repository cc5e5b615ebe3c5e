//! `#[rate_limit]` on plain async fns, against the global limiter in memory
//! on a manual clock (installed once for this test binary).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ratelimit_runtime::{Error, ManualClock, RateLimited, RateLimiter, rate_limit};
use tokio::sync::{Mutex, MutexGuard};

/// The clock of the global limiter. Tests that depend on time hold the lock,
/// so one test advancing it cannot end another's window.
static CLOCK: LazyLock<Mutex<ManualClock>> = LazyLock::new(|| {
    let clock = ManualClock::new();
    RateLimiter::in_memory_with_clock(clock.clone())
        .install()
        .expect("nothing else installs a global limiter in this binary");
    Mutex::new(clock)
});

async fn clock() -> MutexGuard<'static, ManualClock> {
    CLOCK.lock().await
}

#[rate_limit(key = "k", count = 3, period = 1)]
async fn three_per_second() -> Result<u32, RateLimited> {
    Ok(7)
}

#[tokio::test]
async fn result_fn_gets_err_past_count_and_ok_after_the_period() {
    let clock = clock().await;
    let outcomes: Vec<_> = futures_in_order(5, three_per_second).await;
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 3);
    assert_eq!(outcomes[..3], [Ok(7), Ok(7), Ok(7)]);
    for outcome in &outcomes[3..] {
        let limited = outcome.as_ref().unwrap_err();
        assert_eq!(limited.limit, 3);
        assert_eq!(limited.remaining, 0);
        assert_eq!(limited.retry_after, Duration::from_secs(1));
    }
    clock.advance(Duration::from_millis(999));
    assert!(three_per_second().await.is_err());
    clock.advance(Duration::from_millis(1));
    assert_eq!(three_per_second().await, Ok(7));
}

async fn futures_in_order<T, F: Future<Output = T>>(n: usize, f: impl Fn() -> F) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(f().await);
    }
    out
}

#[rate_limit(key = "user:{user_id}:{action}", count = 1, period = "1m")]
async fn per_user(user_id: u64, action: &str) -> Result<String, RateLimited> {
    Ok(format!("{user_id} {action}"))
}

#[tokio::test]
async fn placeholders_give_each_argument_its_own_budget() {
    let _clock = clock().await;
    assert_eq!(per_user(1, "read").await.unwrap(), "1 read");
    assert!(per_user(1, "read").await.is_err());
    assert!(per_user(2, "read").await.is_ok());
    assert!(per_user(1, "write").await.is_ok());
}

#[rate_limit(key = "login:{user}", count = 2, period = "10s", fallback = too_many_logins)]
async fn login(user: &str, attempt: u32) -> String {
    format!("{user} attempt {attempt} ok")
}

async fn too_many_logins(user: &str, attempt: u32, limited: RateLimited) -> String {
    format!(
        "{user} attempt {attempt} refused for {} ms",
        limited.retry_after.as_millis()
    )
}

#[tokio::test]
async fn fallback_gets_the_arguments_and_the_rejection() {
    let clock = clock().await;
    assert_eq!(login("ann", 1).await, "ann attempt 1 ok");
    clock.advance(Duration::from_secs(4));
    assert_eq!(login("ann", 2).await, "ann attempt 2 ok");
    assert_eq!(login("ann", 3).await, "ann attempt 3 refused for 6000 ms");
    assert_eq!(login("bob", 1).await, "bob attempt 1 ok");
}

#[rate_limit(count = 1, period = 60)]
async fn unnamed_a() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(count = 1, period = 60)]
async fn unnamed_b() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn without_a_key_each_fn_has_its_own_budget() {
    let _clock = clock().await;
    assert!(unnamed_a().await.is_ok());
    assert!(unnamed_b().await.is_ok());
    assert!(unnamed_a().await.is_err());
}

#[rate_limit(key = "shared", count = 1, period = 60)]
async fn shares_a() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "shared", count = 1, period = 60)]
async fn shares_b() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "shared", prefix = "other:", count = 1, period = 60)]
async fn other_prefix() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn one_key_is_one_budget_and_the_prefix_separates() {
    let _clock = clock().await;
    assert!(shares_a().await.is_ok());
    assert!(shares_b().await.is_err(), "the same key is the same budget");
    assert!(other_prefix().await.is_ok());
}

#[rate_limit(key = "tenant_login", prefix = "tenant:", count = 1, period = 60, by = arg(user))]
async fn tenant_login(user: &str) -> Result<(), RateLimited> {
    Ok(())
}

/// `reset_named` finds the budget where the rule keeps it: under its own
/// `prefix` (it once built `limiter:<name>` whatever the prefix, answered
/// `Ok` and left the user limited).
#[tokio::test]
async fn reset_named_resets_a_rule_with_its_own_prefix() {
    let _clock = clock().await;
    let limiter = RateLimiter::global();
    assert!(tenant_login("ann").await.is_ok());
    assert!(tenant_login("ann").await.is_err());
    let state = limiter.peek_named("tenant_login", "arg:user:ann").await;
    assert!(!state.unwrap().allowed, "peek_named sees the spent budget");
    limiter
        .reset_named("tenant_login", "arg:user:ann")
        .await
        .unwrap();
    assert!(
        tenant_login("ann").await.is_ok(),
        "the reset reached the rule's budget"
    );
    assert!(
        tenant_login("bob").await.is_ok(),
        "another subject's budget is its own"
    );
}

/// A rule whose key is built from its arguments has no subject to name:
/// `reset_named` and `peek_named` say so with an error instead of answering
/// `Ok` for a key no call uses.
#[tokio::test]
async fn by_name_operations_refuse_a_key_with_placeholders() {
    let _clock = clock().await;
    let limiter = RateLimiter::global();
    for result in [
        limiter.reset_named("login:{user}", "bob").await,
        limiter.peek_named("login:{user}", "").await,
    ] {
        match result {
            Err(Error::Config(message)) => assert!(
                message.contains("full key"),
                "the error says what to do: {message}"
            ),
            other => panic!("a placeholder rule by name gave {other:?}"),
        }
    }
}

#[rate_limit(count = 1, period = 60)]
async fn without_a_key() -> Result<(), RateLimited> {
    Ok(())
}

/// A fn without `key` is named by its fn name, and its keys hold its module
/// path: `reset_named` by that name reaches them.
#[tokio::test]
async fn reset_named_resets_a_rule_without_a_key() {
    let _clock = clock().await;
    assert!(without_a_key().await.is_ok());
    assert!(without_a_key().await.is_err());
    RateLimiter::global()
        .reset_named("without_a_key", "")
        .await
        .unwrap();
    assert!(
        without_a_key().await.is_ok(),
        "the reset reached the rule's budget"
    );
}

#[derive(Debug)]
enum AppError {
    Busy(RateLimited),
}

impl From<RateLimited> for AppError {
    fn from(limited: RateLimited) -> Self {
        AppError::Busy(limited)
    }
}

#[rate_limit(key = "app-error", count = 1, period = 60)]
async fn app_error() -> Result<u8, AppError> {
    Ok(1)
}

#[rate_limit(key = "boxed", count = 1, period = 60)]
async fn boxed() -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    Ok(1)
}

#[tokio::test]
async fn any_error_type_from_rate_limited_reports_the_rejection() {
    let _clock = clock().await;
    assert!(app_error().await.is_ok());
    let AppError::Busy(limited) = app_error().await.unwrap_err();
    assert_eq!(limited.limit, 1);
    assert!(boxed().await.is_ok());
    let error = boxed().await.unwrap_err();
    assert!(error.downcast_ref::<RateLimited>().is_some(), "{error}");
}

#[rate_limit(key = "crowd", count = 50, period = 60)]
async fn crowd(n: u32) -> Result<u32, RateLimited> {
    tokio::task::yield_now().await;
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_count_of_200_concurrent_calls_pass() {
    let _clock = clock().await;
    let passed = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let tasks: Vec<_> = (0..200)
        .map(|n| {
            let passed = Arc::clone(&passed);
            tokio::spawn(async move {
                if crowd(n).await.is_ok() {
                    passed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(passed.load(std::sync::atomic::Ordering::SeqCst), 50);
}

/// Doc comments and other attributes stay on the fn.
#[rate_limit(key = "kept", count = 5)]
#[must_use = "the outcome says whether the call ran"]
pub(crate) async fn keeps_attributes() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn the_rest_of_the_item_is_kept() {
    let _clock = clock().await;
    keeps_attributes().await.unwrap();
}
