//! What the examples share: their configuration from the environment (see
//! each example's docs for the variables), their log, and how they report
//! a failure.
#![allow(dead_code)] // each example uses some of it

/// Prints the limiter's log lines (Redis gone or back, shadow refusals) on
/// stderr, at `info` and above.
pub(crate) fn init_logs() {
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_writer(std::io::stderr)
        .init();
}

/// An example's failure, shown as its message (not as a debug dump) when
/// `main` returns it.
pub(crate) struct Failure(Box<dyn std::error::Error>);

impl<E: std::error::Error + 'static> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure(Box::new(error))
    }
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

use std::io;

use ratelimit_runtime::backend::redis::redact_url;
use ratelimit_runtime::{
    ClientHeader, HeaderStyle, HttpOptions, RateLimited, RateLimiter, RateLimiterBuilder,
};

/// Loads `RATELIMIT_OVERRIDES_FILE` (watched) and `RATELIMIT_OVERRIDES`,
/// the variable's settings over the file's. Every rule must be known by
/// then: call it once the middleware and layers are built.
pub(crate) fn load_overrides() -> io::Result<()> {
    if let Ok(path) = std::env::var("RATELIMIT_OVERRIDES_FILE") {
        ratelimit_runtime::overrides::reload_toml(&path).map_err(io::Error::other)?;
        watch_overrides(path.into());
    }
    ratelimit_runtime::overrides::load_env().map_err(io::Error::other)?;
    Ok(())
}

/// Re-reads the overrides file whenever it changes (checked every second).
/// A reload replaces what the file and the variable set, so the variable
/// is applied again over it.
fn watch_overrides(path: std::path::PathBuf) {
    std::thread::spawn(move || {
        let mut seen = None;
        loop {
            let stamp = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
            if stamp != seen {
                seen = stamp;
                match ratelimit_runtime::overrides::reload_toml(&path) {
                    Ok(n) => {
                        // Checked at start-up: it applies again as it did.
                        let _ = ratelimit_runtime::overrides::load_env();
                        println!("overrides from {}: {n} rule(s)", path.display());
                    }
                    Err(error) => eprintln!("overrides not changed: {error}"),
                }
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    });
}

/// `TRUSTED_PROXIES`, `CLIENT_HEADER` and `RATELIMIT_HEADERS`.
pub(crate) fn http_options() -> io::Result<HttpOptions> {
    let mut http = HttpOptions::new();
    if let Ok(proxies) = std::env::var("TRUSTED_PROXIES") {
        http = http
            .trust_proxies(proxies.split(',').map(str::trim).filter(|p| !p.is_empty()))
            .map_err(io::Error::other)?;
    }
    if let Ok(header) = std::env::var("CLIENT_HEADER") {
        http = http.client_header(match header.to_ascii_lowercase().as_str() {
            "forwarded" => ClientHeader::Forwarded,
            "x-forwarded-for" => ClientHeader::XForwardedFor,
            "x-real-ip" => ClientHeader::XRealIp,
            other => {
                return Err(io::Error::other(format!(
                    "CLIENT_HEADER={other:?}: expected forwarded, x-forwarded-for or x-real-ip"
                )));
            }
        });
    }
    if let Ok(style) = std::env::var("RATELIMIT_HEADERS") {
        http = http.headers(match style.as_str() {
            "draft" => HeaderStyle::Draft,
            "legacy" => HeaderStyle::Legacy,
            "both" => HeaderStyle::Both,
            "none" => HeaderStyle::None,
            other => {
                return Err(io::Error::other(format!(
                    "RATELIMIT_HEADERS={other:?}: expected draft, legacy, both or none"
                )));
            }
        });
    }
    Ok(http)
}

/// `builder` with the key secret `RATELIMIT_KEY_SECRET`, if set: the secret
/// of the digests that stand for header values (API keys) in keys. Keep it
/// in your secret store, the same on every instance. With Redis and no
/// secret, `build` fails when an attribute is keyed by a header, and a
/// middleware keyed by a header (or digesting client addresses) answers 500;
/// in memory a random one serves.
pub(crate) fn with_key_secret(builder: RateLimiterBuilder) -> RateLimiterBuilder {
    match std::env::var("RATELIMIT_KEY_SECRET") {
        Ok(secret) => builder.key_secret(secret),
        Err(_) => builder,
    }
}

/// The limiter: on Redis at `REDIS_URL` (reading the fleet's overrides),
/// else in process memory, with the key secret `RATELIMIT_KEY_SECRET`; and
/// where that is, to print.
pub(crate) async fn limiter() -> io::Result<(RateLimiter, String)> {
    let mut builder = with_key_secret(RateLimiter::builder());
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            // The overrides in the hash `limiter:overrides` apply too.
            builder = builder.redis(url.as_str()).fleet_overrides(true);
            // Printed: without its password.
            format!("Redis at {}", redact_url(&url))
        }
        Err(_) => "process memory (set REDIS_URL to share budgets through Redis)".to_owned(),
    };
    Ok((builder.build().await.map_err(io::Error::other)?, backend))
}

/// `BIND`, default `127.0.0.1:8080`.
pub(crate) fn bind() -> String {
    std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8080".into())
}

/// What the servers print once listening.
pub(crate) fn banner(bind: &str, backend: &str) -> String {
    format!(
        "rate limits kept in {backend}\nlistening on http://{bind}: /limitTest (2/s), \
         /limitTest2 (3/10 s), /limitTest3 (3/10 s per IP), /limitTest4 (3/10 s per IP, \
         fallback page), /api (5/10 s per x-api-key), /user/{{name}} (3/10 s per name)"
    )
}

/// The fallback page of `/limitTest4`.
pub(crate) fn try_again_page(limited: &RateLimited) -> String {
    format!(
        "<html><body><h1>Too many requests</h1><p>Please try again in {} seconds.</p></body></html>\n",
        limited.retry_after_secs()
    )
}
