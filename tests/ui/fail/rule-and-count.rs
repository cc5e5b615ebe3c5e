use std::time::Duration;

use ratelimit_runtime::{rate_limit, RateLimited, Rule};

const SEARCH: Rule = Rule::fixed_window(100, Duration::from_secs(60));

#[rate_limit(key = "k", rule = SEARCH, count = 3)]
async fn f() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
