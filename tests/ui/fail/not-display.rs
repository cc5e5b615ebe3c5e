use ratelimit_runtime::{rate_limit, RateLimited};

struct Point {
    x: i32,
}

#[rate_limit(key = "at:{point}", count = 3)]
async fn f(point: Point) -> Result<i32, RateLimited> {
    Ok(point.x)
}

fn main() {}
