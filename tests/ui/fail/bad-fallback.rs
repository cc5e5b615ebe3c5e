use ratelimit_runtime::rate_limit;

// `fallback` takes a path.
#[rate_limit(key = "k", count = 3, fallback = "later")]
async fn j(id: u32) -> String {
    id.to_string()
}

fn main() {}
