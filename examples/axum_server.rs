//! The seed article's example server, on axum: the same endpoints, limits
//! and environment variables as `actix_server`.
//!
//! `cargo run --example axum_server`, then, for example:
//!
//! ```text
//! for i in 1 2 3 4; do curl -si http://127.0.0.1:8080/limitTest3 | head -1; done
//! curl -si --interface 127.0.0.2 http://127.0.0.1:8080/limitTest3 | head -1
//! ```
//!
//! Endpoints: `/limitTest` (2 per second), `/limitTest2` (3 per 10 s on the
//! key `customer_limit_test`), `/limitTest3` (3 per 10 s per client address),
//! `/limitTest4` (the same, with a fallback page), `/api` (5 per 10 s per
//! `x-api-key`), `/user/{name}` (3 per 10 s per name), and under `/layer/`
//! the same router again behind a [`RateLimitLayer`] (10 per 10 s per client
//! address, `/layer/health` exempt). For `scripts/bench-http`:
//! `/bench/limited` (a limit it never reaches), `/bench/plain` (the same
//! handler without it) and `/bench/layer` (the plain handler behind a
//! [`RateLimitLayer`] it never reaches).
//!
//! - `BIND` (default `127.0.0.1:8080`): where to listen.
//! - `REDIS_URL` (for example `redis://127.0.0.1:6379/`): keep the budgets in
//!   Redis, shared by every instance; without it, in process memory.
//! - `RATELIMIT_KEY_SECRET`: the secret of the digests that stand for
//!   `x-api-key` values in keys, the same on every instance (from your secret
//!   store); needed with `REDIS_URL` (`/api` is limited by a header).
//! - `TRUSTED_PROXIES` (for example `10.0.0.0/8,127.0.0.1`): proxies whose
//!   `Forwarded` / `X-Forwarded-For` / `X-Real-IP` headers name the client.
//! - `CLIENT_HEADER` (`forwarded`, `x-forwarded-for` or `x-real-ip`): the one
//!   header those proxies write.
//! - `RATELIMIT_HEADERS` (`draft`, the default; `legacy`, `both` or `none`).
//! - `RATELIMIT_OVERRIDES`, `RATELIMIT_OVERRIDES_FILE`: rule overrides, as
//!   for `actix_server`.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use ratelimit_runtime::{RateLimitLayer, RateLimited, Rule, rate_limit};

/// `limitTest`: 2 requests per second, for everyone.
#[rate_limit(key = "limitTest", period = 1, count = 2)]
async fn limit_test() -> impl IntoResponse {
    "limitTest: ok\n"
}

/// `limitTest2`: 3 requests per 10 s, on the custom key `customer_limit_test`.
#[rate_limit(key = "customer_limit_test", period = 10, count = 3)]
async fn limit_test2() -> impl IntoResponse {
    "limitTest2: ok\n"
}

/// `limitTest3`: 3 requests per 10 s per client address.
#[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
async fn limit_test3() -> impl IntoResponse {
    "limitTest3: ok\n"
}

/// `limitTest4`: 3 requests per 10 s per client address, and the seed's
/// demote path: a "try again later" page of our own.
#[rate_limit(key = "demote_test", period = 10, count = 3, by = ip, fallback = try_again_later)]
async fn limit_test4() -> impl IntoResponse {
    "limitTest4: ok\n"
}

/// `api`: 5 requests per 10 s per `x-api-key` header value (requests without
/// the header share one budget).
#[rate_limit(key = "api_key_test", period = 10, count = 5, by = header("x-api-key"))]
async fn api() -> impl IntoResponse {
    "api: ok\n"
}

/// `user/{name}`: 3 requests per 10 s per user name in the path.
#[rate_limit(key = "user_test:{name}", period = 10, count = 3)]
async fn user(Path(name): Path<String>) -> impl IntoResponse {
    format!("user {name}: ok\n")
}

async fn try_again_later(limited: RateLimited) -> impl IntoResponse {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [("retry-after", limited.retry_after_secs().to_string())],
        Html(support::try_again_page(&limited)),
    )
}

/// For the HTTP benchmark: a limit it never reaches (a billion a second).
#[rate_limit(key = "bench", period = 1, count = 1_000_000_000)]
async fn bench_limited() -> impl IntoResponse {
    "ok\n"
}

/// For the HTTP benchmark: the same handler without the attribute.
async fn bench_plain() -> impl IntoResponse {
    "ok\n"
}

/// The HTTP benchmark's endpoints.
fn bench_endpoints() -> Router {
    let never = Rule::fixed_window(1_000_000_000, Duration::from_secs(1));
    Router::new()
        .route("/bench/limited", get(bench_limited))
        .route("/bench/plain", get(bench_plain))
        .route(
            "/bench/layer",
            get(bench_plain).layer(RateLimitLayer::new(never).name("bench_layer")),
        )
}

/// The seed endpoints, each limited by its attribute.
fn endpoints() -> Router {
    Router::new()
        .route("/limitTest", get(limit_test))
        .route("/limitTest2", get(limit_test2))
        .route("/limitTest3", get(limit_test3))
        .route("/limitTest4", get(limit_test4))
        .route("/api", get(api))
        .route("/user/{name}", get(user))
        .route("/health", get(|| async { "ok\n" }))
}

/// The layer in front of `/layer/..`: 10 requests per 10 s per client.
const LAYER: Rule = Rule::fixed_window(10, Duration::from_secs(10));

#[tokio::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    // One app in this process: the limiter and the options are installed
    // for it, so the router needs no `Extension` layers (each would cost
    // every request a layer).
    support::http_options()?.install()?;
    let (limiter, backend) = support::limiter().await?;
    limiter.install()?;
    let layered = endpoints().layer(
        RateLimitLayer::new(LAYER)
            .name("layer")
            .by_ip()
            // The path as the nested router sees it.
            .exempt_path("/health"),
    );
    let app = endpoints()
        .nest("/layer", layered)
        .merge(bench_endpoints())
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") });
    // Once every rule is known (the layers' too).
    support::load_overrides()?;
    let bind = support::bind();
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("{}", support::banner(&bind, &backend));
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
