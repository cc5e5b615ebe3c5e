//! `#[rate_limit]` on actix-web handlers, over real HTTP: a server on
//! 127.0.0.1, clients from 127.0.0.1 and 127.0.0.2. The limiter is the
//! in-memory default (one test gives its apps limiters of their own); every
//! handler has its own key.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, Responder, get, post, web};
use ratelimit_runtime::{RateLimited, RateLimiter, Rule, rate_limit};
use ratelimit_test_support::{HttpReply, http};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const TWO: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

// The recommended order: `#[rate_limit]` above the route attribute; the
// macro adds the `HttpRequest` it needs.
#[rate_limit(key = "above", period = 10, count = 3, by = ip)]
#[get("/above")]
async fn above() -> impl Responder {
    "above"
}

// The other order, with a request of the handler's own.
#[get("/below")]
#[rate_limit(key = "below", period = 10, count = 3, by = ip)]
async fn below(req: HttpRequest) -> impl Responder {
    format!("below {}", req.path())
}

#[get("/global")]
#[rate_limit(key = "global", count = 2, period = 10)]
async fn global() -> Result<String, actix_web::Error> {
    Ok("global".into())
}

#[rate_limit(key = "header", count = 1, period = 10, by = header("X-Api-Key"))]
#[post("/header")]
async fn by_header() -> HttpResponse {
    HttpResponse::Ok().body("header")
}

#[rate_limit(key = "demote:{name}", count = 1, period = 10, fallback = try_later)]
#[get("/demote/{name}")]
async fn demote(name: web::Path<String>) -> impl Responder {
    format!("hello {name}")
}

async fn try_later(name: web::Path<String>, limited: RateLimited) -> impl Responder {
    HttpResponse::ServiceUnavailable()
        .insert_header(("x-demoted", "1"))
        .body(format!(
            "{name}: try again later ({} s)",
            limited.retry_after_secs()
        ))
}

#[get("/fixed")]
#[rate_limit(key = "fixed-key", count = 2, period = 10)]
async fn fixed() -> impl Responder {
    "fixed"
}

/// A fixed key's state is kept apart (pinned) in the first store its call
/// site meets: each app's limiter still keeps a budget of its own, and a
/// check by hand of the same key shares it, whichever store was first.
#[actix_web::test]
async fn a_fixed_key_has_one_budget_per_store_shared_with_checks_by_hand() {
    let rule = Rule::fixed_window(2, Duration::from_secs(10));
    for _ in 0..2 {
        let limiter = RateLimiter::in_memory();
        let addr = serve_with(limiter.clone());
        assert_eq!(get_from(ONE, addr, "/fixed").await.body, "fixed");
        let by_hand = limiter.check(&rule, "limiter:fixed-key").await.unwrap();
        assert!(by_hand.allowed);
        assert_eq!(by_hand.remaining, 0, "the handler's call counted");
        assert_limited(&get_from(TWO, addr, "/fixed").await);
        assert!(
            !limiter
                .check(&rule, "limiter:fixed-key")
                .await
                .unwrap()
                .allowed
        );
    }
}

/// A server of every handler above, on the global limiter.
async fn serve() -> SocketAddr {
    serve_with(RateLimiter::global().clone())
}

/// The same, with `limiter` as its app's.
fn serve_with(limiter: RateLimiter) -> SocketAddr {
    common::serve_actix!(move || {
        App::new()
            .app_data(limiter.clone())
            .service(fixed)
            .service(above)
            .service(below)
            .service(global)
            .service(by_header)
            .service(demote)
    })
}

async fn get_from(from: IpAddr, addr: SocketAddr, path: &str) -> HttpReply {
    http(from, addr, "GET", path, &[])
        .await
        .expect("an HTTP reply")
}

fn assert_limited(reply: &HttpReply) {
    assert_eq!(reply.status, 429, "{reply:?}");
    let retry_after: u64 = reply
        .header("retry-after")
        .expect("Retry-After on a 429")
        .parse()
        .expect("whole seconds");
    assert!((1..=10).contains(&retry_after), "{reply:?}");
}

async fn separate_budgets_per_client_address(path: &str) {
    let addr = serve().await;
    for _ in 0..3 {
        assert_eq!(get_from(ONE, addr, path).await.status, 200);
    }
    assert_limited(&get_from(ONE, addr, path).await);
    // Another client address has a budget of its own.
    for _ in 0..3 {
        assert_eq!(get_from(TWO, addr, path).await.status, 200);
    }
    assert_limited(&get_from(TWO, addr, path).await);
    assert_limited(&get_from(ONE, addr, path).await);
}

#[actix_web::test]
async fn by_ip_above_the_route() {
    separate_budgets_per_client_address("/above").await;
}

#[actix_web::test]
async fn by_ip_below_the_route() {
    separate_budgets_per_client_address("/below").await;
    let addr = serve().await;
    let reply = get_from(ONE, addr, "/below").await;
    assert_eq!(
        reply.status, 429,
        "the budget is the process's, not the server's"
    );
}

#[actix_web::test]
async fn a_global_rule_is_shared_by_every_client_and_answers_429() {
    let addr = serve().await;
    assert_eq!(get_from(ONE, addr, "/global").await.body, "global");
    assert_eq!(get_from(TWO, addr, "/global").await.status, 200);
    let reply = get_from(ONE, addr, "/global").await;
    assert_limited(&reply);
    assert!(reply.body.starts_with("Too Many Requests"), "{reply:?}");
}

#[actix_web::test]
async fn by_header_gives_each_header_value_a_budget() {
    let addr = serve().await;
    let post = |key: &'static str| async move {
        http(ONE, addr, "POST", "/header", &[("x-api-key", key)])
            .await
            .unwrap()
    };
    assert_eq!(post("alpha").await.status, 200);
    assert_limited(&post("alpha").await);
    assert_eq!(post("beta").await.status, 200);
}

#[actix_web::test]
async fn the_fallback_answers_for_a_limited_handler() {
    let addr = serve().await;
    assert_eq!(get_from(ONE, addr, "/demote/ann").await.body, "hello ann");
    let reply = get_from(ONE, addr, "/demote/ann").await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("x-demoted"), Some("1"));
    assert_eq!(reply.body, "ann: try again later (10 s)");
    assert_eq!(get_from(ONE, addr, "/demote/bob").await.status, 200);
}
