//! Installed options that digest client addresses need the key secret of a
//! shared store, as the app's own do: a layer or middleware set up without
//! options of its own says so when it starts (tower: an error line;
//! actix-web: the server does not start), and its requests are refused
//! with 500, never counted under a secret of the process. Against a real
//! redis-server, over real TCP.
//!
//! One test: the limiter and the options are the process's.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::Logs;
use ratelimit_runtime::{HttpOptions, RateLimit, RateLimitLayer, RateLimiter, Rule};
use ratelimit_test_support::{RedisServer, http};

const TWO: Rule = Rule::fixed_window(2, Duration::from_secs(60));
const ONE: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[actix_web::test]
async fn installed_options_that_digest_addresses_need_the_key_secret() {
    let redis = RedisServer::start();
    RateLimiter::builder()
        .redis(redis.url())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
        .install()
        .unwrap();
    HttpOptions::new()
        .digest_client_ips(true)
        .install()
        .unwrap();

    // tower: the layer logs the error when it is set up ...
    let logs = Logs::default();
    let subscriber = logs.subscriber(tracing_subscriber::filter::LevelFilter::INFO);
    let app = tracing::subscriber::with_default(subscriber, || {
        axum::Router::new()
            .route("/ip", axum::routing::get(|| async { "ok" }))
            .layer(RateLimitLayer::new(TWO).name("installed_digest").by_ip())
    });
    let logged = logs.text();
    assert!(
        logged.contains("ERROR")
            && logged.contains("installed_digest")
            && logged.contains("key_secret"),
        "{logged}"
    );
    // ... and refuses its requests, counting nothing.
    let addr = common::serve_axum(app).await;
    for _ in 0..3 {
        let reply = http(ONE, addr, "GET", "/ip", &[]).await.unwrap();
        assert_eq!(reply.status, 500, "{reply:?}");
    }
    assert!(redis.keys_with_pttl("limiter:installed_digest*").is_empty());

    // actix-web: the middleware's server does not start.
    let server = actix_web::HttpServer::new(|| {
        actix_web::App::new().service(
            actix_web::web::resource("/ip")
                .wrap(RateLimit::new(TWO).name("installed_digest_mw").by_ip())
                .route(actix_web::web::get().to(|| async { "ok" })),
        )
    })
    .workers(1)
    .bind((Ipv4Addr::LOCALHOST, 0))
    .unwrap();
    let running = actix_web::rt::spawn(server.run());
    let ended = tokio::time::timeout(Duration::from_secs(10), running).await;
    assert!(
        matches!(ended, Ok(Ok(Err(_)))),
        "a server whose middleware cannot key its requests must not start: {ended:?}"
    );
}
