//! A tower [`Layer`] (feature `tower`): rate limiting for an axum router
//! (`Router::layer`, `route_layer`), a tonic server, or any
//! `tower::Service` of `http` requests, with the same rules, limiter lookup
//! and pipeline as `#[rate_limit]` and the actix-web middleware.

use std::borrow::{BorrowMut, Cow};
use std::future::Future;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use tower_layer::Layer;
use tower_service::Service;

use crate::http::flow::{self, Deferred, Exchange, LimitedRequest, Responding};
use crate::http::limit::{KeyFn, Sites};
use crate::http::middleware::PeerFn;
use crate::http::{Field, Headers, HttpOptions, Middleware, Refusal, append};
use crate::limiter::RateLimiter;

/// Rate limiting for every request a tower service handles: a
/// [`Middleware`] over the request's head (`http::request::Parts`, what its
/// [`by_key`](Middleware::by_key) and tier pickers read).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use ratelimit_runtime::{RateLimitLayer, Rule};
///
/// const API: Rule = Rule::gcra(100, Duration::from_secs(60));
/// let app: Router = Router::new()
///     .route("/api", get(|| async { "ok" }))
///     .route("/health", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(API).name("api").by_ip().exempt_path("/health"));
/// ```
///
/// - **Limiter**: the one given to [`limiter`](Middleware::limiter),
///   else a `RateLimiter` request extension (`Extension(limiter)` in axum),
///   else the global one.
/// - **Options**: likewise, [`options`](Middleware::options), else an
///   `HttpOptions` extension, else the installed ones
///   ([`HttpOptions::install`]), else the defaults.
/// - **Client address** (for [`by_ip`](Middleware::by_ip)): axum's
///   `ConnectInfo<SocketAddr>` (with the `axum` feature; serve with
///   `into_make_service_with_connect_info::<SocketAddr>()`), or a
///   `SocketAddr` extension, or what [`peer`](Middleware::peer) reads
///   (tonic's `TcpConnectInfo`, for example). Behind trusted proxies, the
///   forwarding header the options name.
///
/// Allowed responses carry the rate-limit fields; a refused request gets
/// `429` with `Retry-After` (a gRPC request, `grpc-status` 8,
/// `RESOURCE_EXHAUSTED`; 14, `UNAVAILABLE`, when the limiter cannot
/// decide).
pub type RateLimitLayer = Middleware<Parts>;

/// The layer's own settings (the actix-web middleware reads its app's).
impl Middleware<Parts> {
    /// The limiter to use (instead of a request extension or the global one).
    pub fn limiter(mut self, limiter: RateLimiter) -> Self {
        RateLimiter::note_app_limiter();
        self.limiter = Some(limiter);
        self
    }

    /// The HTTP options to use (instead of a request extension, the
    /// installed ones or the defaults).
    pub fn options(mut self, options: HttpOptions) -> Self {
        self.options = Some(Arc::new(options));
        self
    }

    /// Reads the peer's address with `peer` (for servers that keep it in an
    /// extension of their own).
    pub fn peer(mut self, peer: impl Fn(&Parts) -> Option<IpAddr> + Send + Sync + 'static) -> Self {
        self.peer = Some(Arc::new(peer));
        self
    }
}

impl<S> Layer<S> for Middleware<Parts> {
    type Service = LimitedService<S>;

    /// Logs an error when the layer's keys need a key secret its limiter
    /// (else the installed global one) lacks: its requests are refused
    /// with 500 until the limiter has one.
    fn layer(&self, inner: S) -> LimitedService<S> {
        let _ = self
            .limit
            .check_secret(self.limiter.as_ref(), self.options.as_deref());
        LimitedService {
            inner,
            sites: Arc::new(Sites::new(&self.limit)),
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct LimitedService<S> {
    inner: S,
    sites: Arc<Sites>,
    layer: RateLimitLayer,
}

impl<S> std::fmt::Debug for LimitedService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

/// The body of a limited service's responses: the inner service's, or a
/// refusal's.
pub type LimitedBody<B> = Either<B, Full<bytes::Bytes>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LimitedService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Body<Data = bytes::Bytes> + Send,
{
    type Response = Response<LimitedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    /// The one request flow of both middlewares: decided before anything
    /// is awaited when it can be, so the inner service is called at once.
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let layer = &self.layer;
        let exchange = TowerExchange {
            service: &mut self.inner,
            parts,
            body,
            limiter: layer.limiter.as_ref().map(Cow::Borrowed),
            options: layer.options.as_ref().map(Cow::Borrowed),
            peer: layer.peer.as_ref(),
            kind: PhantomData::<S>,
        };
        ResponseFuture {
            stage: flow::respond(exchange, &layer.limit, &self.sites),
        }
    }
}

/// A response future that must wait for the store, boxed.
type TowerWaiting<B, E> = Pin<Box<dyn Future<Output = Result<Response<LimitedBody<B>>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The future of a [`LimitedService`]'s response.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        stage: Responding<F, Response<B>, Response<LimitedBody<B>>, E, TowerWaiting<B, E>>,
    }
}

impl<F, B, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<LimitedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().stage.poll(cx)
    }
}

/// One request, the layer's settings and the inner service: borrowed from
/// the service (`H` is `&mut S`, the service made ready) while it is
/// decided, owned (`S`) by a response that waits for the store.
struct TowerExchange<'a, S, H, B> {
    service: H,
    parts: Parts,
    body: B,
    limiter: Option<Cow<'a, RateLimiter>>,
    options: Option<Cow<'a, Arc<HttpOptions>>>,
    peer: Option<&'a PeerFn<Parts>>,
    kind: PhantomData<S>,
}

impl<S, H, B> LimitedRequest<KeyFn<Parts>> for TowerExchange<'_, S, H, B> {
    fn path(&self) -> &str {
        self.parts.uri.path()
    }

    fn headers(&self) -> &impl Headers {
        &self.parts.headers
    }

    fn client_ip(&self, options: &HttpOptions) -> Option<IpAddr> {
        let peer = match self.peer {
            Some(peer) => peer(&self.parts),
            None => peer_of(&self.parts),
        };
        if peer.is_none() {
            crate::http::no_peer();
        }
        options.client_ip(peer, &self.parts.headers)
    }

    fn run(&self, closure: &KeyFn<Parts>) -> Option<String> {
        closure(&self.parts)
    }
}

impl<S, H, ReqBody, ResBody> Exchange<KeyFn<Parts>> for TowerExchange<'_, S, H, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    H: BorrowMut<S>,
    ReqBody: Send + 'static,
    ResBody: Body<Data = bytes::Bytes> + Send,
{
    type Response = Response<ResBody>;
    type Answer = Response<LimitedBody<ResBody>>;
    type Error = S::Error;
    type Inner = S::Future;
    type Waiting = TowerWaiting<ResBody, S::Error>;

    fn limiter(&self) -> &RateLimiter {
        match &self.limiter {
            Some(limiter) => limiter,
            None => match self.parts.extensions.get::<RateLimiter>() {
                Some(limiter) => {
                    RateLimiter::note_app_limiter();
                    limiter
                }
                None => RateLimiter::global(),
            },
        }
    }

    fn options(&self) -> &HttpOptions {
        match &self.options {
            Some(options) => options,
            None => self
                .parts
                .extensions
                .get::<HttpOptions>()
                .unwrap_or_else(|| HttpOptions::default_ref()),
        }
    }

    fn call(mut self) -> S::Future {
        let request = Request::from_parts(self.parts, self.body);
        self.service.borrow_mut().call(request)
    }

    fn refuse(self, refusal: Refusal) -> Self::Answer {
        refused(refusal, is_grpc(&self.parts.headers))
    }

    /// The service that was made ready answers this request; a clone takes
    /// its place.
    fn wait(mut self, checks: Deferred<KeyFn<Parts>>) -> Self::Waiting {
        let service = self.service.borrow_mut();
        let clone = service.clone();
        let owned = TowerExchange {
            service: std::mem::replace(service, clone),
            parts: self.parts,
            body: self.body,
            limiter: self.limiter.map(|limiter| Cow::Owned(limiter.into_owned())),
            options: self.options.map(|options| Cow::Owned(options.into_owned())),
            peer: None,
            kind: PhantomData::<S>,
        };
        Box::pin(flow::deferred(owned, checks))
    }

    fn status(response: &Response<ResBody>) -> u16 {
        response.status().as_u16()
    }

    /// The server fails the request: the client gets no response.
    fn error_status(_: &S::Error) -> u16 {
        500
    }

    fn finish(mut response: Response<ResBody>, fields: Vec<Field>) -> Self::Answer {
        append(response.headers_mut(), fields);
        response.map(Either::Left)
    }
}

/// The peer's address: axum's `ConnectInfo`, or a `SocketAddr` extension.
fn peer_of(parts: &Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    {
        crate::axum::peer(&parts.extensions)
    }
    #[cfg(not(feature = "axum"))]
    {
        parts
            .extensions
            .get::<std::net::SocketAddr>()
            .map(|addr| addr.ip())
    }
}

/// Whether the request is gRPC (`application/grpc`, `application/grpc+proto`, ...).
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status of a refusal of HTTP status `status`: over the limit,
/// `RESOURCE_EXHAUSTED`; the limiter unable to decide, `UNAVAILABLE` (a
/// client may try again); an unknown client, `INVALID_ARGUMENT`; the
/// limiter misconfigured, `INTERNAL`. A status of your own refusal maps as
/// gRPC's HTTP mapping has it.
fn grpc_status(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "3",
        401 => "16",
        403 => "7",
        404 => "12",
        500 => "13",
        502..=504 => "14",
        _ => "8",
    }
}

/// A refusal as a response: HTTP's status and fields, or for gRPC a
/// trailers-only response with the gRPC status (`RESOURCE_EXHAUSTED` over
/// the limit; a gRPC client reads no HTTP status).
fn refused<B>(refusal: Refusal, grpc: bool) -> Response<LimitedBody<B>> {
    if grpc {
        let mut response = Response::new(Either::Right(Full::default()));
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(
            "grpc-status",
            HeaderValue::from_static(grpc_status(refusal.status)),
        );
        if let Ok(message) = HeaderValue::try_from(refusal.body.trim_end()) {
            headers.insert("grpc-message", message);
        }
        let fields = refusal
            .headers
            .into_iter()
            .filter(|(name, _)| *name != "content-type")
            .collect();
        append(headers, fields);
        return response;
    }
    let mut response = Response::new(Either::Right(Full::from(refusal.body)));
    *response.status_mut() = refusal.status;
    append(response.headers_mut(), refusal.headers);
    response
}
