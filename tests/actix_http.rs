//! actix-web end to end, over real TCP: client identity (trusted proxies,
//! spoofing), responses (429/503/400, Retry-After, the draft's structured
//! rate-limit fields, X-RateLimit-*, JSON), the limiter from app data (two
//! servers sharing one redis-server), and the `RateLimit` middleware.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use actix_web::{App, HttpResponse, Responder, get, web};
use common::{params, sf_list};
use ratelimit_runtime::{
    ClientHeader, HeaderStyle, HttpOptions, OnError, RateLimit, RateLimiter, Rule, UnknownClient,
    rate_limit,
};
use ratelimit_test_support::{HttpReply, RedisServer, http};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const TWO: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

#[rate_limit(key = "limitTest3", period = 10, count = 3, by = ip)]
#[get("/limitTest3")]
async fn limit_test3() -> impl Responder {
    "3"
}

#[rate_limit(key = "limitTest", period = 1, count = 2)]
#[get("/limitTest")]
async fn limit_test() -> impl Responder {
    "1"
}

/// Starts a server on 127.0.0.1 with `limiter` in its app data.
fn serve(limiter: RateLimiter) -> SocketAddr {
    serve_with(limiter, HttpOptions::new())
}

/// [`serve`] with these HTTP options as the app's data.
fn serve_with(limiter: RateLimiter, options: HttpOptions) -> SocketAddr {
    common::serve_actix!(move || {
        App::new()
            .app_data(limiter.clone())
            .app_data(options.clone())
            .service(limit_test3)
            .service(limit_test)
    })
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

#[actix_web::test]
async fn two_servers_on_one_redis_share_a_budget_per_client_address() {
    let redis = RedisServer::start();
    let limiter = || async {
        RateLimiter::builder()
            .redis(redis.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (serve(limiter().await), serve(limiter().await));
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
    redis.assert_all_keys_expire("limiter:*");
    assert!(
        redis
            .keys_with_pttl("limiter:limitTest3:ip:127.0.0.1")
            .len()
            == 1,
        "{:?}",
        redis.keys_with_pttl("*")
    );
}

#[actix_web::test]
async fn every_limited_response_carries_the_draft_fields() {
    let addr = serve(RateLimiter::in_memory());
    let first = get_from(ONE, addr, "/limitTest3", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        sf_list(first.header("ratelimit-policy").unwrap()),
        [("limitTest3".to_owned(), params(&[("q", 3), ("w", 10)]))]
    );
    assert_eq!(
        sf_list(first.header("ratelimit").unwrap()),
        [("limitTest3".to_owned(), params(&[("r", 2), ("t", 10)]))]
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
    assert!((1..=10).contains(&state[0].1["t"]));
    assert!(refused.body.starts_with("Too Many Requests"), "{refused:?}");
}

#[actix_web::test]
async fn a_spoofed_forwarding_header_gets_no_new_budget() {
    let addr = serve(RateLimiter::in_memory());
    for n in 0..5 {
        // A client inventing a new address for every request.
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

#[actix_web::test]
async fn behind_a_trusted_proxy_the_forwarded_client_counts() {
    let addr = serve_with(RateLimiter::in_memory(), behind_local_proxy());
    let via_proxy = |client: &'static str| async move {
        get_from(ONE, addr, "/limitTest3", &[("x-forwarded-for", client)])
            .await
            .status
    };
    for _ in 0..3 {
        assert_eq!(via_proxy("198.51.100.7").await, 200);
    }
    assert_eq!(via_proxy("198.51.100.7").await, 429);
    assert_eq!(
        via_proxy("198.51.100.8").await,
        200,
        "another client behind the proxy"
    );
    // The client prepends a fake hop: the right-most untrusted one still wins.
    assert_eq!(via_proxy("9.9.9.9, 198.51.100.7").await, 429);
    // A peer that is not a trusted proxy cannot use the header at all.
    for _ in 0..3 {
        assert_eq!(
            get_from(
                TWO,
                addr,
                "/limitTest3",
                &[("x-forwarded-for", "198.51.100.9")]
            )
            .await
            .status,
            200
        );
    }
    assert_eq!(
        get_from(
            TWO,
            addr,
            "/limitTest3",
            &[("x-forwarded-for", "198.51.100.10")]
        )
        .await
        .status,
        429
    );
}

#[actix_web::test]
async fn a_client_cannot_pick_its_address_with_a_header_its_proxy_does_not_write() {
    // The proxy at 127.0.0.1 appends the client it saw to X-Forwarded-For
    // and passes other headers on as the client sent them.
    let via_proxy = |addr, forwarded: Option<String>| async move {
        let mut headers = vec![("x-forwarded-for", "198.51.100.7")];
        if let Some(forwarded) = &forwarded {
            headers.push(("forwarded", forwarded));
        }
        get_from(ONE, addr, "/limitTest3", &headers).await.status
    };
    // Any header: headers naming different clients make the client unknown
    // (400); X-Forwarded-For only: the other header is ignored (429, the same
    // exhausted client).
    for (header, spoofed) in [(ClientHeader::Any, 400), (ClientHeader::XForwardedFor, 429)] {
        let options = HttpOptions::new()
            .client_header(header)
            .trust_proxies(["127.0.0.1"])
            .unwrap();
        let addr = serve_with(RateLimiter::in_memory(), options);
        for _ in 0..3 {
            assert_eq!(via_proxy(addr, None).await, 200);
        }
        assert_eq!(via_proxy(addr, None).await, 429);
        for n in 0..3 {
            // A new address each time, in a header the proxy does not write.
            let forwarded = Some(format!("for=203.0.113.{n}"));
            assert_eq!(via_proxy(addr, forwarded).await, spoofed, "{header:?}");
        }
        // The same client named in both: it is that client.
        let both = Some("for=198.51.100.7".to_owned());
        assert_eq!(via_proxy(addr, both).await, 429, "{header:?}");
    }
}

#[actix_web::test]
async fn legacy_headers_and_json_bodies_on_request() {
    let options = HttpOptions::new()
        .headers(HeaderStyle::Legacy)
        .json_body(true);
    let addr = serve_with(RateLimiter::in_memory(), options);
    let first = get_from(ONE, addr, "/limitTest", &[]).await;
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("1"));
    assert!(first.header("ratelimit").is_none());
    get_from(ONE, addr, "/limitTest", &[]).await;
    let refused = get_from(ONE, addr, "/limitTest", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert!(
        refused
            .body
            .starts_with(r#"{"error":"too_many_requests","retry_after":1,"#),
        "{}",
        refused.body
    );
}

#[actix_web::test]
async fn a_broken_limiter_under_deny_answers_503() {
    let mut redis = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(redis.url())
        .timeout(Duration::from_millis(200))
        .on_backend_error(OnError::Deny)
        .build()
        .await
        .unwrap();
    let addr = serve(limiter);
    assert_eq!(get_from(ONE, addr, "/limitTest", &[]).await.status, 200);
    redis.kill();
    let reply = get_from(ONE, addr, "/limitTest", &[]).await;
    assert_eq!(
        reply.status, 503,
        "limiter broken is not too many requests: {reply:?}"
    );
    assert!(reply.header("retry-after").is_some());
}

#[actix_web::test]
async fn a_request_without_a_client_address_is_refused_unless_shared() {
    use actix_web::test;

    let app = test::init_service(
        App::new()
            .app_data(RateLimiter::in_memory())
            .service(limit_test3),
    )
    .await;
    // A test request has no peer address.
    let reply = test::call_service(
        &app,
        test::TestRequest::get().uri("/limitTest3").to_request(),
    )
    .await;
    assert_eq!(reply.status(), 400);

    let shared = HttpOptions::new().unknown_client(UnknownClient::Shared);
    let app = test::init_service(
        App::new()
            .app_data(RateLimiter::in_memory())
            .app_data(shared)
            .service(limit_test3),
    )
    .await;
    for expected in [200, 200, 200, 429] {
        let reply = test::call_service(
            &app,
            test::TestRequest::get().uri("/limitTest3").to_request(),
        )
        .await;
        assert_eq!(reply.status(), expected);
    }
}

const API: Rule = Rule::fixed_window(2, Duration::from_secs(10));

/// A server with the middleware on three scopes, each with allow-lists: a
/// path (by segments), IPv4 and IPv6 clients, two API keys (one too long to
/// be kept in the key as it is), a closure key holding a colon.
fn serve_with_middleware(options: HttpOptions) -> SocketAddr {
    let long_key: &'static str = Box::leak("k".repeat(100).into_boxed_str());
    let limiter = RateLimiter::in_memory();
    common::serve_actix!(move || {
        App::new()
            .app_data(limiter.clone())
            .app_data(options.clone())
            .service(
                web::scope("/ip")
                    .wrap(
                        RateLimit::new(API)
                            .name("mw-ip")
                            .by_ip()
                            .exempt_path("/ip/health")
                            .exempt_key("198.51.100.1")
                            .exempt_key("2001:db8::1"),
                    )
                    .route("/health", web::get().to(|| async { "healthy" }))
                    .route("/health/db", web::get().to(|| async { "healthy" }))
                    .route("/healthz", web::get().to(|| async { "work" }))
                    .route("/work", web::get().to(|| async { "work" })),
            )
            .service(
                web::scope("/key")
                    .wrap(
                        RateLimit::new(API)
                            .name("mw-key")
                            .by_header("x-api-key")
                            .exempt_key("admin")
                            .exempt_key(long_key),
                    )
                    .route(
                        "",
                        web::get().to(|| async { HttpResponse::Ok().body("key") }),
                    ),
            )
            .service(
                web::scope("/custom")
                    .wrap(
                        RateLimit::new(API)
                            .name("mw-custom")
                            .by_key(|req| {
                                req.query_string().strip_prefix("user=").map(str::to_owned)
                            })
                            .exempt_key("team:ops"),
                    )
                    .route("", web::get().to(|| async { "custom" })),
            )
    })
}

/// A limiter that takes 127.0.0.1 for a proxy (so `X-Forwarded-For` names
/// the client of a request from it).
fn behind_local_proxy() -> HttpOptions {
    HttpOptions::new().trust_proxies(["127.0.0.1"]).unwrap()
}

#[actix_web::test]
async fn middleware_limits_scopes_by_ip_header_or_closure_with_allow_lists() {
    let addr = serve_with_middleware(behind_local_proxy());
    let statuses = |path: &'static str,
                    from: IpAddr,
                    headers: &'static [(&'static str, &'static str)],
                    n: usize| async move {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(get_from(from, addr, path, headers).await.status);
        }
        out
    };
    assert_eq!(statuses("/ip/work", ONE, &[], 3).await, [200, 200, 429]);
    assert_eq!(statuses("/ip/work", TWO, &[], 1).await, [200]);
    assert_eq!(
        statuses("/ip/health", ONE, &[], 4).await,
        [200; 4],
        "exempt path"
    );
    let first = get_from(TWO, addr, "/ip/work", &[]).await;
    assert_eq!(
        sf_list(first.header("ratelimit-policy").unwrap()),
        [("mw-ip".to_owned(), params(&[("q", 2), ("w", 10)]))]
    );
    let refused = get_from(ONE, addr, "/ip/work", &[]).await;
    assert!(refused.header("retry-after").is_some() && refused.header("ratelimit").is_some());

    assert_eq!(
        statuses("/key", ONE, &[("x-api-key", "k1")], 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses("/key", ONE, &[("x-api-key", "k2")], 1).await,
        [200]
    );
    assert_eq!(
        statuses("/key", ONE, &[("x-api-key", "admin")], 4).await,
        [200; 4],
        "allow-listed key"
    );

    assert_eq!(
        statuses("/custom?user=ann", ONE, &[], 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses("/custom", ONE, &[], 4).await,
        [200; 4],
        "no key: not limited"
    );
}

/// Allow-lists compare the subject as the request has it: an IPv6 client's
/// address (its budget is kept per /64), an API key too long to be kept in
/// the key as it is, a closure key with a colon. Exempt paths go by whole
/// segments. Everything next to them is limited as before.
#[actix_web::test]
async fn middleware_allow_lists_match_whole_subjects_and_path_segments() {
    let addr = serve_with_middleware(behind_local_proxy());
    let statuses = |path: String, headers: Vec<(&'static str, String)>, n: usize| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(get_from(ONE, addr, &path, &headers).await.status);
        }
        out
    };
    let from = |client: &str| vec![("x-forwarded-for", client.to_owned())];
    let path = |p: &str| p.to_owned();

    for exempt in ["198.51.100.1", "2001:db8::1"] {
        assert_eq!(
            statuses(path("/ip/work"), from(exempt), 4).await,
            [200; 4],
            "{exempt}"
        );
    }
    // The allow-listed address's /64 neighbour shares nothing with it.
    assert_eq!(
        statuses(path("/ip/work"), from("2001:db8::2"), 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(path("/ip/healthz"), from("198.51.100.2"), 3).await,
        [200, 200, 429],
        "/ip/health does not exempt /ip/healthz"
    );
    assert_eq!(
        statuses(path("/ip/health/db"), from("198.51.100.2"), 2).await,
        [200, 200],
        "below an exempt path"
    );
    assert_eq!(
        statuses(path("/ip/health"), from("198.51.100.2"), 2).await,
        [200, 200]
    );

    let long = "k".repeat(100);
    assert_eq!(
        statuses(path("/key"), vec![("x-api-key", long.clone())], 4).await,
        [200; 4],
        "a long allow-listed key"
    );
    assert_eq!(
        statuses(path("/key"), vec![("x-api-key", format!("{long}x"))], 3).await,
        [200, 200, 429]
    );

    assert_eq!(
        statuses(path("/custom?user=team:ops"), vec![], 4).await,
        [200; 4]
    );
    assert_eq!(
        statuses(path("/custom?user=ops"), vec![], 3).await,
        [200, 200, 429]
    );
}

/// Responses the middleware is told not to count (5xx here) give their
/// units back, also when an inner middleware fails with an error (its
/// status decides).
#[actix_web::test]
async fn the_middleware_gives_back_the_units_of_server_errors() {
    use actix_web::middleware::{Next, from_fn};

    async fn failing(
        _: actix_web::dev::ServiceRequest,
        _: Next<impl actix_web::body::MessageBody>,
    ) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error>
    {
        Err::<actix_web::dev::ServiceResponse<String>, _>(
            actix_web::error::ErrorServiceUnavailable("session store down"),
        )
    }

    let addr = common::serve_actix!(|| {
        App::new()
            .app_data(RateLimiter::in_memory())
            .wrap(
                RateLimit::new(Rule::fixed_window(2, Duration::from_secs(60)))
                    .name("actix_refund_5xx")
                    .by_ip()
                    .refund_if(|status| status >= 500),
            )
            .route("/fails", web::get().to(HttpResponse::BadGateway))
            .service(
                web::resource("/errs")
                    .wrap(from_fn(failing))
                    .route(web::get().to(|| async { "never" })),
            )
            .route("/works", web::get().to(|| async { "ok" }))
    });
    for _ in 0..5 {
        assert_eq!(get_from(ONE, addr, "/fails", &[]).await.status, 502);
        assert_eq!(get_from(ONE, addr, "/errs", &[]).await.status, 503);
    }
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get_from(ONE, addr, "/works", &[]).await.status);
    }
    assert_eq!(statuses, [200, 200, 429], "the failures cost nothing");
}

/// The middleware picks a tier per request too.
#[actix_web::test]
async fn the_middleware_picks_a_tier_per_request() {
    use ratelimit_runtime::http::Tiers;

    let plans = Tiers::new().tier("actix_pro", Rule::fixed_window(3, Duration::from_secs(10)));
    let middleware = RateLimit::new(Rule::fixed_window(1, Duration::from_secs(10)))
        .name("actix_tiered")
        .by_ip()
        .tiers(plans, |req| {
            let plan = req.headers().get("x-plan")?.to_str().ok()?;
            Some(format!("actix_{plan}"))
        });
    let addr = common::serve_actix!(move || {
        App::new()
            .app_data(RateLimiter::in_memory())
            .wrap(middleware.clone())
            .route("/t", web::get().to(|| async { "ok" }))
    });
    let mut pro = Vec::new();
    for _ in 0..4 {
        pro.push(get_from(ONE, addr, "/t", &[("x-plan", "pro")]).await.status);
    }
    assert_eq!(pro, [200, 200, 200, 429]);
    let mut plain = Vec::new();
    for _ in 0..2 {
        plain.push(get_from(TWO, addr, "/t", &[]).await.status);
    }
    assert_eq!(plain, [200, 429], "no plan: the middleware's own rule");
}

/// An app's own refusal with field names written as people write them
/// (`X-Reason`, `Content-Type`): sent lowercase by the attribute's handlers
/// and the middleware alike. (A name with a capital letter used to panic
/// on every refusal.)
#[actix_web::test]
async fn refusals_the_app_builds_with_names_in_any_case() {
    use ratelimit_runtime::http::{Refusal, StatusCode as Status};
    let options = HttpOptions::new()
        .on_refusal(
            |limited| Refusal {
                status: Status::TOO_MANY_REQUESTS,
                headers: vec![
                    ("Content-Type", "text/html".to_owned()),
                    ("X-Reason", format!("over {}", limited.limit)),
                ],
                body: "<p>slow down</p>".to_owned(),
            },
            true,
        )
        .unwrap();
    let addr = common::serve_actix!(move || {
        App::new()
            .app_data(RateLimiter::in_memory())
            .app_data(options.clone())
            .service(limit_test3)
            .service(
                web::scope("/mw")
                    .wrap(RateLimit::new(API).name("mw-custom-refusal"))
                    .route("", web::get().to(|| async { "mw" })),
            )
    });
    for path in ["/limitTest3", "/mw"] {
        let mut reply = get_from(TWO, addr, path, &[]).await;
        while reply.status == 200 {
            reply = get_from(TWO, addr, path, &[]).await;
        }
        assert_eq!(reply.status, 429, "{path}: {reply:?}");
        assert_eq!(reply.header("content-type"), Some("text/html"), "{path}");
        assert!(
            reply
                .header("x-reason")
                .is_some_and(|r| r.starts_with("over ")),
            "{path}: {reply:?}"
        );
        assert!(reply.header("retry-after").is_some(), "{path}");
        assert_eq!(reply.body, "<p>slow down</p>");
    }
}
