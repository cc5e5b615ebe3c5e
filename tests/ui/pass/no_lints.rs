// Code a user writes as usual, one-line bodies included, builds with every
// warning denied: the expansion fires no lint in the user's code.
#![deny(warnings)]
use std::fmt::Display;

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "one_line", count = 3)]
async fn one_line(x: u32) -> Result<u32, RateLimited> { Ok(x) }

#[rate_limit(key = "block_tail", count = 3)]
async fn block_tail(x: u32) -> Result<u32, RateLimited> {
    Ok(x + 1)
}

#[rate_limit(key = "early_return:{x}", count = 3)]
async fn early_return(x: u32) -> Result<u32, RateLimited> {
    if x > 10 {
        return Ok(10);
    }
    Ok(x)
}

#[rate_limit(key = "unit_fallback", count = 3, fallback = unit_later)]
async fn unit_body() {}

async fn unit_later(_limited: RateLimited) {}

#[rate_limit(key = "generic:{value}", count = 3, fallback = generic_later)]
async fn generic<T: Display + Send>(value: T) -> String { value.to_string() }

async fn generic_later<T: Display + Send>(value: T, limited: RateLimited) -> String {
    format!("{value}: {limited}")
}

#[rate_limit(key = "concurrency", count = 2, algorithm = concurrency)]
async fn concurrency() -> Result<(), RateLimited> { Ok(()) }

#[rate_limit(key = "stacked_a", count = 3)]
#[rate_limit(key = "stacked_b", count = 30, period = "1m")]
async fn stacked() -> Result<(), RateLimited> { Ok(()) }

struct Account {
    id: u64,
}

impl Account {
    #[rate_limit(key = "read:{self.id}", count = 3, fallback = Self::busy)]
    async fn read(&self, what: &str) -> String { format!("{} {what}", self.id) }

    async fn busy(&self, what: &str, limited: RateLimited) -> String {
        format!("{} {what} later: {limited}", self.id)
    }
}

#[derive(Clone)]
struct App {
    name: &'static str,
}

#[rate_limit(key = "axum_one_line", count = 3, by = ip)]
async fn axum_one_line() -> impl IntoResponse { "ok" }

#[rate_limit(key = "axum_item:{id}", count = 3, fallback = axum_busy)]
async fn axum_item(State(app): State<App>, Path(id): Path<u32>) -> impl IntoResponse { format!("{} {id}", app.name) }

async fn axum_busy(State(app): State<App>, Path(id): Path<u32>, limited: RateLimited) -> impl IntoResponse {
    format!("{} {id} later: {limited}", app.name)
}

fn main() {
    let _ = one_line(1);
    let _ = block_tail(1);
    let _ = early_return(1);
    let _ = unit_body();
    let _ = generic(1);
    let _ = concurrency();
    let _ = stacked();
    let _ = Account { id: 1 }.read("x");
    let _: axum::Router = axum::Router::new()
        .route("/", axum::routing::get(axum_one_line))
        .route("/item/{id}", axum::routing::get(axum_item))
        .with_state(App { name: "app" });
}
