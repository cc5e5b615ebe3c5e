//! What a budget holds, in words: `cargo run --example inspect -- RULE [SUBJECT]`.
//!
//! It asks [`RateLimiter::peek_named`] about the rule named RULE (a
//! `#[rate_limit]`'s `key` as written) for SUBJECT, and counts nothing.
//! SUBJECT is what follows the rule's name in its key: nothing for a rule of
//! everyone, `ip:<address>` for `by = ip`, `header:<name>:<value>` for
//! `by = header(..)` (the value is digested here as the servers digest it;
//! a digest, `#` and 32 hex digits, is taken as it is).
//!
//! A rule is known by name only in a program that declares it, so an
//! application builds this into its own tools (an admin endpoint, a
//! command). This one declares the example servers' rules, as they do, to
//! read their budgets in Redis:
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example axum_server &
//! curl -s http://127.0.0.1:8080/limitTest3; curl -s http://127.0.0.1:8080/limitTest3
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example inspect -- ip_limit_test ip:127.0.0.1
//! ```
//!
//! Without `REDIS_URL` the budgets are in this process's memory, where no
//! other process's calls show: it first sends two requests of its own
//! through the rule's handler as SUBJECT (in process, no server), so there is
//! something to read.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::response::IntoResponse;
use axum::routing::get;
use ratelimit_runtime::{Decision, HttpOptions, RateLimiter, rate_limit};
use tower::ServiceExt;

// The example servers' rules (`examples/axum_server.rs`), with their names
// and numbers; `user_test:{name}` is left out: a key with a placeholder has
// no name to look it up by.

#[rate_limit(key = "limitTest", period = 1, count = 2)]
async fn limit_test() -> impl IntoResponse {}

#[rate_limit(key = "customer_limit_test", period = 10, count = 3)]
async fn limit_test2() -> impl IntoResponse {}

#[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
async fn limit_test3() -> impl IntoResponse {}

#[rate_limit(key = "demote_test", period = 10, count = 3, by = ip)]
async fn limit_test4() -> impl IntoResponse {}

#[rate_limit(key = "api_key_test", period = 10, count = 5, by = header("x-api-key"))]
async fn api() -> impl IntoResponse {}

/// Each rule's route, for the requests made in memory.
const ROUTES: [(&str, &str); 5] = [
    ("limitTest", "/limitTest"),
    ("customer_limit_test", "/limitTest2"),
    ("ip_limit_test", "/limitTest3"),
    ("demote_test", "/limitTest4"),
    ("api_key_test", "/api"),
];

fn endpoints() -> Router {
    Router::new()
        .route("/limitTest", get(limit_test))
        .route("/limitTest2", get(limit_test2))
        .route("/limitTest3", get(limit_test3))
        .route("/limitTest4", get(limit_test4))
        .route("/api", get(api))
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(rule) = args.next() else {
        eprintln!(
            "usage: cargo run --example inspect -- RULE [SUBJECT]\n\
             rules: {}\n\
             subjects: \"\" (everyone), ip:<address>, header:<name>:<value>",
            ratelimit_runtime::overrides::rule_names().join(", ")
        );
        return ExitCode::from(2);
    };
    let subject = args.next().unwrap_or_default();
    match inspect(&rule, &subject).await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn inspect(rule: &str, written: &str) -> Result<String, String> {
    let (limiter, backend) = support::limiter().await.map_err(|e| e.to_string())?;
    let subject = key_subject(&limiter, written)?;
    let mut report = format!("budgets kept in {backend}\n");
    if std::env::var_os("REDIS_URL").is_none() {
        report += &spend(&limiter, rule, written, 2).await?;
    }
    let decision = limiter
        .peek_named(rule, &subject)
        .await
        .map_err(|e| e.to_string())?;
    report += &describe(rule, &subject, &decision);
    Ok(report)
}

/// A header subject with a value in clear gets the value's digest, as the
/// servers' keys hold it (with the limiter's key secret, as they use).
fn key_subject(limiter: &RateLimiter, subject: &str) -> Result<String, String> {
    if let Some(rest) = subject.strip_prefix("header:")
        && let Some((name, value)) = rest.split_once(':')
        && !is_digest(value)
    {
        return HttpOptions::new()
            .subject_of_header(limiter, name, value)
            .map_err(|e| e.to_string());
    }
    Ok(subject.to_owned())
}

fn is_digest(value: &str) -> bool {
    value.len() == 33 && value.starts_with('#') && value[1..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// In memory: `times` requests through the rule's handler as `subject` (as
/// written: a header's value in clear).
async fn spend(
    limiter: &RateLimiter,
    rule: &str,
    subject: &str,
    times: u32,
) -> Result<String, String> {
    let Some((_, path)) = ROUTES.iter().find(|(name, _)| *name == rule) else {
        // Unknown names are reported by `peek_named`, with the list.
        return Ok(String::new());
    };
    let mut peer = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut header = None;
    if let Some(ip) = subject.strip_prefix("ip:") {
        peer = ip.parse().map_err(|_| {
            format!("{subject:?}: write an address after `ip:`, such as ip:127.0.0.1")
        })?;
    } else if let Some(rest) = subject.strip_prefix("header:") {
        let (name, value) = rest.split_once(':').unwrap_or((rest, ""));
        if is_digest(value) {
            return Ok("no requests made first: a digest stands for a value to send\n".to_owned());
        }
        header = Some((name.to_owned(), value.to_owned()));
    }
    let app = endpoints().layer(axum::Extension(limiter.clone()));
    let mut statuses = Vec::new();
    for _ in 0..times {
        let mut request = Request::get(*path);
        if let Some((name, value)) = &header {
            request = request.header(name.as_str(), value.as_str());
        }
        let mut request = request.body(Body::empty()).map_err(|e| e.to_string())?;
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::new(peer, 40000)));
        let response = app
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| e.to_string())?;
        statuses.push(response.status().as_u16().to_string());
    }
    Ok(format!(
        "in memory no other process's calls show: {times} requests to {path} from {peer} first \
         (answered {})\n",
        statuses.join(", ")
    ))
}

/// The decision in words: `peek` answers what the next call would see.
fn describe(rule: &str, subject: &str, next: &Decision) -> String {
    let whose = if subject.is_empty() {
        "everyone"
    } else {
        subject
    };
    // Units left now: the next call's `remaining` is after it.
    let left = if next.allowed { next.remaining + 1 } else { 0 };
    let mut out = format!("{rule} for {whose}: {left} of {} left\n", next.limit);
    if next.allowed {
        out += "  the next call passes\n";
    } else {
        out += &format!(
            "  the next call is refused; calls pass again in {:.1} s\n",
            next.retry_after.as_secs_f64()
        );
    }
    if left == next.limit {
        out += "  the budget is whole";
    } else {
        out += &format!(
            "  the whole budget is back in {:.1} s",
            next.reset_after.as_secs_f64()
        );
    }
    out
}
