//! The in-memory server of `scripts/bench-http`: one endpoint, `GET /bench`,
//! answering `ok` from the same trivial handler, plain or limited per peer
//! IP in process memory by a limit it never reaches (a billion a second):
//!
//! - `plain`: the handler alone;
//! - `layer` (axum): behind our `RateLimitLayer`, `by_ip`;
//! - `middleware` (actix): behind our `RateLimit` middleware, `by_ip`;
//! - `attribute`: under `#[rate_limit(.., by = ip)]`, the limiter and the
//!   options the app's (app data in actix, request extensions in axum);
//! - `installed`: the same handler, the limiter and the options installed
//!   for the process (`RateLimiter::install`, `HttpOptions::install`), so
//!   the app adds nothing to its router;
//! - `peer`: behind tower_governor (axum) or actix-governor (actix), keyed by
//!   the peer's IP (their default), without their rate-limit headers (also
//!   their default).
//!
//! Our endpoints send the rate-limit header fields as `HEADERS` says
//! (`draft` or `none`); the peers add none by default, so `none` compares
//! like with like. Each configured the way its README shows: ours with the
//! limiter and options as app data (actix) or request extensions (axum's
//! attribute) or the layer's own (`.limiter`, `.options`), the peers with
//! their config builder.
//!
//! `bench-http-server FRAMEWORK ENDPOINT HEADERS` (`axum` or `actix`; the
//! endpoint; `draft` or `none`), listening on `BIND` (default
//! `127.0.0.1:8080`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::{HeaderStyle, HttpOptions, RateLimit, RateLimitLayer, RateLimiter, Rule};

/// Never reached: a billion requests a second per client.
const NEVER: Rule = Rule::fixed_window(1_000_000_000, Duration::from_secs(1));

/// The same quota for the peers: a cell every nanosecond, a burst of a
/// million.
const PEER_BURST: u32 = 1_000_000;

mod axum_side {
    use super::*;
    use axum::routing::get;
    use axum::{Extension, Router};
    use ratelimit_runtime::rate_limit;
    use tower_governor::GovernorLayer;
    use tower_governor::governor::GovernorConfigBuilder;

    async fn plain() -> &'static str {
        "ok\n"
    }

    #[rate_limit(key = "bench", period = 1, count = 1_000_000_000, by = ip)]
    async fn attribute() -> &'static str {
        "ok\n"
    }

    pub(super) fn router(endpoint: &str, options: HttpOptions) -> Option<Router> {
        let limiter = RateLimiter::in_memory();
        Some(match endpoint {
            "plain" => Router::new().route("/bench", get(plain)),
            "layer" => Router::new().route("/bench", get(plain)).layer(
                RateLimitLayer::new(NEVER)
                    .name("bench_layer")
                    .by_ip()
                    .limiter(limiter)
                    .options(options),
            ),
            "attribute" => Router::new()
                .route("/bench", get(attribute))
                .layer(Extension(limiter))
                .layer(Extension(options)),
            "installed" => {
                limiter.install().ok()?;
                options.install().ok()?;
                Router::new().route("/bench", get(attribute))
            }
            "peer" => {
                let config = GovernorConfigBuilder::default()
                    .per_nanosecond(1)
                    .burst_size(PEER_BURST)
                    .finish()?;
                Router::new()
                    .route("/bench", get(plain))
                    .layer(GovernorLayer::new(Arc::new(config)))
            }
            _ => return None,
        })
    }

    pub(super) async fn serve(bind: &str, router: Router) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(bind).await?;
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    }
}

mod actix_side {
    use super::*;
    use actix_governor::{Governor, GovernorConfigBuilder};
    use actix_web::{App, HttpServer, web};
    use ratelimit_runtime::rate_limit;

    async fn plain() -> &'static str {
        "ok\n"
    }

    #[rate_limit(key = "bench", period = 1, count = 1_000_000_000, by = ip)]
    async fn attribute() -> &'static str {
        "ok\n"
    }

    pub(super) async fn serve(
        bind: &str,
        endpoint: &str,
        options: HttpOptions,
    ) -> std::io::Result<()> {
        let limiter = RateLimiter::in_memory();
        let server = match endpoint {
            "plain" => HttpServer::new(|| App::new().route("/bench", web::get().to(plain)))
                .bind(bind)?
                .run(),
            "middleware" => {
                let middleware = RateLimit::new(NEVER).name("bench_mw").by_ip();
                HttpServer::new(move || {
                    App::new()
                        .app_data(limiter.clone())
                        .app_data(options.clone())
                        .wrap(middleware.clone())
                        .route("/bench", web::get().to(plain))
                })
                .bind(bind)?
                .run()
            }
            "attribute" => HttpServer::new(move || {
                App::new()
                    .app_data(limiter.clone())
                    .app_data(options.clone())
                    .route("/bench", web::get().to(attribute))
            })
            .bind(bind)?
            .run(),
            "installed" => {
                let taken = || std::io::Error::other("installed twice");
                limiter.install().map_err(|_| taken())?;
                options.install().map_err(|_| taken())?;
                HttpServer::new(|| App::new().route("/bench", web::get().to(attribute)))
                    .bind(bind)?
                    .run()
            }
            "peer" => {
                let config = GovernorConfigBuilder::default()
                    .nanoseconds_per_request(1)
                    .burst_size(PEER_BURST)
                    .finish()
                    .ok_or_else(|| std::io::Error::other("actix-governor's quota"))?;
                HttpServer::new(move || {
                    App::new()
                        .wrap(Governor::new(&config))
                        .route("/bench", web::get().to(plain))
                })
                .bind(bind)?
                .run()
            }
            _ => {
                return Err(std::io::Error::other(
                    "actix serves plain, middleware, attribute, installed or peer",
                ));
            }
        };
        server.await
    }
}

fn main() -> std::io::Result<()> {
    let usage = "usage: bench-http-server axum|actix ENDPOINT draft|none";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [framework, endpoint, headers] = args.as_slice() else {
        return Err(std::io::Error::other(usage));
    };
    let style = match headers.as_str() {
        "draft" => HeaderStyle::Draft,
        "none" => HeaderStyle::None,
        _ => return Err(std::io::Error::other(usage)),
    };
    let options = HttpOptions::new().headers(style);
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8080".into());
    match framework.as_str() {
        "axum" => {
            let router = axum_side::router(endpoint, options).ok_or_else(|| {
                std::io::Error::other("axum serves plain, layer, attribute, installed or peer")
            })?;
            tokio::runtime::Runtime::new()?.block_on(axum_side::serve(&bind, router))
        }
        "actix" => {
            actix_web::rt::System::new().block_on(actix_side::serve(&bind, endpoint, options))
        }
        _ => Err(std::io::Error::other(usage)),
    }
}
