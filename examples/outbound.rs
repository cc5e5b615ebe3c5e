//! Outbound calls paced across a fleet: two processes call a third-party
//! API that allows 5 calls a second (a fake one, served here, answering 429
//! when called faster). Each process makes its calls through a fn with
//! `#[rate_limit(..., wait = "10s")]` on a shared Redis: a call over the
//! rule waits its turn instead of being refused, the turns of both
//! processes are taken from one queue in Redis, and the third party never
//! answers 429.
//!
//! `cargo run --example outbound` (starts a `redis-server` of its own on a
//! free port; set `REDIS_URL` to use yours).

use std::collections::VecDeque;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

/// What the third party allows: 5 calls in any second.
const PARTNER_LIMIT: usize = 5;
/// Calls per worker process.
const CALLS: usize = 10;

/// One call to the partner, paced: 4 a second with no burst (a margin under
/// its 5), waiting up to 10 s for its turn.
#[rate_limit(key = "partner", count = 4, algorithm = gcra, burst = 1, wait = "10s")]
async fn call_partner(addr: &str) -> Result<u16, RateLimited> {
    Ok(get_status(addr).await)
}

/// A plain HTTP/1.1 GET: the status code (0 if the call failed).
async fn get_status(addr: &str) -> u16 {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let request = "GET /v1/charge HTTP/1.1\r\nHost: partner\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return 0;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response)
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// The fake third party: calls in the last second, and what it answered.
#[derive(Default)]
struct Partner {
    recent: Mutex<VecDeque<Instant>>,
    ok: AtomicU64,
    too_many: AtomicU64,
}

async fn charge(State(partner): State<Arc<Partner>>) -> StatusCode {
    let now = Instant::now();
    let mut recent = partner.recent.lock().await;
    while recent
        .front()
        .is_some_and(|&t| now - t >= Duration::from_secs(1))
    {
        recent.pop_front();
    }
    if recent.len() >= PARTNER_LIMIT {
        partner.too_many.fetch_add(1, Ordering::Relaxed);
        return StatusCode::TOO_MANY_REQUESTS;
    }
    recent.push_back(now);
    partner.ok.fetch_add(1, Ordering::Relaxed);
    StatusCode::OK
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A worker process: its calls, all at once, each waiting its turn.
async fn worker(
    id: &str,
    redis: &str,
    addr: &str,
    start_at: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    RateLimiter::builder()
        .redis(redis)
        .build()
        .await?
        .install()?;
    tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let addr = addr.to_owned();
            tokio::spawn(async move { (i, call_partner(&addr).await, Instant::now()) })
        })
        .collect();
    for call in calls {
        let (i, status, at) = call.await?;
        let at = (at - started).as_secs_f64();
        match status {
            Ok(status) => println!("worker {id}: call {i} -> {status} at +{at:.2} s"),
            Err(limited) => println!("worker {id}: call {i} refused: {limited}"),
        }
    }
    Ok(())
}

/// A `redis-server` of the example's own, on a free port.
fn start_redis() -> Result<(Child, String), Box<dyn std::error::Error>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting redis-server (or set REDIS_URL): {e}"))?;
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((child, url));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("redis-server did not start".into())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(spec) = std::env::var("OUTBOUND_WORKER") {
        let parts: Vec<&str> = spec.split(' ').collect();
        let start_at = parts[3].parse()?;
        return worker(parts[0], parts[1], parts[2], start_at).await;
    }

    let (mut own_redis, redis) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let (child, url) = start_redis()?;
            (Some(child), url)
        }
    };
    let partner = Arc::new(Partner::default());
    let app = Router::new()
        .route("/v1/charge", get(charge))
        .with_state(Arc::clone(&partner));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("third party at {addr}: at most {PARTNER_LIMIT} calls a second, else 429");

    // Unpaced, one process's calls at once: the third party refuses most.
    let burst: Vec<_> = (0..CALLS)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move { get_status(&addr).await })
        })
        .collect();
    let mut refused = 0;
    for call in burst {
        refused += u32::from(call.await? == 429);
    }
    println!("unpaced: {refused} of {CALLS} calls answered 429");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    partner.ok.store(0, Ordering::Relaxed);
    partner.too_many.store(0, Ordering::Relaxed);

    // Paced: two processes, each with its calls at once, at the same moment.
    let start_at = unix_ms() + 1_000;
    let exe = std::env::current_exe()?;
    let workers: Vec<Child> = ["A", "B"]
        .iter()
        .map(|id| {
            Command::new(&exe)
                .env("OUTBOUND_WORKER", format!("{id} {redis} {addr} {start_at}"))
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    for mut worker in workers {
        let status = tokio::task::spawn_blocking(move || worker.wait()).await??;
        if !status.success() {
            return Err("a worker failed".into());
        }
    }
    let (ok, too_many) = (
        partner.ok.load(Ordering::Relaxed),
        partner.too_many.load(Ordering::Relaxed),
    );
    println!(
        "paced by `wait` across 2 processes: {ok} answered 200, {too_many} answered 429, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(redis) = &mut own_redis {
        let _ = redis.kill();
        let _ = redis.wait();
    }
    if too_many > 0 {
        return Err("the third party answered 429".into());
    }
    Ok(())
}
