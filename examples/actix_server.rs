//! The seed article's example server, on actix-web.
//!
//! `cargo run --example actix_server`, then, for example:
//!
//! ```text
//! for i in 1 2 3 4; do curl -si http://127.0.0.1:8080/limitTest3 | head -1; done
//! curl -si --interface 127.0.0.2 http://127.0.0.1:8080/limitTest3 | head -1
//! ```
//!
//! Endpoints: `/limitTest` (2 per second), `/limitTest2` (3 per 10 s on the
//! key `customer_limit_test`), `/limitTest3` (3 per 10 s per client address),
//! `/limitTest4` (the same, with a fallback page), `/api` (5 per 10 s per
//! `x-api-key`), `/user/{name}` (3 per 10 s per name).
//!
//! - `BIND` (default `127.0.0.1:8080`): where to listen.
//! - `REDIS_URL` (for example `redis://127.0.0.1:6379/`): keep the budgets in
//!   Redis, shared by every instance; without it, in process memory.
//! - `RATELIMIT_KEY_SECRET`: the secret of the digests that stand for
//!   `x-api-key` values in keys, the same on every instance (from your secret
//!   store); needed with `REDIS_URL` (`/api` is limited by a header).
//! - `TRUSTED_PROXIES` (for example `10.0.0.0/8,127.0.0.1`): proxies whose
//!   `Forwarded` / `X-Forwarded-For` / `X-Real-IP` headers name the client.
//! - `CLIENT_HEADER` (`forwarded`, `x-forwarded-for` or `x-real-ip`): the one
//!   header those proxies write; without it, whichever the request carries
//!   (and the client is unknown if they disagree).
//! - `RATELIMIT_HEADERS` (`draft`, the default; `legacy`, `both` or `none`):
//!   which rate-limit header fields responses carry.
//! - `RATELIMIT_OVERRIDES` (`"ip_limit_test.count=10; limitTest.shadow=true"`):
//!   rule overrides, checked at start-up; they win over the file's.
//! - `RATELIMIT_OVERRIDES_FILE` (a TOML file with `[rules.NAME]` tables):
//!   read at start-up and again whenever it changes, while serving; a bad
//!   file is reported and changes nothing.
//!   With `REDIS_URL`, the fleet-wide overrides in the Redis hash
//!   `limiter:overrides` apply too, within a second of a change, above the
//!   environment's and the file's:
//!   `redis-cli HSET limiter:overrides ip_limit_test.count 5`.
//! - `BENCH_ONLY` (`limited`, `plain`, `fields` or `middleware`): serve only that one of the
//!   HTTP benchmark's endpoints (`scripts/bench-http` runs a server for each,
//!   so that each is routed alike: actix tries an app's resources in the order
//!   they were registered, and a later one pays for the failed matches of
//!   those before it).

mod support;

use std::time::Duration;

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{App, HttpResponse, HttpServer, Responder, get, web};
use ratelimit_runtime::{RateLimit, RateLimited, Rule, rate_limit};

/// `limitTest`: 2 requests per second, for everyone.
#[rate_limit(key = "limitTest", period = 1, count = 2)]
#[get("/limitTest")]
async fn limit_test() -> impl Responder {
    "limitTest: ok\n"
}

/// `limitTest2`: 3 requests per 10 s, on the custom key `customer_limit_test`.
#[rate_limit(key = "customer_limit_test", period = 10, count = 3)]
#[get("/limitTest2")]
async fn limit_test2() -> impl Responder {
    "limitTest2: ok\n"
}

/// `limitTest3`: 3 requests per 10 s per client address.
#[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
#[get("/limitTest3")]
async fn limit_test3() -> impl Responder {
    "limitTest3: ok\n"
}

/// `limitTest4`: 3 requests per 10 s per client address, and the seed's
/// demote path: a "try again later" page of our own.
#[rate_limit(key = "demote_test", period = 10, count = 3, by = ip, fallback = try_again_later)]
#[get("/limitTest4")]
async fn limit_test4() -> impl Responder {
    "limitTest4: ok\n"
}

/// `api`: 5 requests per 10 s per `x-api-key` header value (requests without
/// the header share one budget). The value is the caller's: long or odd
/// values are digested in the key.
#[rate_limit(key = "api_key_test", period = 10, count = 5, by = header("x-api-key"))]
#[get("/api")]
async fn api() -> impl Responder {
    "api: ok\n"
}

/// `user/{name}`: 3 requests per 10 s per user name in the path.
#[rate_limit(key = "user_test:{name}", period = 10, count = 3)]
#[get("/user/{name}")]
async fn user(name: web::Path<String>) -> impl Responder {
    format!("user {name}: ok\n")
}

/// For the HTTP benchmark: the same handler with a limit it never reaches
/// (a billion a second) and without the attribute.
#[rate_limit(key = "bench", period = 1, count = 1_000_000_000)]
#[get("/bench/limited")]
async fn bench_limited() -> impl Responder {
    "ok\n"
}

/// For the HTTP benchmark: the handler without the attribute, sending two
/// header fields of the same names and lengths as the limited endpoint's, as
/// constants (what the fields cost on their own, with no limiter).
#[get("/bench/fields")]
async fn bench_fields() -> impl Responder {
    const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
    const STATE: HeaderName = HeaderName::from_static("ratelimit");
    const POLICY_VALUE: HeaderValue = HeaderValue::from_static("\"bench\";q=1000000000;w=1");
    const STATE_VALUE: HeaderValue = HeaderValue::from_static("\"bench\";r=999999999;t=1");
    // Built as the plain handler's `&str` is turned into its response.
    let mut response = HttpResponse::from(actix_web::dev::Response::from("ok\n"));
    response.headers_mut().append(POLICY, POLICY_VALUE);
    response.headers_mut().append(STATE, STATE_VALUE);
    response
}

#[get("/bench/plain")]
async fn bench_plain() -> impl Responder {
    "ok\n"
}

/// The HTTP benchmark's endpoints, by the last part of their paths.
const BENCH_ENDPOINTS: [&str; 4] = ["limited", "plain", "fields", "middleware"];

/// For the HTTP benchmark: the plain handler behind the [`RateLimit`]
/// middleware, with a limit it never reaches (as `/bench/limited`'s).
fn bench_middleware() -> RateLimit {
    RateLimit::new(Rule::fixed_window(1_000_000_000, Duration::from_secs(1))).name("bench_mw")
}

/// Every benchmark endpoint, or only the one named.
fn bench_endpoints(config: &mut web::ServiceConfig, only: Option<&str>, middleware: &RateLimit) {
    let wanted = |name: &str| only.is_none_or(|only| only == name);
    if wanted("middleware") {
        config.service(
            web::resource("/bench/middleware")
                .wrap(middleware.clone())
                .get(|| async { "ok\n" }),
        );
    }
    if wanted("limited") {
        config.service(bench_limited);
    }
    if wanted("plain") {
        config.service(bench_plain);
    }
    if wanted("fields") {
        config.service(bench_fields);
    }
}

async fn try_again_later(limited: RateLimited) -> impl Responder {
    HttpResponse::TooManyRequests()
        .insert_header(("retry-after", limited.retry_after_secs().to_string()))
        .content_type("text/html; charset=utf-8")
        .body(support::try_again_page(&limited))
}

#[actix_web::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    let http = support::http_options()?;
    let bench_only = std::env::var("BENCH_ONLY").ok();
    if let Some(only) = bench_only.as_deref()
        && !BENCH_ENDPOINTS.contains(&only)
    {
        return Err(std::io::Error::other(format!(
            "BENCH_ONLY={only:?}: expected one of {BENCH_ENDPOINTS:?}"
        ))
        .into());
    }
    let (limiter, backend) = support::limiter().await?;
    let middleware = bench_middleware();
    // Once every rule is known (the middleware's too).
    support::load_overrides()?;
    let bind = support::bind();
    println!("{}", support::banner(&bind, &backend));
    HttpServer::new(move || {
        App::new()
            .app_data(limiter.clone())
            .app_data(http.clone())
            .service(limit_test)
            .service(limit_test2)
            .service(limit_test3)
            .service(limit_test4)
            .service(api)
            .service(user)
            .configure(|config| bench_endpoints(config, bench_only.as_deref(), &middleware))
            .default_service(web::to(|| async {
                HttpResponse::NotFound().body("not found\n")
            }))
    })
    .bind(bind)?
    .run()
    .await?;
    Ok(())
}
