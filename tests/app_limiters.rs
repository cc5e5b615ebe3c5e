//! Handlers whose rules charge no client (`by = global`) and whose return
//! type is no `impl Responder`/`impl IntoResponse` see their app's limiter
//! and options when they take an `HttpCall`; without one they count in the
//! process's default limiter, apart from the app's, and the log says so
//! once. Over real TCP, in actix-web and axum.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use axum::Extension;
use axum::http::StatusCode;
use axum::routing::get;
use common::{Logs, serve_actix, serve_axum};
use ratelimit_runtime::{
    HeaderStyle, HttpCall, HttpOptions, RateLimited, RateLimiter, Rule, rate_limit,
};
use ratelimit_test_support::http;

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const ONE: Rule = Rule::fixed_window(1, Duration::from_secs(60));

#[rate_limit(key = "app_response", rule = ONE)]
async fn actix_response(_call: HttpCall) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().body("ok")
}

#[rate_limit(key = "app_result", rule = ONE)]
async fn actix_result(_call: HttpCall) -> Result<actix_web::HttpResponse, actix_web::Error> {
    Ok(actix_web::HttpResponse::Ok().body("ok"))
}

#[rate_limit(key = "app_axum_result", rule = ONE)]
async fn axum_result(_call: HttpCall) -> Result<&'static str, StatusCode> {
    Ok("ok")
}

#[rate_limit(key = "app_apart", rule = ONE)]
async fn apart() -> Result<&'static str, RateLimited> {
    Ok("ok")
}

/// The app's options: the legacy fields, which the defaults do not send.
fn legacy() -> HttpOptions {
    HttpOptions::new().headers(HeaderStyle::Legacy)
}

/// `path` answers 200 then 429 with the app's (legacy) fields, and the
/// app's limiter holds the count: its next call would be refused.
async fn counts_in_the_app(addr: std::net::SocketAddr, path: &str, app: &RateLimiter, key: &str) {
    for expected in [200, 429] {
        let reply = http(PEER, addr, "GET", path, &[]).await.unwrap();
        assert_eq!(reply.status, expected, "{path}: {reply:?}");
        assert_eq!(reply.header("x-ratelimit-limit"), Some("1"), "{path}");
    }
    let next = app.peek(&ONE, key).await.unwrap();
    assert!(!next.allowed, "{path}: counted in the app's limiter");
}

#[actix_web::test]
async fn handlers_taking_an_http_call_use_their_apps_limiter_and_options() {
    let app = RateLimiter::in_memory();
    let limiter = app.clone();
    let addr = serve_actix!(move || {
        actix_web::App::new()
            .app_data(limiter.clone())
            .app_data(legacy())
            .route("/response", actix_web::web::get().to(actix_response))
            .route("/result", actix_web::web::get().to(actix_result))
    });
    counts_in_the_app(addr, "/response", &app, "limiter:app_response").await;
    counts_in_the_app(addr, "/result", &app, "limiter:app_result").await;

    let app = RateLimiter::in_memory();
    let router = axum::Router::new()
        .route("/result", get(axum_result))
        .layer(Extension(app.clone()))
        .layer(Extension(legacy()));
    let addr = serve_axum(router).await;
    counts_in_the_app(addr, "/result", &app, "limiter:app_axum_result").await;
}

/// Once an app has handed a request its own limiter, a rule on a fn that
/// cannot see it (no `HttpCall`) counts in the in-memory default: one
/// warning names it, however often it is checked.
#[tokio::test]
async fn a_rule_counted_apart_from_the_apps_limiter_says_so_once() {
    let logs = Logs::default();
    let _logging = tracing::subscriber::set_default(
        logs.subscriber(tracing_subscriber::filter::LevelFilter::WARN),
    );
    let app = RateLimiter::in_memory();
    let router = axum::Router::new()
        .route("/call", get(axum_result))
        .route("/apart", get(apart))
        .layer(Extension(app.clone()));
    let addr = serve_axum(router).await;
    let reply = http(PEER, addr, "GET", "/apart", &[]).await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(
        logs.text().is_empty(),
        "no app limiter seen yet: {}",
        logs.text()
    );

    let reply = http(PEER, addr, "GET", "/call", &[]).await.unwrap();
    assert_eq!(reply.status, 200);
    for _ in 0..3 {
        let reply = http(PEER, addr, "GET", "/apart", &[]).await.unwrap();
        assert_eq!(reply.status, 429);
    }
    let logged = logs.text();
    assert_eq!(logged.matches("WARN").count(), 1, "{logged}");
    assert!(
        logged.contains("app_apart") && logged.contains("HttpCall"),
        "{logged}"
    );
    let next = app.peek(&ONE, "limiter:app_apart").await.unwrap();
    assert!(next.allowed, "the app's limiter never saw the rule");
}
