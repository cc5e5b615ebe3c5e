//! `HttpOptions::install`: options installed for the process serve every
//! handler, middleware and layer without options of their own, and the
//! refusals handlers return, over real TCP, in axum and actix-web; an app's
//! own options still win; a second install is refused and changes nothing.
//!
//! One test: the options are the process's, and `cargo test` runs a file's
//! tests in one process.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use common::{serve_actix, serve_axum};
use ratelimit_runtime::{
    Error, HeaderStyle, HttpOptions, RateLimit, RateLimitLayer, RateLimiter, Rule, rate_limit,
};
use ratelimit_test_support::{HttpReply, http};

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[rate_limit(key = "installed_axum", period = 60, count = 2, by = ip)]
async fn axum_handler() -> impl IntoResponse {
    "ok"
}

#[rate_limit(key = "installed_actix", period = 60, count = 2, by = ip)]
async fn actix_handler() -> &'static str {
    "ok"
}

async fn plain() -> &'static str {
    "ok"
}

/// Refused through `Reject for HttpResponse` (actix-web's error response).
#[rate_limit(key = "installed_actix_response", period = 60, count = 2)]
async fn actix_response() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().body("ok")
}

/// Refused through `IntoResponse for RateLimited`.
#[rate_limit(key = "installed_axum_result", period = 60, count = 2)]
async fn axum_result() -> Result<&'static str, ratelimit_runtime::RateLimited> {
    Ok("ok")
}

/// A GET from the loopback peer, through a proxy that says the client is
/// `client`.
async fn via_proxy(addr: SocketAddr, path: &str, client: &str) -> HttpReply {
    http(PEER, addr, "GET", path, &[("x-forwarded-for", client)])
        .await
        .expect("an HTTP reply")
}

/// Three requests of `client` answer 200, 200, 429, and a fourth from
/// another client 200: the peer is a trusted proxy, so the forwarded client
/// counts. With the defaults (no trusted proxy) every request would count
/// against the one peer. Each answer carries the legacy fields, not the
/// default draft ones.
async fn answers_as_installed(addr: SocketAddr, path: &str, client: &str, other: &str) {
    for expected in [200, 200, 429] {
        let reply = via_proxy(addr, path, client).await;
        assert_eq!(reply.status, expected, "{path} from {client}");
        assert_eq!(reply.header("x-ratelimit-limit"), Some("2"), "{path}");
        assert_eq!(reply.header("ratelimit-policy"), None, "{path}");
    }
    let reply = via_proxy(addr, path, other).await;
    assert_eq!(
        reply.status, 200,
        "{path}: another client has its own budget"
    );
}

/// An app's own default options win over the installed ones: the peer
/// counts (it is no trusted proxy there), and the draft fields are sent.
async fn answers_as_defaults(addr: SocketAddr, path: &str) {
    for expected in [200, 200, 429] {
        let reply = via_proxy(addr, path, "198.51.100.3").await;
        assert_eq!(reply.status, expected, "{path}");
        assert!(reply.header("ratelimit-policy").is_some(), "{path}");
    }
    let reply = via_proxy(addr, path, "198.51.100.4").await;
    assert_eq!(reply.status, 429, "{path}: the loopback peer counts");
}

/// A `by = global` handler whose refusal is built from the `RateLimited`
/// alone: its third call is refused with the installed (legacy) fields.
async fn refused_as_installed(addr: SocketAddr, path: &str) {
    for expected in [200, 200, 429] {
        let reply = via_proxy(addr, path, "198.51.100.9").await;
        assert_eq!(reply.status, expected, "{path}");
        if expected == 429 {
            assert_eq!(reply.header("x-ratelimit-limit"), Some("2"), "{path}");
            assert_eq!(reply.header("ratelimit-policy"), None, "{path}");
        }
    }
}

#[actix_web::test]
async fn installed_options_serve_every_adapter_without_options_of_its_own() {
    RateLimiter::in_memory().install().unwrap();
    HttpOptions::new()
        .trust_proxies(["127.0.0.1"])
        .unwrap()
        .headers(HeaderStyle::Legacy)
        .install()
        .unwrap();

    // axum: the attribute with no extension at all, and the layer.
    let app = Router::new()
        .route("/attribute", get(axum_handler))
        .route(
            "/layer",
            get(plain).layer(
                RateLimitLayer::new(Rule::fixed_window(2, Duration::from_secs(60)))
                    .name("installed_layer")
                    .by_ip(),
            ),
        )
        .route(
            "/own",
            get(plain).layer(
                RateLimitLayer::new(Rule::fixed_window(2, Duration::from_secs(60)))
                    .name("installed_own")
                    .by_ip()
                    .options(HttpOptions::new()),
            ),
        );
    let own = Router::new()
        .route("/attribute", get(axum_handler))
        .layer(axum::Extension(HttpOptions::new()));
    let app = app
        .route("/result", get(axum_result))
        .nest("/own-extension", own);
    let addr = serve_axum(app).await;
    answers_as_installed(addr, "/attribute", "198.51.100.1", "198.51.100.2").await;
    answers_as_installed(addr, "/layer", "198.51.100.1", "198.51.100.2").await;
    refused_as_installed(addr, "/result").await;
    answers_as_defaults(addr, "/own-extension/attribute").await;

    answers_as_defaults(addr, "/own").await;

    // actix-web: the attribute and the middleware, no app data.
    let addr = serve_actix!(|| {
        actix_web::App::new()
            .route("/attribute", actix_web::web::get().to(actix_handler))
            .route("/response", actix_web::web::get().to(actix_response))
            .service(
                actix_web::web::resource("/middleware")
                    .wrap(
                        RateLimit::new(Rule::fixed_window(2, Duration::from_secs(60)))
                            .name("installed_mw")
                            .by_ip(),
                    )
                    .route(actix_web::web::get().to(plain)),
            )
    });
    answers_as_installed(addr, "/attribute", "198.51.100.5", "198.51.100.6").await;
    answers_as_installed(addr, "/middleware", "198.51.100.5", "198.51.100.6").await;
    refused_as_installed(addr, "/response").await;
    let own = serve_actix!(|| {
        actix_web::App::new()
            .app_data(HttpOptions::new())
            .route("/attribute", actix_web::web::get().to(actix_handler))
    });
    answers_as_defaults(own, "/attribute").await;

    // A second install is refused and leaves the first in force.
    let again = HttpOptions::new().install().unwrap_err();
    assert!(matches!(again, Error::AlreadyInstalled), "{again:?}");
    assert!(again.to_string().contains("install at start-up"), "{again}");
    answers_as_installed(addr, "/attribute", "198.51.100.7", "198.51.100.8").await;
}
