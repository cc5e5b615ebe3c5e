//! What `#[rate_limit]` adds to an actix-web handler per request, in
//! process: the same handler with and without the attribute, each request
//! through the app's whole service stack (routing, extractors, the response
//! with its headers), no network. Over TCP a request also costs the server
//! its socket work (several µs), which this leaves out on purpose: the
//! difference between the two is the attribute's own cost.
//!
//! `handler/middleware` is the plain handler behind the `RateLimit`
//! middleware with the same rule.
//!
//! `handler/*_cold` are the same requests with the CPU's caches disturbed
//! before each one (1 MiB written, more than a core's L2 cache), as a
//! server's socket work between two requests disturbs them: only the
//! request is timed. The attribute's code and data then come from further
//! away, which is closer to what it costs in a server than the hot loop.
//!
//! `cargo bench -p ratelimit-benches --bench handler`

use std::hint::black_box;
use std::time::{Duration, Instant};

use actix_web::{App, Responder, get, test, web};
use criterion::{Criterion, criterion_group, criterion_main};
use ratelimit_runtime::{RateLimit, Rule, rate_limit};

/// As in `examples/actix_server.rs`: a limit it never reaches, the default
/// rate-limit headers on every response.
#[rate_limit(key = "bench", period = 1, count = 1_000_000_000)]
#[get("/bench/limited")]
async fn limited() -> impl Responder {
    "ok\n"
}

#[get("/bench/plain")]
async fn plain() -> impl Responder {
    "ok\n"
}

fn handler(c: &mut Criterion) {
    let system = actix_web::rt::System::new();
    // An app per handler: actix tries an app's resources in the order they
    // were registered, so in one app the second would also pay for the
    // first's failed match (about 25 ns a request here).
    let plain_app = system.block_on(test::init_service(App::new().service(plain)));
    let limited_app = system.block_on(test::init_service(App::new().service(limited)));
    // The plain handler behind the middleware, with the same rule.
    let middleware =
        RateLimit::new(Rule::fixed_window(1_000_000_000, Duration::from_secs(1))).name("bench_mw");
    let middleware_app = system.block_on(test::init_service(
        App::new().service(web::scope("").wrap(middleware).service(plain)),
    ));
    let apps = [
        ("plain", "/bench/plain", &plain_app),
        ("limited", "/bench/limited", &limited_app),
        ("middleware", "/bench/plain", &middleware_app),
    ];
    let mut group = c.benchmark_group("handler");
    for (name, path, app) in apps {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                system.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let request = test::TestRequest::get().uri(path).to_request();
                        let response = test::call_service(app, request).await;
                        assert!(response.status().is_success());
                        black_box(response);
                    }
                    start.elapsed()
                })
            })
        });
    }
    let mut junk = vec![0u64; 1 << 17];
    for (name, path, app) in apps {
        let name = format!("{name}_cold");
        group.bench_function(&name, |b| {
            b.iter_custom(|iters| {
                system.block_on(async {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        // One write per cache line.
                        for line in junk.chunks_mut(8) {
                            line[0] = line[0].wrapping_add(1);
                        }
                        black_box(&junk);
                        let start = Instant::now();
                        let request = test::TestRequest::get().uri(path).to_request();
                        let response = test::call_service(app, request).await;
                        assert!(response.status().is_success());
                        black_box(response);
                        timed += start.elapsed();
                    }
                    timed
                })
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = handler
}
criterion_main!(benches);
