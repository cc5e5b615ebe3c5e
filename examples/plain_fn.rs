//! `#[rate_limit]` on plain async fns: keys from arguments, a fallback (the
//! demote path), stacked rules, a method, a `const Rule`.
//!
//! `cargo run --example plain_fn` (in memory; set `REDIS_URL` for Redis,
//! and `RATELIMIT_KEY_SECRET` for the key secret, as every example reads it).

mod support;

use std::time::Duration;

use ratelimit_runtime::{RateLimited, RateLimiter, Rule, rate_limit};

/// One budget per user and action: `{param}` renders the fn's arguments.
#[rate_limit(key = "report:{user}:{kind}", count = 2, period = "1m")]
async fn report(user: &str, kind: &str) -> Result<String, RateLimited> {
    Ok(format!("{kind} report for {user}"))
}

/// Over the limit, the fallback answers with the same arguments.
#[rate_limit(key = "quote:{symbol}", count = 1, period = "10s", fallback = cached_quote)]
async fn live_quote(symbol: &str) -> String {
    format!("{symbol}: 101.25 (live)")
}

async fn cached_quote(symbol: &str, limited: RateLimited) -> String {
    format!(
        "{symbol}: 101.20 (cached; live again in {} s)",
        limited.retry_after_secs()
    )
}

/// Stacked rules are one decision: at most 3 a second and at most 5 a
/// minute. A call either rule refuses takes nothing from the other.
#[rate_limit(key = "search:burst", count = 3, period = 1)]
#[rate_limit(key = "search:minute", count = 5, period = "1m", algorithm = sliding_log)]
async fn search(q: &str) -> Result<usize, RateLimited> {
    Ok(q.len())
}

/// A rule defined once, checked at compile time (a bad value does not build).
const EXPORTS: Rule = Rule::concurrency(1, Duration::from_secs(30));

struct Tenant {
    id: u32,
}

impl Tenant {
    /// One export at a time per tenant; the lease is released when the call ends.
    #[rate_limit(key = "export:{self.id}", rule = EXPORTS)]
    async fn export(&self) -> Result<String, RateLimited> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(format!("tenant {} exported", self.id))
    }
}

#[tokio::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    if let Ok(url) = std::env::var("REDIS_URL") {
        support::with_key_secret(RateLimiter::builder())
            .redis(url)
            .build()
            .await?
            .install()?;
    }
    println!("backend: {}\n", RateLimiter::global().backend_name());

    println!("report: 2 per minute per user and kind");
    for (user, kind) in [
        ("ann", "sales"),
        ("ann", "sales"),
        ("ann", "sales"),
        ("ann", "stock"),
        ("bob", "sales"),
    ] {
        match report(user, kind).await {
            Ok(text) => println!("  {text}"),
            Err(limited) => println!("  {user}/{kind}: limited ({limited})"),
        }
    }

    println!("\nlive_quote: 1 per 10 s per symbol, then the cached fallback");
    for symbol in ["ACME", "ACME", "INIT"] {
        println!("  {}", live_quote(symbol).await);
    }

    println!("\nsearch: 3 per second and 5 per minute");
    for i in 1..=4 {
        println!(
            "  call {i}: {:?}",
            search("rust").await.map_err(|l| l.to_string())
        );
    }
    tokio::time::sleep(Duration::from_millis(1050)).await;
    for i in 5..=7 {
        println!(
            "  call {i}: {:?}",
            search("rust").await.map_err(|l| l.to_string())
        );
    }

    println!("\nexport: one at a time per tenant");
    let (a, b) = (Tenant { id: 1 }, Tenant { id: 2 });
    let (first, second, other) = tokio::join!(a.export(), a.export(), b.export());
    for outcome in [first, second, other] {
        println!("  {:?}", outcome.map_err(|l| l.to_string()));
    }
    Ok(())
}
