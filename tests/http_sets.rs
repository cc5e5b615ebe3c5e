//! A set of rules on the actix-web middleware and the tower layer, over
//! real TCP, in process memory and on Redis: a request passes only if every
//! rule allows it and then takes from each; a refused request takes from
//! none; the refusal is the refusing rule's; the fields list every rule; a
//! tier may be a set of rules; a concurrency rule of a set holds its lease
//! until the response.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use actix_web::dev::ServiceRequest;
use axum::Router;
use axum::http::request::Parts;
use axum::routing::get;
use common::{serve_axum, sf_list};
use ratelimit_runtime::http::Tiers;
use ratelimit_runtime::{RateLimit, RateLimitLayer, RateLimiter, Rule};
use ratelimit_test_support::{HttpReply, RedisCluster, RedisServer, http};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const MINUTE: Duration = Duration::from_secs(60);

const PER_USER_5: Rule = Rule::fixed_window(5, MINUTE);
const GLOBAL_3: Rule = Rule::fixed_window(3, MINUTE);
const GLOBAL_10: Rule = Rule::fixed_window(10, MINUTE);
const PER_USER_2: Rule = Rule::fixed_window(2, MINUTE);

async fn get_as(addr: SocketAddr, path: &str, user: &str) -> HttpReply {
    http(ONE, addr, "GET", path, &[("x-user", user)])
        .await
        .expect("an HTTP reply")
}

/// The user a request names, for the per-user rules.
fn user_of_parts(parts: &Parts) -> Option<String> {
    Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned())
}

fn user_of_request(req: &ServiceRequest) -> Option<String> {
    Some(req.headers().get("x-user")?.to_str().ok()?.to_owned())
}

/// A limiter in memory, or on a fresh redis-server (kept alive by the
/// caller).
async fn limiter(redis: Option<&RedisServer>) -> RateLimiter {
    match redis {
        None => RateLimiter::in_memory(),
        Some(server) => RateLimiter::builder()
            .redis(server.url())
            .key_secret("test secret")
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("a limiter on the test redis-server"),
    }
}

/// What `key`'s budget under `rule` has left (a peek says what would be
/// left after one more call).
async fn left(limiter: &RateLimiter, rule: &Rule, key: &str) -> u64 {
    let next = limiter.peek(rule, key).await.expect("a peek");
    next.remaining + u64::from(next.allowed)
}

/// Serves `/a` behind the layer `layer` (per-user first, then global) and
/// `/b` behind the layer `swapped` (global first, then per-user).
async fn serve_layers(limiter: &RateLimiter, tag: &'static str) -> SocketAddr {
    let names = |n: &str| -> &'static str { Box::leak(format!("{tag}_{n}").into_boxed_str()) };
    let layer = RateLimitLayer::new(PER_USER_5)
        .name(names("user5"))
        .by_key(user_of_parts)
        .and(GLOBAL_3)
        .name(names("global3"))
        .limiter(limiter.clone());
    let swapped = RateLimitLayer::new(GLOBAL_10)
        .name(names("global10"))
        .and(PER_USER_2)
        .name(names("user2"))
        .by_key(user_of_parts)
        .limiter(limiter.clone());
    let a = Router::new()
        .route("/a", get(|| async { "a" }))
        .layer(layer);
    let b = Router::new()
        .route("/b", get(|| async { "b" }))
        .layer(swapped);
    serve_axum(a.merge(b)).await
}

/// The same sets on the actix-web middleware.
fn serve_middleware(limiter: &RateLimiter, tag: &'static str) -> SocketAddr {
    let names = |n: &str| -> &'static str { Box::leak(format!("{tag}_{n}").into_boxed_str()) };
    let middleware = RateLimit::new(PER_USER_5)
        .name(names("user5"))
        .by_key(user_of_request)
        .and(GLOBAL_3)
        .name(names("global3"));
    let swapped = RateLimit::new(GLOBAL_10)
        .name(names("global10"))
        .and(PER_USER_2)
        .name(names("user2"))
        .by_key(user_of_request);
    let limiter = limiter.clone();
    common::serve_actix!(move || {
        use actix_web::web;
        actix_web::App::new()
            .app_data(limiter.clone())
            .service(
                web::scope("/a")
                    .wrap(middleware.clone())
                    .route("", web::get().to(|| async { "a" })),
            )
            .service(
                web::scope("/b")
                    .wrap(swapped.clone())
                    .route("", web::get().to(|| async { "b" })),
            )
    })
}

/// Issue 56's two scenarios, through the sets `serve_layers` (or
/// `serve_middleware`) serve at `addr`, keyed `tag_*`.
async fn both_orders_charge_nothing_when_refused(
    addr: SocketAddr,
    limiter: &RateLimiter,
    tag: &str,
) {
    // Per-user 5, then global 3: 10 calls, 3 pass, her own budget is at 2.
    let mut passed = 0;
    let mut last = None;
    for _ in 0..10 {
        let reply = get_as(addr, "/a", "ann").await;
        passed += usize::from(reply.status == 200);
        last = Some(reply);
    }
    assert_eq!(passed, 3, "{tag}");
    let user_key = format!("limiter:{tag}_user5:key:ann");
    assert_eq!(
        left(limiter, &PER_USER_5, &user_key).await,
        2,
        "{tag}: the refused calls took nothing"
    );
    // The refusal is the global rule's, and lists the per-user rule too.
    let refused = last.unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    let state: Vec<(String, i64)> = sf_list(refused.header("ratelimit").unwrap())
        .into_iter()
        .map(|(name, params)| (name, params["r"]))
        .collect();
    assert!(
        state.contains(&(format!("{tag}_global3"), 0)),
        "{tag}: {state:?}"
    );
    assert!(
        state.contains(&(format!("{tag}_user5"), 2)),
        "{tag}: {state:?}"
    );

    // Global 10, then per-user 2: three users, 5 calls each: 6 passes, and
    // 4 left for the next user (who gets 2, her own budget).
    let mut passed = 0;
    for user in ["u1", "u2", "u3"] {
        for _ in 0..5 {
            passed += usize::from(get_as(addr, "/b", user).await.status == 200);
        }
    }
    assert_eq!(passed, 6, "{tag}");
    let global_key = format!("limiter:{tag}_global10");
    assert_eq!(left(limiter, &GLOBAL_10, &global_key).await, 4, "{tag}");
    let next = get_as(addr, "/b", "u4").await;
    assert_eq!(next.status, 200);
    // Both rules' fields on an allowed response.
    let policy = sf_list(next.header("ratelimit-policy").unwrap());
    let names: Vec<&str> = policy.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, [format!("{tag}_global10"), format!("{tag}_user2")]);
}

#[tokio::test]
async fn a_set_on_the_layer_is_one_decision_in_memory() {
    let limiter = limiter(None).await;
    let addr = serve_layers(&limiter, "layer_mem").await;
    both_orders_charge_nothing_when_refused(addr, &limiter, "layer_mem").await;
}

#[tokio::test]
async fn a_set_on_the_layer_is_one_decision_on_redis() {
    let redis = RedisServer::start();
    let limiter = limiter(Some(&redis)).await;
    let addr = serve_layers(&limiter, "layer_redis").await;
    both_orders_charge_nothing_when_refused(addr, &limiter, "layer_redis").await;
}

#[actix_web::test]
async fn a_set_on_the_middleware_is_one_decision_in_memory() {
    let limiter = limiter(None).await;
    let addr = serve_middleware(&limiter, "mw_mem");
    both_orders_charge_nothing_when_refused(addr, &limiter, "mw_mem").await;
}

#[actix_web::test]
async fn a_set_on_the_middleware_is_one_decision_on_redis() {
    let redis = RedisServer::start();
    let limiter = limiter(Some(&redis)).await;
    let addr = serve_middleware(&limiter, "mw_redis");
    both_orders_charge_nothing_when_refused(addr, &limiter, "mw_redis").await;
}

/// On a 3-master cluster (the sets' keys spread over masters, taken one
/// after another and given back if one refuses): the layer and the
/// middleware, both orders.
#[actix_web::test]
async fn sets_on_the_adapters_are_one_decision_on_a_cluster() {
    let cluster = RedisCluster::start();
    let limiter = RateLimiter::builder()
        .redis(cluster.urls())
        .key_secret("test secret")
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("a limiter on the test cluster");
    let addr = serve_layers(&limiter, "layer_cluster").await;
    both_orders_charge_nothing_when_refused(addr, &limiter, "layer_cluster").await;
    let addr = serve_middleware(&limiter, "mw_cluster");
    both_orders_charge_nothing_when_refused(addr, &limiter, "mw_cluster").await;
}

/// A tier that is a set (the free plan: 3 a "day", here ten minutes, and 2
/// a minute), with the layer's global rule beside it for every plan.
async fn tiers_of_sets(redis: Option<&RedisServer>, tag: &'static str) {
    let limiter = limiter(redis).await;
    let name = |n: &str| -> &'static str { Box::leak(format!("{tag}_{n}").into_boxed_str()) };
    let (daily, minute, pro) = (name("free"), name("free_minute"), name("pro"));
    // The daily rule first: one by one, the refused calls would spend it.
    let plans = Tiers::new()
        .tier(daily, Rule::fixed_window(3, 10 * MINUTE))
        .and(minute, Rule::fixed_window(2, MINUTE))
        .tier(pro, Rule::fixed_window(4, MINUTE));
    let layer = RateLimitLayer::new(Rule::fixed_window(1, MINUTE))
        .name(name("plan"))
        .by_key(user_of_parts)
        .tiers(plans, move |parts| {
            let plan = parts.headers.get("x-plan")?.to_str().ok()?;
            Some(format!("{tag}_{plan}"))
        })
        .and(Rule::fixed_window(100, MINUTE))
        .name(name("everyone"))
        .limiter(limiter.clone());
    let addr = serve_axum(
        Router::new()
            .route("/t", get(|| async { "t" }))
            .layer(layer),
    )
    .await;
    let call = |user: &'static str, plan: &'static str| async move {
        http(
            ONE,
            addr,
            "GET",
            "/t",
            &[("x-user", user), ("x-plan", plan)],
        )
        .await
        .expect("an HTTP reply")
    };
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(call("ann", "free").await.status);
    }
    assert_eq!(statuses, [200, 200, 429, 429], "{tag}: the free plan");
    // The refused calls took nothing from the daily budget nor the global one.
    let daily_key = format!("limiter:{daily}:key:ann");
    let daily_rule = Rule::fixed_window(3, 10 * MINUTE);
    assert_eq!(left(&limiter, &daily_rule, &daily_key).await, 1, "{tag}");
    let everyone = format!("limiter:{tag}_everyone");
    let everyone_rule = Rule::fixed_window(100, MINUTE);
    assert_eq!(left(&limiter, &everyone_rule, &everyone).await, 98, "{tag}");
    let pro_reply = call("bob", "pro").await;
    let state = sf_list(pro_reply.header("ratelimit").unwrap());
    let names: Vec<&str> = state.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, [pro, name("everyone")], "{tag}");
    let mut statuses = vec![pro_reply.status];
    for _ in 0..4 {
        statuses.push(call("bob", "pro").await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429], "{tag}: the pro plan");
    // No plan: the layer's own first rule (1 a minute), with the global one.
    assert_eq!(call("cy", "none").await.status, 200);
    assert_eq!(call("cy", "none").await.status, 429);
}

#[tokio::test]
async fn a_tier_is_a_set_of_rules_in_memory() {
    tiers_of_sets(None, "tiers_mem").await;
}

#[tokio::test]
async fn a_tier_is_a_set_of_rules_on_redis() {
    let redis = RedisServer::start();
    tiers_of_sets(Some(&redis), "tiers_redis").await;
}

/// A concurrency rule of a set takes its lease only when the whole set
/// passes, and holds it until the response is produced.
#[tokio::test]
async fn a_concurrency_rule_of_a_set_holds_its_lease_until_the_response() {
    let limiter = RateLimiter::in_memory();
    let window = Rule::fixed_window(100, MINUTE);
    let layer = RateLimitLayer::new(Rule::concurrency(1, MINUTE))
        .name("set_slots")
        .and(window)
        .name("set_window")
        .limiter(limiter.clone());
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        "slow"
    };
    let addr = serve_axum(Router::new().route("/slow", get(slow)).layer(layer)).await;
    let first = tokio::spawn(async move { get_as(addr, "/slow", "a").await.status });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = get_as(addr, "/slow", "b").await;
    assert_eq!(second.status, 429, "the lease is held: {second:?}");
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(get_as(addr, "/slow", "c").await.status, 200, "given back");
    // Only the two passes took from the window.
    assert_eq!(left(&limiter, &window, "limiter:set_window").await, 98);
}

/// Two rules of one set under one name would share budgets and headers:
/// a programming error, caught when the middleware is built.
#[test]
#[should_panic(expected = "each rule needs a name of its own")]
fn two_rules_of_a_set_cannot_share_a_name() {
    let _ = RateLimitLayer::new(GLOBAL_3)
        .name("set_twice")
        .and(GLOBAL_10)
        .name("set_twice");
}
