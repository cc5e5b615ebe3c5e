// Built by tests/features.rs against ratelimit-runtime with its default
// features (no `actix`, no `axum`); handlers.stderr holds the errors.
use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "plain", count = 3)]
async fn plain(x: u32) -> Result<u32, RateLimited> { Ok(x) }

#[rate_limit(key = "by_ip", count = 3, by = ip)]
async fn by_ip() -> String { "ip".into() }

#[rate_limit(key = "by_header", count = 3, by = header("x-api-key"))]
async fn by_header() -> String { "header".into() }

fn main() {
    let _ = plain(1);
    let _ = by_ip();
    let _ = by_header();
}
