//! Counters per rule and outcome, served for Prometheus at `/metrics`.
//!
//! `cargo run --example metrics`, then:
//!
//! ```text
//! for i in 1 2 3 4; do curl -s http://127.0.0.1:8082/search >/dev/null; done
//! curl -s http://127.0.0.1:8082/metrics
//! # ratelimit_calls_total{rule="search",outcome="allowed"} 3
//! # ratelimit_calls_total{rule="search",outcome="limited"} 1
//! ```
//!
//! Any `metrics` recorder works the same (the runtime's `metrics` feature).
//! Outcomes: `allowed`, `limited`, `shadow_limited`, `backend_error`,
//! `local_fallback`.

mod support;

use actix_web::{App, HttpServer, Responder, get, web};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use ratelimit_runtime::rate_limit;

#[rate_limit(key = "search", count = 3, period = 10, by = ip)]
#[get("/search")]
async fn search() -> impl Responder {
    "results\n"
}

#[rate_limit(key = "search_v2", count = 1, period = 10, by = ip, shadow)]
#[get("/search_v2")]
async fn search_v2() -> impl Responder {
    "new results (the new, tighter limit only records for now)\n"
}

async fn metrics(handle: web::Data<PrometheusHandle>) -> String {
    handle.render()
}

#[actix_web::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(std::io::Error::other)?;
    // Overrides from RATELIMIT_OVERRIDES (e.g. "search.count=10"), checked now.
    ratelimit_runtime::overrides::load_env().map_err(std::io::Error::other)?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8082".into());
    println!("listening on http://{bind}: /search, /search_v2 (shadow), /metrics");
    HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(handle.clone()))
            .service(search)
            .service(search_v2)
            .route("/metrics", web::get().to(metrics))
    })
    .bind(bind)?
    .run()
    .await?;
    Ok(())
}
