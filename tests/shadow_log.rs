//! A rule in shadow mode may refuse every call of a busy endpoint: its log
//! lines are rate limited (one per rule per 10 s, saying how many it held
//! back), not one per call. Every log line is kept and counted.

use std::sync::{Arc, Mutex};

use ratelimit_runtime::{RateLimited, rate_limit};

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[rate_limit(key = "shadow_log", count = 1, period = 60, shadow)]
async fn shadowed() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn shadow_refusals_are_logged_now_and_then_not_per_call() {
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_writer(move || writer.clone())
        .init();
    for _ in 0..1_000 {
        assert!(shadowed().await.is_ok(), "shadow never refuses");
    }
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines = logged.matches("shadow rate limit exceeded").count();
    assert_eq!(lines, 1, "{logged}");
    assert!(logged.contains("unlogged=0"), "{logged}");
}
