use std::time::Duration;

use ratelimit_runtime::{rate_limit, RateLimited, Rule};

const SMALL: Rule = Rule::token_bucket(10, Duration::from_secs(1)).with_burst(4);

#[rate_limit(key = "k", count = 3, cost = 5)]
async fn inline() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", rule = SMALL, cost = 5)]
async fn from_const() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "k", count = 3, cost = 0)]
async fn zero() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
