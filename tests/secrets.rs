//! No secret leaves through `Debug`, `Display`, an error or a log line:
//! every public type that holds a password, the key secret or a request's
//! header values is printed, errors are provoked with passwords in URLs, and
//! a handler under `#[tracing::instrument]` (which records the `HttpCall`
//! the attribute adds) is called with an API key while every log line is
//! kept.

mod common;

use common::Logs;
use std::net::Ipv4Addr;

use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Extension, Router};
use ratelimit_runtime::backend::redis::RedisTarget;
use ratelimit_runtime::{HttpOptions, RateLimiter, rate_limit};
use ratelimit_test_support::{RedisServer, acl_server, free_port, http};

const PASSWORD: &str = "hunter2";
const API_KEY: &str = "sk_live_hunter2";

/// Fails if `shown` holds a secret.
fn assert_clean(what: &str, shown: &str) {
    for secret in [PASSWORD, API_KEY, "s3cret"] {
        assert!(!shown.contains(secret), "{what} shows a secret: {shown}");
    }
}

/// Builds `builder` and checks that it fails, with neither the error's
/// `Display` nor its `Debug` holding a secret.
async fn fails_clean(what: &str, builder: ratelimit_runtime::RateLimiterBuilder) {
    assert_clean(&format!("{what}'s builder"), &format!("{builder:?}"));
    let error = builder
        .build()
        .await
        .map(|_| ())
        .expect_err(&format!("{what} should fail"));
    assert_clean(what, &error.to_string());
    assert_clean(what, &format!("{error:?}"));
}

#[tokio::test]
async fn builders_and_their_errors_show_no_password() {
    let closed = free_port();
    let redis = || RateLimiter::builder().connect_timeout(std::time::Duration::from_millis(500));
    fails_clean(
        "a malformed URL",
        redis().redis(format!("redis://user:{PASSWORD}@127.0.0.1:notaport/")),
    )
    .await;
    fails_clean(
        "an unparsable URL",
        redis().redis(format!("redis://:{PASSWORD}@[::1")),
    )
    .await;
    fails_clean(
        "a URL without a scheme",
        redis().redis(format!("user:{PASSWORD}@127.0.0.1:6379")),
    )
    .await;
    fails_clean(
        "an unreachable server",
        redis().redis(format!("redis://user:{PASSWORD}@127.0.0.1:{closed}/")),
    )
    .await;
    fails_clean(
        "cluster nodes with different passwords",
        redis().redis([
            format!("redis://:{PASSWORD}@127.0.0.1:{closed}"),
            format!("redis://:other-{PASSWORD}@127.0.0.1:{closed}"),
        ]),
    )
    .await;
    fails_clean(
        "an unreachable cluster",
        redis().redis([format!("redis://:{PASSWORD}@127.0.0.1:{closed}")]),
    )
    .await;
    fails_clean(
        "malformed Sentinel URLs",
        redis().redis(RedisTarget::sentinel(
            "mymaster",
            [format!("redis://:{PASSWORD}@127.0.0.1:x")],
        )),
    )
    .await;
    fails_clean(
        "a TLS URL with a bad certificate",
        redis().redis(
            RedisTarget::from(format!("rediss://:{PASSWORD}@127.0.0.1:{closed}/"))
                .tls_root_certificate(b"not a certificate".to_vec()),
        ),
    )
    .await;
    let client =
        redis::Client::open(format!("redis://user:{PASSWORD}@127.0.0.1:{closed}/")).unwrap();
    fails_clean("a client of the application's", redis().redis(client)).await;

    // Refused credentials: the wrong password is not echoed.
    let server = acl_server();
    let wrong = format!("redis://limiter:{PASSWORD}@127.0.0.1:{}/", server.port());
    fails_clean("a wrong password", redis().redis(wrong)).await;

    // A limiter that connected with a password and holds a key secret.
    let right = format!("redis://limiter:s3cret@127.0.0.1:{}/", server.port());
    let builder = RateLimiter::builder().redis(right).key_secret(PASSWORD);
    assert_clean("a builder", &format!("{builder:?}"));
    let limiter = builder.build().await.unwrap();
    assert_clean("a limiter", &format!("{limiter:?}"));
    let options = HttpOptions::new().digest_client_ips(true);
    assert_clean("the options", &format!("{options:?}"));
    // Allow-lists of API keys.
    let api = ratelimit_runtime::Rule::fixed_window(5, std::time::Duration::from_secs(1));
    let middleware = ratelimit_runtime::RateLimit::new(api)
        .by_header("x-api-key")
        .exempt_key(API_KEY);
    assert_clean("the actix middleware", &format!("{middleware:?}"));
    let layer = ratelimit_runtime::RateLimitLayer::new(api)
        .by_header("x-api-key")
        .exempt_key(API_KEY);
    assert_clean("the tower layer", &format!("{layer:?}"));
}

#[rate_limit(key = "secrets_api", count = 1, period = 60, by = header("x-api-key"))]
#[tracing::instrument]
async fn api() -> impl IntoResponse {
    tracing::info!("serving the api");
    "api"
}

/// `#[tracing::instrument]` under `#[rate_limit]` records the `HttpCall`
/// the attribute adds: its `Debug` names the header, never its value, and
/// no other line (decisions at `debug` included) holds the API key either.
#[tokio::test]
async fn an_instrumented_handler_logs_no_header_value() {
    let logs = Logs::default();
    tracing::subscriber::set_global_default(
        logs.subscriber(tracing_subscriber::filter::LevelFilter::TRACE),
    )
    .unwrap();
    let redis = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(redis.url())
        .key_secret(PASSWORD)
        .build()
        .await
        .unwrap();
    let app = Router::new()
        .route("/api", get(api))
        .layer(Extension(limiter))
        .layer(Extension(HttpOptions::new()));
    let addr = common::serve_axum(app).await;
    let from = Ipv4Addr::LOCALHOST.into();
    for expected in [200, 429] {
        let reply = http(from, addr, "GET", "/api", &[("x-api-key", API_KEY)])
            .await
            .unwrap();
        assert_eq!(reply.status, expected);
    }
    let logged = logs.text();
    assert!(
        logged.contains("HttpCall") && logged.contains("x-api-key"),
        "the call was recorded: {logged}"
    );
    assert!(
        logged.contains("rate limited"),
        "decisions were logged: {logged}"
    );
    assert_clean("the log", &logged);
}
