// Every place the attribute goes, and every option, compiles.
#![allow(dead_code)]
use std::fmt::Display;
use std::time::Duration;

use actix_web::{get, post, route, web, HttpRequest, HttpResponse, Responder};
use ratelimit_runtime::{rate_limit, RateLimited, Rule};

const SEARCH: Rule = Rule::gcra(100, Duration::from_secs(60)).with_burst(20);

/// Free, public, with every option at once.
#[rate_limit(
    key = "all:{user}",
    prefix = "app:",
    count = 10,
    period = "10s",
    by = arg(page),
    algorithm = token_bucket,
    burst = 15,
    cost = 2,
    on_error = deny,
    limiter = "edge",
    shadow
)]
pub async fn every_option(user: &str, page: u32) -> Result<String, RateLimited> {
    Ok(format!("{user} {page}"))
}

#[rate_limit(key = "search", rule = SEARCH, cost = 3)]
async fn const_rule(q: &str) -> Result<usize, RateLimited> {
    Ok(q.len())
}

/// Served from local quotas on Redis: inline, and on a `const Rule`.
#[rate_limit(key = "hot", count = 100_000, algorithm = gcra, burst = 1_000, local_quota = 500)]
async fn hot() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "hot:search", rule = SEARCH, local_quota = 10)]
async fn hot_const() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "g:{value}", count = 5)]
async fn generic<T: Display + Send>(value: T) -> Result<String, RateLimited> {
    Ok(value.to_string())
}

#[rate_limit(key = "w:{value}", count = 5, algorithm = sliding_log)]
async fn with_where<'a, T>(value: &'a T) -> Result<&'a T, RateLimited>
where
    T: Display + Sync,
{
    Ok(value)
}

#[rate_limit(key = "jobs", count = 2, period = 30, algorithm = concurrency)]
#[rate_limit(key = "jobs-rate", count = 100, period = "1m", algorithm = sliding_window)]
#[must_use]
async fn stacked() -> Result<(), RateLimited> {
    Ok(())
}

struct Account {
    id: u64,
    calls: u32,
}

impl Account {
    #[rate_limit(key = "account:{self.id}", count = 3, fallback = Self::busy)]
    async fn read(&self, what: &str) -> String {
        format!("{} {what}", self.id)
    }

    async fn busy(&self, what: &str, limited: RateLimited) -> String {
        format!("{} {what} later: {limited}", self.id)
    }

    #[rate_limit(key = "account-write:{self.id}", count = 1, period = "500ms")]
    async fn write(&mut self) -> Result<u32, RateLimited> {
        self.calls += 1;
        Ok(self.calls)
    }
}

trait Store {
    async fn load(&self, id: u32) -> Result<u32, RateLimited>;
}

impl Store for Account {
    #[rate_limit(key = "load:{id}", count = 3, algorithm = gcra)]
    async fn load(&self, id: u32) -> Result<u32, RateLimited> {
        Ok(id)
    }
}

// actix: the recommended order (rate_limit above the route), by IP with the
// request added by the macro.
#[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
#[get("/limitTest3")]
async fn above_route() -> impl Responder {
    "3"
}

// The other order, with the request the handler already has.
#[get("/below")]
#[rate_limit(key = "below", count = 3, by = ip)]
async fn below_route(req: HttpRequest) -> impl Responder {
    format!("{:?}", req.peer_addr())
}

#[post("/header")]
#[rate_limit(key = "api", count = 1000, period = "1h", by = header("X-Api-Key"))]
async fn by_header(body: web::Bytes) -> HttpResponse {
    HttpResponse::Ok().body(body)
}

#[route("/result", method = "GET", method = "POST")]
#[rate_limit(key = "result", count = 2)]
async fn result_handler() -> Result<String, actix_web::Error> {
    Ok("ok".into())
}

#[rate_limit(key = "demote", count = 2, fallback = try_later)]
#[get("/demote")]
async fn with_fallback(path: web::Path<String>) -> impl Responder {
    path.into_inner()
}

async fn try_later(path: web::Path<String>, limited: RateLimited) -> impl Responder {
    HttpResponse::TooManyRequests().body(format!("{} later: {limited}", path.into_inner()))
}

fn main() {
    let _ = actix_web::App::new()
        .service(above_route)
        .service(below_route)
        .service(by_header)
        .service(result_handler)
        .service(with_fallback);
}

/// A struct pattern with shorthand fields, one of them in the key, and a
/// fallback (which takes the arguments again).
mod shorthand_fields {
    use ratelimit_runtime::{RateLimited, rate_limit};

    pub struct Login {
        pub user: String,
        pub password: String,
    }

    #[rate_limit(key = "login:{user}", count = 5, fallback = later)]
    pub async fn login(Login { user, password }: Login) -> String {
        format!("{user}{password}")
    }

    async fn later(_: Login, _: RateLimited) -> String {
        String::new()
    }
}
