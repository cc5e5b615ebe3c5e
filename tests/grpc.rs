//! The tower layer's refusals of gRPC requests, over real TCP: a gRPC
//! client reads `grpc-status`, not the HTTP status, so each cause of a
//! refusal has its own: over the limit `RESOURCE_EXHAUSTED` (8), the
//! limiter unable to decide `UNAVAILABLE` (14, a client may try again), an
//! unknown client `INVALID_ARGUMENT` (3).

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use ratelimit_runtime::{OnError, RateLimitLayer, RateLimiter, Rule};
use ratelimit_test_support::{HttpReply, free_port, http};

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const ONE: Rule = Rule::fixed_window(1, Duration::from_secs(60));
const PATH: &str = "/echo.Echo/Say";

fn service(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(PATH, post(|| async { "ok" }))
        .layer(layer)
}

async fn call(addr: SocketAddr) -> HttpReply {
    http(
        PEER,
        addr,
        "POST",
        PATH,
        &[("content-type", "application/grpc")],
    )
    .await
    .expect("a reply")
}

/// A refusal as gRPC has it: HTTP 200, `application/grpc`, the status.
fn refused_with(reply: &HttpReply, status: &str) {
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/grpc"));
    assert_eq!(reply.header("grpc-status"), Some(status), "{reply:?}");
    assert!(reply.header("grpc-message").is_some(), "{reply:?}");
}

#[tokio::test]
async fn each_refusal_of_a_grpc_request_has_its_grpc_status() {
    let limited = RateLimitLayer::new(ONE).name("grpc_limited").by_ip();
    let addr = common::serve_axum(service(limited)).await;
    let first = call(addr).await;
    assert_eq!(
        (first.status, first.header("grpc-status")),
        (200, None),
        "{first:?}"
    );
    refused_with(&call(addr).await, "8");

    // Redis down, the policy `deny`: the limiter cannot decide.
    let down = RateLimiter::builder()
        .redis(format!("redis://127.0.0.1:{}/", free_port()))
        .start_degraded(true)
        .timeout(Duration::from_millis(200))
        .on_backend_error(OnError::Deny)
        .build()
        .await
        .unwrap();
    let failing = RateLimitLayer::new(ONE)
        .name("grpc_failing")
        .by_ip()
        .limiter(down);
    let addr = common::serve_axum(service(failing)).await;
    refused_with(&call(addr).await, "14");

    // Served without the peer's address: the client is unknown.
    let unknown = RateLimitLayer::new(ONE).name("grpc_unknown").by_ip();
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, service(unknown)).await });
    refused_with(&call(addr).await, "3");
}
