//! `examples/inspect.rs` run as an operator runs it: against budgets another
//! process counted in a real redis-server (the harness starts it), and in
//! memory, where it makes its own requests first.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use ratelimit_runtime::{RateLimiter, rate_limit};
use ratelimit_test_support::{RedisServer, http};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

// Two of the example servers' rules, as they declare them: this process
// counts under them; the example reads what it counted.

#[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
async fn limit_test3() -> impl IntoResponse {
    "3"
}

#[rate_limit(key = "api_key_test", period = 10, count = 5, by = header("x-api-key"))]
async fn api() -> impl IntoResponse {
    "api"
}

/// The example's executable, built once (as the rest of the suite was built:
/// the workspace with every feature, so nothing is built again).
fn inspect_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| common::example_binary("inspect"))
}

/// The key secret the server and the example share, as instances do.
const SECRET: &str = "inspect-test-secret";

fn run(redis_url: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(inspect_binary());
    command
        .args(args)
        .env_remove("REDIS_URL")
        .env("RATELIMIT_KEY_SECRET", SECRET);
    if let Some(url) = redis_url {
        command.env("REDIS_URL", url);
    }
    command.output().expect("the example runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn serve(limiter: RateLimiter) -> SocketAddr {
    let app = Router::new()
        .route("/limitTest3", get(limit_test3))
        .route("/api", get(api))
        .layer(axum::Extension(limiter));
    common::serve_axum(app).await
}

#[tokio::test(flavor = "multi_thread")]
async fn it_reads_in_redis_what_a_server_counted_and_counts_nothing() {
    // Built before anything is counted: a build can outlast the rules'
    // 10 s windows on a busy machine, and the budgets read would be whole.
    tokio::task::spawn_blocking(inspect_binary).await.unwrap();
    let redis = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(redis.url())
        .key_secret(SECRET)
        .build()
        .await
        .unwrap();
    let addr = serve(limiter).await;
    for _ in 0..2 {
        assert_eq!(
            http(ONE, addr, "GET", "/limitTest3", &[])
                .await
                .unwrap()
                .status,
            200
        );
    }
    let api = [("x-api-key", "key-1")];
    assert_eq!(
        http(ONE, addr, "GET", "/api", &api).await.unwrap().status,
        200
    );

    let url = redis.url();
    let report = tokio::task::spawn_blocking(move || {
        let ip = ["ip_limit_test", "ip:127.0.0.1"];
        let first = stdout(&run(Some(&url), &ip));
        // A peek counts nothing: asked again, the same budget.
        let again = stdout(&run(Some(&url), &ip));
        let header = stdout(&run(
            Some(&url),
            &["api_key_test", "header:x-api-key:key-1"],
        ));
        let other = stdout(&run(Some(&url), &["ip_limit_test", "ip:127.0.0.2"]));
        (first, again, header, other)
    })
    .await
    .unwrap();
    let (first, again, header, other) = report;
    assert!(
        first.starts_with(&format!("budgets kept in Redis at {}", redis.url())),
        "{first}"
    );
    assert!(
        !first.contains("in memory"),
        "no requests of its own: {first}"
    );
    assert!(
        first.contains("ip_limit_test for ip:127.0.0.1: 1 of 3 left\n  the next call passes\n  the whole budget is back in "),
        "{first}"
    );
    assert!(
        again.contains("ip_limit_test for ip:127.0.0.1: 1 of 3 left"),
        "{again}"
    );
    // The header's value is digested as the server's key holds it.
    assert!(
        header.contains("api_key_test for header:x-api-key:#"),
        "{header}"
    );
    assert!(header.contains(": 4 of 5 left"), "{header}");
    assert!(
        other.contains("ip_limit_test for ip:127.0.0.2: 3 of 3 left\n  the next call passes\n  the budget is whole"),
        "{other}"
    );
}

#[test]
fn in_memory_it_makes_its_own_requests_first() {
    let report = stdout(&run(None, &["limitTest"]));
    assert!(
        report.starts_with("budgets kept in process memory"),
        "{report}"
    );
    assert!(
        report.contains("2 requests to /limitTest from 127.0.0.1 first (answered 200, 200)"),
        "{report}"
    );
    assert!(
        report.contains(
            "limitTest for everyone: 0 of 2 left\n  the next call is refused; calls pass again in "
        ),
        "{report}"
    );
    let report = stdout(&run(None, &["ip_limit_test", "ip:10.1.2.3"]));
    assert!(
        report.contains("2 requests to /limitTest3 from 10.1.2.3"),
        "{report}"
    );
    assert!(
        report.contains("ip_limit_test for ip:10.1.2.3: 1 of 3 left"),
        "{report}"
    );
}

#[test]
fn an_unknown_rule_is_an_error_that_lists_the_rules() {
    let output = run(None, &["no_such_rule"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no rate-limit rule is named \"no_such_rule\""),
        "{stderr}"
    );
    assert!(stderr.contains("ip_limit_test"), "{stderr}");
    let usage = run(None, &[]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&usage.stderr)
            .contains("usage: cargo run --example inspect -- RULE [SUBJECT]")
    );
}

#[test]
fn it_prints_where_budgets_are_without_the_password() {
    let server = ratelimit_test_support::acl_server();
    let url = format!("redis://limiter:s3cret@127.0.0.1:{}/", server.port());
    let report = stdout(&run(Some(&url), &["ip_limit_test", "ip:127.0.0.1"]));
    assert!(
        report.starts_with(&format!(
            "budgets kept in Redis at redis://limiter:***@127.0.0.1:{}/",
            server.port()
        )),
        "{report}"
    );
    assert!(!report.contains("s3cret"), "{report}");
}
