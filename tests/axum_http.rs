//! axum and the tower layer end to end, over real TCP, in the scenarios of
//! the actix-web tests: two servers on one redis-server share a budget,
//! client addresses and spoofed or trusted forwarding headers, the draft's
//! structured fields, fallbacks, every `by`, and the `RateLimitLayer` under
//! `Router::layer`, `route_layer` and over a plain tower service.

mod common;

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Extension, Router};
use common::{params, serve_axum as serve, sf_list};
use ratelimit_runtime::{
    HttpOptions, RateLimitLayer, RateLimited, RateLimiter, Rule, UnknownClient, rate_limit,
};
use ratelimit_test_support::{HttpReply, RedisServer, http, http_bytes};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const TWO: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

#[rate_limit(key = "axum_limitTest3", period = 10, count = 3, by = ip)]
async fn limit_test3() -> impl IntoResponse {
    "3"
}

#[rate_limit(key = "axum_limitTest", period = 10, count = 2)]
async fn limit_test() -> impl IntoResponse {
    "1"
}

async fn slow_down(_body: String, limited: RateLimited) -> impl IntoResponse {
    (
        StatusCode::IM_A_TEAPOT,
        format!("wait {}", limited.retry_after_secs()),
    )
}

/// A fallback, stacked rules and a body extractor after the one the
/// attribute adds.
#[rate_limit(key = "axum_demote", period = 10, count = 1, by = ip, fallback = slow_down)]
#[rate_limit(key = "axum_posted", period = 10, count = 5)]
async fn demote(body: String) -> impl IntoResponse {
    format!("got {body}")
}

/// Per header value, and per path value through axum's `Path` pattern.
#[rate_limit(key = "axum_api", period = 10, count = 2, by = header("x-api-key"))]
async fn api() -> impl IntoResponse {
    "api"
}

#[rate_limit(key = "axum_user:{name}", period = 10, count = 1)]
async fn user(Path(name): Path<String>) -> Result<String, RateLimited> {
    Ok(format!("user {name}"))
}

fn router() -> Router {
    Router::new()
        .route("/limitTest3", get(limit_test3))
        .route("/limitTest", get(limit_test))
        .route("/demote", post(demote))
        .route("/api", get(api))
        .route("/user/{name}", get(user))
}

/// [`router`] with `limiter` and `options` as extensions.
async fn serve_with(limiter: RateLimiter, options: HttpOptions) -> SocketAddr {
    serve(router().layer(Extension(limiter)).layer(Extension(options))).await
}

async fn get_from(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> HttpReply {
    http(from, addr, "GET", path, headers)
        .await
        .expect("an HTTP reply")
}

#[tokio::test]
async fn two_servers_on_one_redis_share_a_budget_per_client_address() {
    let redis = RedisServer::start();
    let limiter = || async {
        RateLimiter::builder()
            .redis(redis.url())
            .key_secret("test secret")
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap()
    };
    let a = serve_with(limiter().await, HttpOptions::new()).await;
    let b = serve_with(limiter().await, HttpOptions::new()).await;
    let mut passed = 0;
    for server in [a, b, a, b, a, b] {
        match get_from(ONE, server, "/limitTest3", &[]).await.status {
            200 => passed += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    assert_eq!(passed, 3, "3 passes in total across both servers");
    // Another client address has its own budget, on either server.
    assert_eq!(get_from(TWO, b, "/limitTest3", &[]).await.status, 200);
    assert_eq!(
        redis
            .keys_with_pttl("limiter:axum_limitTest3:ip:127.0.0.1")
            .len(),
        1,
        "{:?}",
        redis.keys_with_pttl("*")
    );
    redis.assert_all_keys_expire("limiter:*");
}

#[tokio::test]
async fn every_limited_response_carries_the_draft_fields() {
    let addr = serve_with(RateLimiter::in_memory(), HttpOptions::new()).await;
    let first = get_from(ONE, addr, "/limitTest3", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, "3");
    assert_eq!(
        sf_list(first.header("ratelimit-policy").unwrap()),
        [("axum_limitTest3".to_owned(), params(&[("q", 3), ("w", 10)]))]
    );
    assert_eq!(
        sf_list(first.header("ratelimit").unwrap()),
        [("axum_limitTest3".to_owned(), params(&[("r", 2), ("t", 10)]))]
    );
    assert!(first.header("retry-after").is_none());
    for _ in 0..2 {
        get_from(ONE, addr, "/limitTest3", &[]).await;
    }
    let refused = get_from(ONE, addr, "/limitTest3", &[]).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry));
    let state = sf_list(refused.header("ratelimit").unwrap());
    assert_eq!(state[0].1["r"], 0);
    assert!(refused.body.starts_with("Too Many Requests"), "{refused:?}");
    // A global rule's responses carry them too.
    let global = get_from(ONE, addr, "/limitTest", &[]).await;
    assert_eq!(
        sf_list(global.header("ratelimit").unwrap()),
        [("axum_limitTest".to_owned(), params(&[("r", 1), ("t", 10)]))]
    );
}

#[tokio::test]
async fn a_spoofed_forwarding_header_gets_no_new_budget() {
    let addr = serve_with(RateLimiter::in_memory(), HttpOptions::new()).await;
    for n in 0..5 {
        let spoof = format!("198.51.100.{n}");
        let headers = [
            ("x-forwarded-for", spoof.as_str()),
            ("x-real-ip", spoof.as_str()),
            ("forwarded", "for=203.0.113.9"),
        ];
        let reply = get_from(ONE, addr, "/limitTest3", &headers).await;
        assert_eq!(reply.status, if n < 3 { 200 } else { 429 }, "request {n}");
    }
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_client_counts() {
    let options = HttpOptions::new().trust_proxies(["127.0.0.1"]).unwrap();
    let addr = serve_with(RateLimiter::in_memory(), options).await;
    let via_proxy = |client: &'static str| async move {
        get_from(ONE, addr, "/limitTest3", &[("x-forwarded-for", client)])
            .await
            .status
    };
    for _ in 0..3 {
        assert_eq!(via_proxy("198.51.100.7").await, 200);
    }
    assert_eq!(via_proxy("198.51.100.7").await, 429);
    assert_eq!(via_proxy("198.51.100.8").await, 200, "another client");
    assert_eq!(via_proxy("9.9.9.9, 198.51.100.7").await, 429, "a fake hop");
    // A peer that is not a trusted proxy cannot use the header at all.
    for n in 0..4 {
        let spoof = format!("198.51.100.{}", 20 + n);
        let status = get_from(TWO, addr, "/limitTest3", &[("x-forwarded-for", &spoof)])
            .await
            .status;
        assert_eq!(status, if n < 3 { 200 } else { 429 });
    }
}

/// Bytes that are not text in a forwarding line, before the hop the
/// trusted proxy appended, spoil only their own hop: the client the proxy
/// named keeps one budget, whatever it writes. (One such byte used to make
/// the whole line unreadable: every request refused as from an unknown
/// client.)
#[tokio::test]
async fn hostile_bytes_in_a_forwarding_header_leave_the_proxys_hop() {
    let options = HttpOptions::new().trust_proxies(["127.0.0.1"]).unwrap();
    let addr = serve_with(RateLimiter::in_memory(), options).await;
    let mut statuses = Vec::new();
    for garbage in [
        &b"\xff\xfe"[..],
        b"\x80, \xc3(",
        b"for=\"\xff\"",
        b"\xff,,, 9.9.9.9 \xfe",
    ] {
        let mut line = garbage.to_vec();
        line.extend_from_slice(b", 198.51.100.99");
        let reply = http_bytes(
            ONE,
            addr,
            "GET",
            "/limitTest3",
            &[("x-forwarded-for", &line)],
        )
        .await
        .unwrap();
        statuses.push(reply.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429], "one client, one budget");
}

/// IPv6 clients are grouped by /64: the same budget for two addresses of
/// one prefix (the address is unit-tested; here, through a trusted proxy).
#[tokio::test]
async fn ipv6_clients_share_their_prefix() {
    let options = HttpOptions::new().trust_proxies(["127.0.0.1"]).unwrap();
    let addr = serve_with(RateLimiter::in_memory(), options).await;
    let statuses: Vec<u16> = statuses_of(
        addr,
        &[
            "2001:db8::1",
            "2001:db8::2",
            "2001:db8::ffff",
            "2001:db8::3",
        ],
    )
    .await;
    assert_eq!(statuses, [200, 200, 200, 429]);
    let other = get_from(
        ONE,
        addr,
        "/limitTest3",
        &[("x-forwarded-for", "2001:db8:0:1::1")],
    )
    .await;
    assert_eq!(other.status, 200, "another /64");
}

async fn statuses_of(addr: SocketAddr, clients: &[&str]) -> Vec<u16> {
    let mut statuses = Vec::new();
    for client in clients {
        let reply = get_from(ONE, addr, "/limitTest3", &[("x-forwarded-for", client)]).await;
        statuses.push(reply.status);
    }
    statuses
}

/// Without axum's `ConnectInfo` the client is unknown: refused (400), never
/// one budget shared by everyone, unless the options say to share one.
#[tokio::test]
async fn without_connect_info_clients_are_unknown_not_one_budget() {
    for (options, expected) in [
        (HttpOptions::new(), [400, 400, 400, 400]),
        (
            HttpOptions::new().unknown_client(UnknownClient::Shared),
            [200, 200, 200, 429],
        ),
    ] {
        let app = router()
            .layer(Extension(RateLimiter::in_memory()))
            .layer(Extension(options));
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        // Served without `into_make_service_with_connect_info`.
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut statuses = Vec::new();
        for from in [ONE, TWO, ONE, TWO] {
            statuses.push(get_from(from, addr, "/limitTest3", &[]).await.status);
        }
        assert_eq!(statuses, expected);
    }
}

#[tokio::test]
async fn fallbacks_headers_and_paths_limit_as_on_actix() {
    let addr = serve_with(RateLimiter::in_memory(), HttpOptions::new()).await;
    // The body extractor after the one the attribute adds.
    let posted = http(ONE, addr, "POST", "/demote", &[("content-length", "0")])
        .await
        .unwrap();
    assert_eq!((posted.status, posted.body.as_str()), (200, "got "));
    assert_eq!(
        sf_list(posted.header("ratelimit").unwrap()).len(),
        2,
        "both rules' fields"
    );
    let demoted = http(ONE, addr, "POST", "/demote", &[("content-length", "0")])
        .await
        .unwrap();
    assert_eq!(demoted.status, 418, "the fallback's own response");
    assert!(demoted.body.starts_with("wait "), "{demoted:?}");
    assert!(demoted.header("ratelimit").is_some());

    for key in ["a", "b"] {
        for expected in [200, 200, 429] {
            let reply = get_from(ONE, addr, "/api", &[("x-api-key", key)]).await;
            assert_eq!(reply.status, expected, "key {key}");
        }
    }
    assert_eq!(get_from(ONE, addr, "/user/ann", &[]).await.status, 200);
    assert_eq!(get_from(ONE, addr, "/user/ann", &[]).await.status, 429);
    assert_eq!(get_from(ONE, addr, "/user/bob", &[]).await.status, 200);
}

/// The app's state, for handlers written as axum's docs write them.
#[derive(Clone)]
struct Shop {
    name: &'static str,
}

/// Destructured extractors, a key from one of them, a fallback, a one-line
/// body.
#[rate_limit(key = "axum_item:{id}", period = 10, count = 1, fallback = item_busy)]
async fn item(State(shop): State<Shop>, Path(id): Path<u32>) -> impl IntoResponse {
    format!("{} sells item {id}", shop.name)
}

/// The fallback takes the handler's extractors, destructured as it likes.
async fn item_busy(
    State(shop): State<Shop>,
    Path(id): Path<u32>,
    limited: RateLimited,
) -> impl IntoResponse {
    let message = format!(
        "{}: item {id} is busy for {} s",
        shop.name,
        limited.retry_after_secs()
    );
    (StatusCode::SERVICE_UNAVAILABLE, message)
}

#[tokio::test]
async fn destructured_extractors_reach_the_key_the_body_and_the_fallback() {
    let app = Router::new()
        .route("/item/{id}", get(item))
        .with_state(Shop {
            name: "corner shop",
        })
        .layer(Extension(RateLimiter::in_memory()));
    let addr = serve(app).await;
    let first = get_from(ONE, addr, "/item/7", &[]).await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "corner shop sells item 7")
    );
    assert!(first.header("ratelimit").is_some(), "{first:?}");
    let second = get_from(ONE, addr, "/item/7", &[]).await;
    assert_eq!(
        second.status, 503,
        "the fallback's own response: {second:?}"
    );
    assert!(
        second.body.starts_with("corner shop: item 7 is busy for "),
        "{second:?}"
    );
    assert!(second.header("ratelimit").is_some(), "{second:?}");
    // The key holds the path's id: another item has its own budget.
    let other = get_from(ONE, addr, "/item/8", &[]).await;
    assert_eq!(
        (other.status, other.body.as_str()),
        (200, "corner shop sells item 8")
    );
}

const LAYERED: Rule = Rule::fixed_window(2, Duration::from_secs(10));

#[tokio::test]
async fn the_layer_limits_a_router_by_ip_header_or_closure_with_allow_lists() {
    let ok = || get(|| async { "ok" });
    let by_ip = Router::new()
        .route("/a", ok())
        .route("/health", ok())
        .layer(
            RateLimitLayer::new(LAYERED)
                .name("axum_layer_ip")
                .by_ip()
                .exempt_path("/health")
                .exempt_key("127.0.0.2"),
        );
    let by_header = Router::new().route("/h", ok()).route_layer(
        RateLimitLayer::new(LAYERED)
            .name("axum_layer_header")
            .by_header("x-api-key")
            .exempt_key("admin"),
    );
    let by_key = Router::new().route("/k", ok()).layer(
        RateLimitLayer::new(LAYERED)
            .name("axum_layer_key")
            .by_key(|parts| parts.uri.query().map(str::to_owned)),
    );
    let addr = serve(
        Router::new()
            .merge(by_ip)
            .merge(by_header)
            .merge(by_key)
            .layer(Extension(RateLimiter::in_memory())),
    )
    .await;
    let statuses = |from, path: &'static str, headers: &'static [(&'static str, &'static str)]| async move {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(get_from(from, addr, path, headers).await.status);
        }
        out
    };
    assert_eq!(statuses(ONE, "/a", &[]).await, [200, 200, 429]);
    assert_eq!(statuses(ONE, "/health", &[]).await, [200; 3], "exempt path");
    assert_eq!(statuses(TWO, "/a", &[]).await, [200; 3], "exempt client");
    assert_eq!(
        statuses(ONE, "/h", &[("x-api-key", "k")]).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(ONE, "/h", &[("x-api-key", "admin")]).await,
        [200; 3]
    );
    assert_eq!(statuses(ONE, "/k?x", &[]).await, [200, 200, 429]);
    assert_eq!(statuses(ONE, "/k?y", &[]).await, [200, 200, 429]);
    assert_eq!(
        statuses(ONE, "/k", &[]).await,
        [200; 3],
        "no key: unlimited"
    );

    let first = get_from(TWO, addr, "/h", &[("x-api-key", "fresh")]).await;
    assert_eq!(
        sf_list(first.header("ratelimit").unwrap()),
        [(
            "axum_layer_header".to_owned(),
            params(&[("r", 1), ("t", 10)])
        )]
    );
    assert_eq!(
        get_from(TWO, addr, "/h", &[("x-api-key", "fresh")])
            .await
            .status,
        200
    );
    let refused = get_from(TWO, addr, "/h", &[("x-api-key", "fresh")]).await;
    assert_eq!(refused.status, 429);
    assert!(refused.header("retry-after").is_some());
}

/// A concurrency rule's lease is held while the inner service runs and
/// given back once it has answered: over a plain tower service.
#[tokio::test]
async fn the_layer_holds_a_lease_until_the_response_and_wraps_any_service() {
    use tower::{Layer, Service, ServiceExt};

    let limiter = RateLimiter::in_memory();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let inner = {
        let (running, most) = (running.clone(), most.clone());
        tower::service_fn(move |_: http::Request<String>| {
            let (running, most) = (running.clone(), most.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"done"),
                )))
            }
        })
    };
    let service = RateLimitLayer::new(Rule::concurrency(2, Duration::from_secs(60)))
        .name("axum_layer_leases")
        .limiter(limiter)
        .layer(inner);
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let response = service
                    .oneshot(http::Request::new(String::new()))
                    .await
                    .unwrap();
                response.status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap().as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
    assert_eq!(most.load(Ordering::SeqCst), 2);
    // Both leases came back with their responses.
    let mut again = service.clone();
    let status = again
        .ready()
        .await
        .unwrap()
        .call(http::Request::new(String::new()))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
}

const SLOTS: Rule = Rule::concurrency(1, Duration::from_secs(60));

/// One call at a time: the lease is held while the body runs.
#[rate_limit(rule = SLOTS, key = "axum_slots")]
async fn one_at_a_time() -> impl IntoResponse {
    tokio::time::sleep(Duration::from_millis(200)).await;
    "done"
}

/// Shadow: counted, never refused; per value of an argument.
#[rate_limit(key = "axum_shadow", count = 1, period = 10, shadow, by = arg(id))]
async fn shadowed(Path(id): Path<u32>) -> impl IntoResponse {
    format!("{id}")
}

#[tokio::test]
async fn concurrency_and_shadow_rules_on_axum_handlers() {
    let app = Router::new()
        .route("/slot", get(one_at_a_time))
        .route("/shadow/{id}", get(shadowed))
        .layer(Extension(RateLimiter::in_memory()));
    let addr = serve(app).await;
    let first = tokio::spawn(async move { get_from(ONE, addr, "/slot", &[]).await.status });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        get_from(TWO, addr, "/slot", &[]).await.status,
        429,
        "one in flight"
    );
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(
        get_from(TWO, addr, "/slot", &[]).await.status,
        200,
        "given back"
    );
    for _ in 0..3 {
        let reply = get_from(ONE, addr, "/shadow/7", &[]).await;
        assert_eq!(reply.status, 200, "shadow never refuses");
    }
}

/// Header values (API keys) never reach Redis key names: a keyed digest
/// stands for them, stable across instances that share the secret; client
/// addresses are readable unless the options digest them too.
#[tokio::test]
async fn header_values_and_optionally_addresses_are_digested_in_keys() {
    let redis = RedisServer::start();
    // Two instances with one secret.
    let instance = || async {
        RateLimiter::builder()
            .redis(redis.url())
            .key_secret("team secret")
            .build()
            .await
            .unwrap()
    };
    let limiter = instance().await;
    let keys = |pattern: &str| -> Vec<String> {
        redis
            .keys_with_pttl(pattern)
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    };
    let a = serve_with(limiter.clone(), HttpOptions::new()).await;
    let b = serve_with(instance().await, HttpOptions::new()).await;
    // The same key from two servers with one secret: one budget.
    for (server, expected) in [(a, 200), (b, 200), (a, 429)] {
        let reply = get_from(ONE, server, "/api", &[("x-api-key", "sk_live_1234")]).await;
        assert_eq!(reply.status, expected);
    }
    let api_keys = keys("limiter:axum_api*");
    assert_eq!(api_keys.len(), 1, "{api_keys:?}");
    assert!(!api_keys[0].contains("sk_live_1234"), "{api_keys:?}");
    assert!(api_keys[0].starts_with("limiter:axum_api:header:x-api-key:#"));

    assert_eq!(get_from(ONE, a, "/limitTest3", &[]).await.status, 200);
    assert_eq!(
        keys("limiter:axum_limitTest3*"),
        ["limiter:axum_limitTest3:ip:127.0.0.1"]
    );
    let hidden = serve_with(limiter, HttpOptions::new().digest_client_ips(true)).await;
    assert_eq!(get_from(TWO, hidden, "/limitTest3", &[]).await.status, 200);
    let ip_keys = keys("limiter:axum_limitTest3*");
    assert_eq!(ip_keys.len(), 2);
    assert!(
        ip_keys.iter().all(|k| !k.contains("127.0.0.2")),
        "{ip_keys:?}"
    );
}

/// An operator unblocks a client by rule name and subject, without knowing
/// how keys are built: a header's budget (its value a digest in the key)
/// and a client address's.
#[tokio::test]
async fn an_operator_resets_a_budget_by_rule_name_and_subject() {
    let limiter = RateLimiter::in_memory();
    let options = HttpOptions::new();
    let addr = serve_with(limiter.clone(), options.clone()).await;
    for expected in [200, 200, 429] {
        let reply = get_from(ONE, addr, "/api", &[("x-api-key", "k1")]).await;
        assert_eq!(reply.status, expected);
    }
    let subject = options
        .subject_of_header(&limiter, "x-api-key", "k1")
        .unwrap();
    let peeked = limiter.peek_named("axum_api", &subject).await.unwrap();
    assert!(!peeked.allowed, "{peeked:?}");
    let whole = limiter.reset_named("axum_api", &subject).await.unwrap();
    assert_eq!(whole.remaining, 1);
    assert_eq!(
        get_from(ONE, addr, "/api", &[("x-api-key", "k1")])
            .await
            .status,
        200
    );

    for _ in 0..4 {
        get_from(TWO, addr, "/limitTest3", &[]).await;
    }
    assert_eq!(get_from(TWO, addr, "/limitTest3", &[]).await.status, 429);
    limiter
        .reset_named("axum_limitTest3", "ip:127.0.0.2")
        .await
        .unwrap();
    assert_eq!(get_from(TWO, addr, "/limitTest3", &[]).await.status, 200);
    let unknown = limiter.reset_named("no-such-rule", "").await.unwrap_err();
    assert!(unknown.to_string().contains("axum_api"), "{unknown}");
}

/// Responses the layer is told not to count (5xx here) give their units
/// back: a failing backend does not use up the client's budget.
#[tokio::test]
async fn the_layer_gives_back_the_units_of_server_errors() {
    let app = Router::new()
        .route("/fails", get(|| async { StatusCode::BAD_GATEWAY }))
        .route("/works", get(|| async { "ok" }))
        .layer(
            RateLimitLayer::new(Rule::fixed_window(2, Duration::from_secs(60)))
                .name("axum_refund_5xx")
                .by_ip()
                .refund_if(|status| status >= 500),
        )
        .layer(Extension(RateLimiter::in_memory()));
    let addr = serve(app).await;
    for _ in 0..5 {
        assert_eq!(get_from(ONE, addr, "/fails", &[]).await.status, 502);
    }
    let statuses = [
        get_from(ONE, addr, "/works", &[]).await.status,
        get_from(ONE, addr, "/works", &[]).await.status,
        get_from(ONE, addr, "/works", &[]).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429], "the failures cost nothing");

    // A service failing with an error, which answers no response: as a 500.
    use tower::{Layer, ServiceExt};
    let inner = tower::service_fn(|request: http::Request<String>| async move {
        if request.uri().path() == "/errs" {
            return Err(std::io::Error::other("down"));
        }
        let body = http_body_util::Full::new(bytes::Bytes::from_static(b"ok"));
        Ok(http::Response::new(body))
    });
    let service = RateLimitLayer::new(Rule::fixed_window(2, Duration::from_secs(60)))
        .name("tower_refund_errors")
        .limiter(RateLimiter::in_memory())
        .refund_if(|status| status >= 500)
        .layer(inner);
    let call = |path: &'static str| {
        let request = http::Request::get(path).body(String::new()).unwrap();
        service.clone().oneshot(request)
    };
    for _ in 0..5 {
        assert!(call("/errs").await.is_err());
    }
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(call("/works").await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429], "the errors cost nothing");
}

/// The app builds refusals itself, for attribute handlers and the layer
/// alike; `Retry-After` and the rate-limit fields are added unless it
/// says not to.
#[tokio::test]
async fn refusals_the_app_builds_itself() {
    use ratelimit_runtime::http::{Refusal, StatusCode as Status};
    let custom = |standard| {
        HttpOptions::new()
            .on_refusal(
                |limited: &RateLimited| Refusal {
                    status: Status::SERVICE_UNAVAILABLE,
                    // Names as people write them.
                    headers: vec![
                        ("Content-Type", "application/problem+json".to_owned()),
                        ("X-Reason", format!("over {}", limited.limit)),
                    ],
                    body: format!(r#"{{"wait":{}}}"#, limited.retry_after_secs()),
                },
                standard,
            )
            .unwrap()
    };
    for standard in [true, false] {
        let layered = Router::new().route("/l", get(|| async { "ok" })).layer(
            RateLimitLayer::new(Rule::fixed_window(1, Duration::from_secs(10)))
                .name("axum_custom_layer"),
        );
        let app = router()
            .merge(layered)
            .layer(Extension(RateLimiter::in_memory()))
            .layer(Extension(custom(standard)));
        let addr = serve(app).await;
        for path in ["/limitTest", "/l"] {
            let mut reply = get_from(ONE, addr, path, &[]).await;
            while reply.status == 200 {
                reply = get_from(ONE, addr, path, &[]).await;
            }
            assert_eq!(reply.status, 503, "{path}");
            assert_eq!(
                reply.header("content-type"),
                Some("application/problem+json")
            );
            assert!(
                reply
                    .header("x-reason")
                    .is_some_and(|r| r.starts_with("over ")),
                "{reply:?}"
            );
            assert!(reply.body.starts_with(r#"{"wait":"#), "{reply:?}");
            assert_eq!(reply.header("retry-after").is_some(), standard, "{path}");
            assert_eq!(reply.header("ratelimit").is_some(), standard, "{path}");
        }
    }
}

/// Rules chosen per request: the plan a header names picks a tier of the
/// table, each its own rule and name (for `reset_named` too); no plan, or
/// one not in the table, leaves the layer's own rule.
#[tokio::test]
async fn the_layer_picks_a_tier_per_request() {
    use ratelimit_runtime::http::Tiers;

    let limiter = RateLimiter::in_memory();
    let plans = Tiers::new()
        .tier("axum_free", Rule::fixed_window(1, Duration::from_secs(10)))
        .tier(
            String::from("axum_pro"),
            Rule::fixed_window(3, Duration::from_secs(10)),
        );
    let app = Router::new()
        .route("/t", get(|| async { "ok" }))
        .layer(
            RateLimitLayer::new(Rule::fixed_window(2, Duration::from_secs(10)))
                .name("axum_tiered")
                .by_header("x-api-key")
                .tiers(plans, |parts| {
                    let plan = parts.headers.get("x-plan")?.to_str().ok()?;
                    Some(format!("axum_{plan}"))
                }),
        )
        .layer(Extension(limiter.clone()));
    let addr = serve(app).await;
    let statuses = |headers: &'static [(&'static str, &'static str)]| async move {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(get_from(ONE, addr, "/t", headers).await.status);
        }
        out
    };
    let pro = &[("x-api-key", "a"), ("x-plan", "pro")];
    assert_eq!(statuses(pro).await, [200, 200, 200, 429]);
    assert_eq!(
        statuses(&[("x-api-key", "b"), ("x-plan", "free")]).await,
        [200, 429, 429, 429]
    );
    assert_eq!(
        statuses(&[("x-api-key", "c")]).await,
        [200, 200, 429, 429],
        "no plan"
    );
    assert_eq!(
        statuses(&[("x-api-key", "d"), ("x-plan", "gold")]).await,
        [200, 200, 429, 429]
    );
    // The tier is a rule of its own name.
    let refused = get_from(ONE, addr, "/t", pro).await;
    assert!(
        refused.header("ratelimit").unwrap().contains("axum_pro"),
        "{refused:?}"
    );
    let subject = HttpOptions::new()
        .subject_of_header(&limiter, "x-api-key", "a")
        .unwrap();
    limiter.reset_named("axum_pro", &subject).await.unwrap();
    assert_eq!(get_from(ONE, addr, "/t", pro).await.status, 200);
}

/// A program that limits by a request header and keeps its budgets in
/// Redis must choose the key secret of the digests that stand for header
/// values: without one, `build` fails and says how to set it (the
/// built-in secret was public, so keys could be tested against guessed
/// API keys). In memory a random secret of the process serves.
#[tokio::test]
async fn a_shared_store_needs_a_key_secret_chosen_at_start_up() {
    let redis = RedisServer::start();
    let error = RateLimiter::builder()
        .redis(redis.url())
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("key_secret") && error.contains("by = header("),
        "{error}"
    );
    let public = RateLimiter::builder()
        .redis(redis.url())
        .public_key_secret(true)
        .build()
        .await
        .unwrap();
    let ours = RateLimiter::builder()
        .redis(redis.url())
        .key_secret("ours")
        .build()
        .await
        .unwrap();
    let memory = RateLimiter::builder().build().await.unwrap();
    let options = HttpOptions::new();
    let subject = |limiter: &RateLimiter| {
        options
            .subject_of_header(limiter, "x-api-key", "k1")
            .unwrap()
    };
    assert_ne!(subject(&public), subject(&ours));
    assert_ne!(subject(&memory), subject(&public), "not the public secret");
    assert_eq!(
        subject(&memory),
        subject(&RateLimiter::in_memory()),
        "one random secret per process"
    );
    for limiter in [&public, &ours, &memory] {
        let shown = format!("{limiter:?}");
        assert!(
            !shown.contains("ours") && !shown.contains("digest v1"),
            "{shown}"
        );
    }
}
