//! axum (feature `axum`): `#[rate_limit]` on handlers ([`HttpCall`] is an
//! extractor here, [`Reply`] a response), refusals as responses, and the
//! [`RateLimitLayer`](crate::tower::RateLimitLayer) (feature `tower`, on
//! with `axum`) for routers. A thin layer over [`pipeline`](crate::pipeline)
//! and [`http`](crate::http).
//!
//! Per router, through request extensions:
//! - the limiter: `Router::layer(Extension(limiter))`, else the global one;
//! - the [`HttpOptions`]: `Router::layer(Extension(options))`, else the
//!   defaults (no trusted proxy, draft headers);
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
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue};

use crate::http::{HttpCall, HttpOptions, Inner, NoFallback, Refusal, Reply, ReplyKind, append};
use crate::{RateLimited, RateLimiter, pipeline};

/// What a handler's [`HttpCall`] keeps of an axum request.
#[derive(Clone, Debug)]
pub(crate) struct Parts {
    peer: Option<IpAddr>,
    headers: HeaderMap,
    limiter: Option<RateLimiter>,
    options: Option<HttpOptions>,
}

impl Parts {
    pub(crate) fn new(parts: &http::request::Parts) -> Parts {
        Parts {
            peer: peer(&parts.extensions),
            headers: parts.headers.clone(),
            limiter: parts.extensions.get::<RateLimiter>().cloned(),
            options: parts.extensions.get::<HttpOptions>().cloned(),
        }
    }

    pub(crate) fn limiter(&self) -> &RateLimiter {
        self.limiter
            .as_ref()
            .unwrap_or_else(|| RateLimiter::global())
    }

    pub(crate) fn options(&self) -> &HttpOptions {
        self.options
            .as_ref()
            .unwrap_or_else(|| HttpOptions::default_ref())
    }

    pub(crate) fn client_ip(&self) -> Option<IpAddr> {
        self.options().client_ip(self.peer, &self.headers)
    }

    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.get(name).map(HeaderValue::as_bytes)
    }
}

/// The peer's address from axum's `ConnectInfo<SocketAddr>`, or a
/// `SocketAddr` extension another server put there. Missing, it is said
/// once, with how to add it: the client is then unknown (refused, or one
/// shared budget, as [`HttpOptions::unknown_client`] says), never silently
/// everyone's.
pub(crate) fn peer(extensions: &http::Extensions) -> Option<IpAddr> {
    if let Some(ConnectInfo(addr)) = extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(addr.ip());
    }
    if let Some(addr) = extensions.get::<SocketAddr>() {
        return Some(addr.ip());
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::error!(
            "rate limiting by client address needs the peer's address, and this request \
             carries none: serve the router with \
             `into_make_service_with_connect_info::<SocketAddr>()`; until then clients are \
             unknown (refused with 400 unless HttpOptions::unknown_client says otherwise)"
        );
    }
    None
}

/// The request, for `#[rate_limit]` handlers.
impl<S: Send + Sync> FromRequestParts<S> for HttpCall {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<HttpCall, Infallible> {
        Ok(HttpCall {
            inner: Inner::Axum(Parts::new(parts)),
        })
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
/// for an unknown client) with `Retry-After`, the draft rate-limit fields and
/// a plain text body: a handler returning `Result<_, RateLimited>` answers
/// this when limited.
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
