// `wait` on plain async fns: inline bucket rules and a `const Rule`.
use std::time::Duration;

use ratelimit_runtime::{rate_limit, RateLimited, Rule};

#[rate_limit(key = "partner", count = 4, algorithm = gcra, burst = 1, wait = "2s")]
async fn paced() -> Result<u32, RateLimited> {
    Ok(1)
}

#[rate_limit(key = "llm:{tenant}", count = 100, period = "1m", algorithm = token_bucket, cost = 5, wait = 30)]
async fn per_tenant(tenant: &str) -> Result<usize, RateLimited> {
    Ok(tenant.len())
}

const PARTNER: Rule = Rule::gcra(10, Duration::from_secs(1));

#[rate_limit(key = "c", rule = PARTNER, wait = "500ms", on_error = deny)]
async fn constant() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {
    let _ = (paced(), per_tenant("t"), constant());
}
