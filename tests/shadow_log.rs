//! A rule in shadow mode may refuse every call of a busy endpoint: its log
//! lines are rate limited (one per rule per 10 s, saying how many it held
//! back), not one per call. Every log line is kept and counted.

mod common;

use common::Logs;

use ratelimit_runtime::{RateLimited, rate_limit};

#[rate_limit(key = "shadow_log", count = 1, period = 60, shadow)]
async fn shadowed() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn shadow_refusals_are_logged_now_and_then_not_per_call() {
    let logs = Logs::default();
    tracing::subscriber::set_global_default(
        logs.subscriber(tracing_subscriber::filter::LevelFilter::INFO),
    )
    .unwrap();
    for _ in 0..1_000 {
        assert!(shadowed().await.is_ok(), "shadow never refuses");
    }
    let logged = logs.text();
    let lines = logged.matches("shadow rate limit exceeded").count();
    assert_eq!(lines, 1, "{logged}");
    assert!(logged.contains("unlogged=0"), "{logged}");
}
