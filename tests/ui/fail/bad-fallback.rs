use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, fallback = wrong_args)]
async fn f(id: u32) -> String {
    id.to_string()
}

async fn wrong_args(limited: RateLimited) -> String {
    limited.to_string()
}

#[rate_limit(key = "k", count = 3, fallback = "later")]
async fn g(id: u32) -> String {
    id.to_string()
}

#[rate_limit(key = "k", count = 3, fallback = later)]
async fn h((a, b): (u32, u32)) -> String {
    (a + b).to_string()
}

async fn later(limited: RateLimited) -> String {
    limited.to_string()
}

fn main() {}
