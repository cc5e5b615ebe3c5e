// Every option of the first subset, in the forms users write.
use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "k", count = 3, period = 1)]
async fn seconds() -> Result<u32, RateLimited> {
    Ok(1)
}

#[rate_limit(count = 10, period = "500ms")]
async fn millis_no_key() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "search:{query}:{{literal}}", prefix = "app:", count = 5, period = "1m")]
pub async fn placeholder(query: &str, _page: u32) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(query.len())
}

#[rate_limit(key = "report:{id}", count = 1, period = "1h", fallback = report_later)]
async fn with_fallback(id: u64, mut note: String) -> String {
    note.push('!');
    format!("{id} {note}")
}

async fn report_later(id: u64, note: String, limited: RateLimited) -> String {
    format!("{id} {note} later: {limited}")
}

fn main() {
    let _ = (seconds(), millis_no_key(), placeholder("q", 1), with_fallback(1, String::new()));
}
