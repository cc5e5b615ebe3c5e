//! The key secret of a shared store is a decision taken at start-up: with
//! Redis and no `key_secret`, a middleware keyed by a header, or client
//! addresses digested by the options, never falls back to a secret of the
//! process (each instance its own budgets in the shared Redis). The server
//! says so when it starts (actix-web: it does not start; tower: an error
//! line), and such requests are refused with 500, never counted apart.
//! Over real TCP, against a real redis-server.
//!
//! No `by = header(..)` attribute here: with one, `build` itself refuses a
//! Redis limiter without a key secret (tests/axum_http.rs).

mod common;

use common::Logs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use actix_web::{App, HttpServer, Responder, get, web};
use ratelimit_runtime::{HttpOptions, RateLimit, RateLimitLayer, RateLimiter, Rule, rate_limit};
use ratelimit_test_support::{HttpReply, RedisServer, http};

const ONE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const TWO: Rule = Rule::fixed_window(2, Duration::from_secs(60));

#[rate_limit(key = "per_address", period = 60, count = 2, by = ip)]
#[get("/ip")]
async fn per_address() -> impl Responder {
    "ok"
}

async fn limiter_on(url: &str, secret: Option<&str>) -> RateLimiter {
    let builder = RateLimiter::builder()
        .redis(url)
        .timeout(Duration::from_secs(2));
    match secret {
        Some(secret) => builder.key_secret(secret),
        None => builder,
    }
    .build()
    .await
    .unwrap()
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpReply {
    http(ONE, addr, "GET", path, headers)
        .await
        .expect("an HTTP reply")
}

/// An actix-web server with `limiter` and `options` as app data, the
/// `by_header("x-api-key")` middleware on `/api`, the `by = ip` handler on
/// `/ip`; `Err` when it does not start.
async fn actix(limiter: RateLimiter, options: HttpOptions) -> std::io::Result<SocketAddr> {
    let server = HttpServer::new(move || {
        App::new()
            .app_data(limiter.clone())
            .app_data(options.clone())
            .service(per_address)
            .service(
                web::scope("/api")
                    .wrap(RateLimit::new(TWO).name("api_key").by_header("x-api-key"))
                    .route("", web::get().to(|| async { "ok" })),
            )
    })
    .workers(1)
    .bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = server.addrs()[0];
    let running = server.run();
    let handle = running.handle();
    let task = actix_web::rt::spawn(running);
    // A server whose workers fail to start ends at once, with an error.
    match tokio::time::timeout(Duration::from_millis(1_500), async {
        while !task.is_finished() {
            if tokio::net::TcpStream::connect(addr).await.is_ok() && get_ok(addr).await {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(())
    })
    .await
    {
        Ok(None) => Ok(addr),
        _ => {
            handle.stop(false).await;
            Err(std::io::Error::other("the server did not start"))
        }
    }
}

/// Whether a request gets any reply (the workers are up).
async fn get_ok(addr: SocketAddr) -> bool {
    http(ONE, addr, "GET", "/nothing", &[]).await.is_ok()
}

fn refused_as_misconfigured(reply: &HttpReply) {
    assert_eq!(reply.status, 500, "{reply:?}");
    assert!(reply.body.contains("misconfigured"), "{reply:?}");
    assert!(reply.header("retry-after").is_none(), "{reply:?}");
}

/// One test, as the global limiter is installed halfway (each test binary
/// is its own process under nextest, not under `cargo test`).
#[actix_web::test]
async fn actix_without_a_key_secret_refuses_header_keys_and_will_not_start_on_the_global_one() {
    let redis = RedisServer::start();
    // Two instances on one Redis, no key secret: a header-keyed request is
    // refused on both, and nothing is counted in Redis under a secret of
    // either process.
    let a = actix(redis_limiter(&redis).await, HttpOptions::new())
        .await
        .unwrap();
    let b = actix(redis_limiter(&redis).await, HttpOptions::new())
        .await
        .unwrap();
    for addr in [a, b, a] {
        refused_as_misconfigured(&get(addr, "/api", &[("x-api-key", "k1")]).await);
    }
    assert!(redis.keys_with_pttl("limiter:api_key*").is_empty());
    // Keys that need no digest are still limited.
    for expected in [200, 200, 429] {
        assert_eq!(get(a, "/ip", &[]).await.status, expected);
    }

    // With a key secret, both instances share one budget per key.
    let a = actix(
        limiter_on(&redis.url(), Some("s3")).await,
        HttpOptions::new(),
    )
    .await
    .unwrap();
    let b = actix(
        limiter_on(&redis.url(), Some("s3")).await,
        HttpOptions::new(),
    )
    .await
    .unwrap();
    for (addr, expected) in [(a, 200), (b, 200), (a, 429), (b, 429)] {
        let reply = get(addr, "/api", &[("x-api-key", "k1")]).await;
        assert_eq!(reply.status, expected, "{reply:?}");
    }

    // The installed global one lacks it: the server does not start.
    redis_limiter(&redis).await.install().unwrap();
    let started = actix(
        limiter_on(&redis.url(), Some("s3")).await,
        HttpOptions::new(),
    )
    .await;
    assert!(started.is_err(), "a server that cannot key its requests");
}

async fn redis_limiter(redis: &RedisServer) -> RateLimiter {
    limiter_on(&redis.url(), None).await
}

#[actix_web::test]
async fn digested_client_addresses_need_the_key_secret_of_a_shared_store() {
    let redis = RedisServer::start();
    let digest = HttpOptions::new().digest_client_ips(true);
    let addr = actix(redis_limiter(&redis).await, digest.clone())
        .await
        .unwrap();
    for _ in 0..3 {
        refused_as_misconfigured(&get(addr, "/ip", &[]).await);
    }
    assert!(redis.keys_with_pttl("limiter:per_address*").is_empty());
    let limiter = redis_limiter(&redis).await;
    let error = digest.subject_of(&limiter, ONE).unwrap_err().to_string();
    assert!(error.contains("key_secret"), "{error}");
    assert!(
        HttpOptions::new()
            .subject_of_header(&limiter, "x-api-key", "k1")
            .is_err()
    );

    let addr = actix(limiter_on(&redis.url(), Some("s3")).await, digest)
        .await
        .unwrap();
    for expected in [200, 200, 429] {
        assert_eq!(get(addr, "/ip", &[]).await.status, expected);
    }
    let keys = redis.keys_with_pttl("limiter:per_address*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(!keys[0].0.contains("127.0.0.1"), "{keys:?}");
}

#[tokio::test]
async fn a_tower_layer_without_the_key_secret_it_needs_says_so_and_refuses() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(TWO)
        .name("tower_key")
        .by_header("x-api-key")
        .limiter(redis_limiter(&redis).await);
    let logs = Logs::default();
    let subscriber = logs.subscriber(tracing_subscriber::filter::LevelFilter::INFO);
    let app = tracing::subscriber::with_default(subscriber, || {
        axum::Router::new()
            .route("/api", axum::routing::get(|| async { "ok" }))
            .layer(layer)
    });
    let logged = logs.text();
    assert!(
        logged.contains("ERROR") && logged.contains("tower_key") && logged.contains("key_secret"),
        "{logged}"
    );
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    for _ in 0..3 {
        refused_as_misconfigured(&get(addr, "/api", &[("x-api-key", "k1")]).await);
    }
    assert!(redis.keys_with_pttl("limiter:tower_key*").is_empty());
}
