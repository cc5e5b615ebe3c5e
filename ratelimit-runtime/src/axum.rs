//! axum (feature `axum`): `#[rate_limit]` on handlers ([`HttpCall`] is an
//! extractor here, [`Reply`] a response), refusals as responses, and the
//! [`RateLimitLayer`](crate::tower::RateLimitLayer) (feature `tower`, on
//! with `axum`) for routers. A thin layer over the decision pipeline
//! and [`http`](crate::http).
//!
//! Per router, through request extensions:
//! - the limiter: `Router::layer(Extension(limiter))`, else the global one;
//! - the [`HttpOptions`]: `Router::layer(Extension(options))`, else the
//!   installed ones ([`HttpOptions::install`]), else the defaults (no
//!   trusted proxy, draft headers);
//! - the peer address: axum's `ConnectInfo<SocketAddr>`; serve the router
//!   with `into_make_service_with_connect_info::<SocketAddr>()`.
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{Extension, Router, routing::get, response::IntoResponse};
//! use ratelimit_runtime::{HttpOptions, RateLimiter, rate_limit};
//!
//! #[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
//! async fn limit_test3() -> impl IntoResponse {
//!     "ok"
//! }
//!
//! # async fn serve() -> std::io::Result<()> {
//! let app = Router::new()
//!     .route("/limitTest3", get(limit_test3))
//!     .layer(Extension(RateLimiter::in_memory()))
//!     .layer(Extension(HttpOptions::new()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::response::{IntoResponse, Response};
use http::HeaderValue;

use crate::decision::RateLimited;
use crate::http::{HttpCall, HttpOptions, NoFallback, Refusal, Reply, ReplyKind, append};
use crate::limiter::RateLimiter;
use crate::pipeline;

/// The peer's address from axum's `ConnectInfo<SocketAddr>`, or a
/// `SocketAddr` extension another server put there.
pub(crate) fn peer(extensions: &http::Extensions) -> Option<IpAddr> {
    if let Some(ConnectInfo(addr)) = extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(|addr| addr.ip())
}

/// The request, for `#[rate_limit]` handlers.
impl<S: Send + Sync> FromRequestParts<S> for HttpCall {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<HttpCall, Infallible> {
        let headers = &parts.headers;
        Ok(HttpCall::new(
            parts.extensions.get::<RateLimiter>().cloned(),
            parts.extensions.get::<HttpOptions>().cloned(),
            peer(&parts.extensions),
            headers,
            |name| headers.get(name).map(HeaderValue::as_bytes),
        ))
    }
}

/// A limited handler's response: its value's with the rate-limit fields,
/// or the refusal.
impl<T: IntoResponse, F: IntoResponse> IntoResponse for Reply<T, F> {
    fn into_response(self) -> Response {
        let mut response = match self.kind {
            ReplyKind::Allowed(value) => value.into_response(),
            ReplyKind::Demoted(value) => value.into_response(),
            ReplyKind::Refused(refusal) => return response(refusal),
        };
        append(response.headers_mut(), self.fields);
        response
    }
}

impl IntoResponse for NoFallback {
    fn into_response(self) -> Response {
        match self {}
    }
}

/// `429 Too Many Requests` (`503` for a backend failure under `deny`, `400`
/// for an unknown client) with `Retry-After`, the rate-limit fields and the
/// body of the installed options ([`HttpOptions::install`]; by default the
/// draft's fields and plain text): a handler returning
/// `Result<_, RateLimited>` answers this when limited.
impl IntoResponse for RateLimited {
    fn into_response(self) -> Response {
        response(crate::http::refusal(&self, &[], HttpOptions::default_ref()))
    }
}

/// An axum handler returning `Response` answers 429 (or 503).
#[diagnostic::do_not_recommend]
impl pipeline::Reject for Response {
    fn reject(limited: RateLimited) -> Self {
        limited.into_response()
    }
}

/// A framework-agnostic refusal as an axum response.
pub(crate) fn response(refusal: Refusal) -> Response {
    let mut response = Response::new(axum::body::Body::from(refusal.body));
    *response.status_mut() = refusal.status;
    append(response.headers_mut(), refusal.headers);
    response
}
