// `wait` on plain async fns: inline bucket rules and a `const Rule`; and
// with every option it goes with: fallback, by = arg, prefix, a named
// limiter, shadow, methods (`&self`), local_quota.
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

struct Partner {
    id: u64,
}

impl Partner {
    #[rate_limit(
        key = "partner:{self.id}",
        prefix = "out:",
        count = 10,
        algorithm = gcra,
        by = arg(user),
        limiter = "outbound",
        fallback = Self::busy,
        local_quota = 5,
        wait = "1s"
    )]
    async fn call(&self, user: &str) -> Result<String, RateLimited> {
        Ok(format!("{}:{user}", self.id))
    }

    async fn busy(&self, user: &str, limited: RateLimited) -> Result<String, RateLimited> {
        let _ = user;
        Err(limited)
    }

    #[rate_limit(key = "trial", count = 2, algorithm = token_bucket, shadow, wait = 2)]
    async fn trial(&self) -> Result<u64, RateLimited> {
        Ok(self.id)
    }
}

fn main() {
    let partner = Partner { id: 1 };
    let _ = (paced(), per_tenant("t"), constant());
    let _ = (partner.call("u"), partner.trial());
}
