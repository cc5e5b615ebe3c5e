//! `#[rate_limit]` on actix-web handlers.
//!
//! `cargo run --example actix_basic`, then for example:
//! `for i in 1 2 3 4; do curl -i http://127.0.0.1:8081/ip; done`
//!
//! Listens on `BIND` (default `127.0.0.1:8081`); in memory, or in Redis when
//! `REDIS_URL` is set, with `RATELIMIT_KEY_SECRET` the secret of the digests
//! that stand for `x-api-key` values in keys (needed with Redis).

mod support;

use actix_web::{App, HttpResponse, HttpServer, Responder, get, web};
use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};

/// 3 requests per 10 s per client IP. `by = ip` makes it a handler for the
/// attribute, which adds the request it needs; above or below `#[get]`.
#[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
#[get("/ip")]
async fn per_ip() -> impl Responder {
    "ok: 3 per 10 s per client address\n"
}

/// 2 requests per second for everyone; `Result<_, actix_web::Error>` works
/// too (a rejection becomes a 429 with `Retry-After`).
#[rate_limit(key = "global", count = 2, period = 1)]
#[get("/global")]
async fn global() -> Result<String, actix_web::Error> {
    Ok("ok: 2 per second for everyone\n".into())
}

/// 5 per minute per API key header, with a demote path of our own.
#[rate_limit(key = "api", count = 5, period = "1m", by = header("x-api-key"), fallback = slow_down)]
#[get("/api/{item}")]
async fn api(item: web::Path<String>) -> impl Responder {
    format!("ok: item {item}\n")
}

async fn slow_down(item: web::Path<String>, limited: RateLimited) -> impl Responder {
    HttpResponse::TooManyRequests()
        .insert_header(("retry-after", limited.retry_after_secs().to_string()))
        .body(format!(
            "item {item}: slow down, try again in {} s\n",
            limited.retry_after_secs()
        ))
}

#[actix_web::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    if let Ok(url) = std::env::var("REDIS_URL") {
        support::with_key_secret(RateLimiter::builder())
            .redis(url)
            .build()
            .await
            .and_then(RateLimiter::install)
            .map_err(std::io::Error::other)?;
    }
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8081".into());
    println!(
        "listening on http://{bind} ({} backend): /ip, /global, /api/{{item}}",
        RateLimiter::global().backend_name()
    );
    HttpServer::new(|| App::new().service(per_ip).service(global).service(api))
        .bind(bind)?
        .run()
        .await?;
    Ok(())
}
