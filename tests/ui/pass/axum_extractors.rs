// axum handlers as axum's docs write them: destructured extractors, with a
// fallback that takes the same extractors, keys from names bound inside
// patterns, and every warning denied.
#![deny(warnings)]
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use ratelimit_runtime::{rate_limit, RateLimited};

#[derive(Clone)]
struct App {
    name: &'static str,
}

#[rate_limit(key = "item:{id}", count = 3, fallback = busy)]
async fn item(State(app): State<App>, Path(id): Path<u32>) -> impl IntoResponse {
    format!("{} {id}", app.name)
}

async fn busy(State(app): State<App>, Path(id): Path<u32>, limited: RateLimited) -> impl IntoResponse {
    (StatusCode::TOO_MANY_REQUESTS, format!("{} {id}: {limited}", app.name))
}

// Plain extractor types in the fallback, a tuple pattern, a `mut` binding,
// an unused `_` extractor, and a client's budget (`by = ip`).
#[rate_limit(key = "pair:{a}", count = 3, by = ip, fallback = pair_busy)]
async fn pair(_: State<App>, Path((a, mut b)): Path<(u32, u32)>) -> String {
    b += a;
    b.to_string()
}

async fn pair_busy(_app: State<App>, path: Path<(u32, u32)>, _limited: RateLimited) -> String {
    format!("{} later", path.0 .0)
}

fn main() {
    let _: Router = Router::new()
        .route("/item/{id}", get(item))
        .route("/pair/{a}/{b}", get(pair))
        .with_state(App { name: "app" });
}
