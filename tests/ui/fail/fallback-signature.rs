use ratelimit_runtime::{rate_limit, RateLimited};

// A fallback without the fn's arguments.
#[rate_limit(key = "k", count = 3, fallback = wrong_args)]
async fn f(id: u32) -> String {
    id.to_string()
}

async fn wrong_args(limited: RateLimited) -> String {
    limited.to_string()
}

// A fallback whose parameter has another type.
#[rate_limit(key = "k", count = 3, fallback = slow_down)]
async fn g(x: u32) -> String {
    x.to_string()
}

async fn slow_down(x: &str, limited: RateLimited) -> String {
    format!("{x}: {limited}")
}

// A fallback that returns something else.
#[rate_limit(key = "k", count = 3, fallback = other_type)]
async fn h(x: u32) -> Result<u32, RateLimited> {
    Ok(x)
}

async fn other_type(x: u32, _limited: RateLimited) -> u32 {
    x
}

// A fallback that is not async.
#[rate_limit(key = "k", count = 3, fallback = not_async)]
async fn i(x: u32) -> String {
    x.to_string()
}

fn not_async(x: u32, _limited: RateLimited) -> String {
    x.to_string()
}

// A method's fallback must take the receiver first.
struct Account;

impl Account {
    #[rate_limit(key = "k", count = 3, fallback = Self::later)]
    async fn read(&self, what: &str) -> String {
        what.to_owned()
    }

    async fn later(what: &str, _limited: RateLimited) -> String {
        what.to_owned()
    }
}

// An axum handler's fallback takes its extractors, as the handler writes them.
#[derive(Clone)]
struct App;

#[rate_limit(key = "item:{id}", count = 3, fallback = busy)]
async fn item(
    axum::extract::State(_app): axum::extract::State<App>,
    axum::extract::Path(id): axum::extract::Path<u32>,
) -> impl axum::response::IntoResponse {
    id.to_string()
}

async fn busy(axum::extract::Path(id): axum::extract::Path<u32>, _limited: RateLimited) -> String {
    id.to_string()
}

// A handler's fallback must answer a response.
struct NotAResponse;

#[rate_limit(key = "ip", count = 3, by = ip, fallback = not_a_response)]
async fn by_ip() -> impl axum::response::IntoResponse {
    "ok"
}

async fn not_a_response(_limited: RateLimited) -> NotAResponse {
    NotAResponse
}

fn main() {}
