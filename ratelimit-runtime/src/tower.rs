//! A tower [`Layer`] (feature `tower`): rate limiting for an axum router
//! (`Router::layer`, `route_layer`), a tonic server, or any
//! `tower::Service` of `http` requests, with the same rules, limiter lookup
//! and pipeline as `#[rate_limit]` and the actix-web middleware.

use std::future::Future;
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

use crate::http::flow::{Held, LimitedRequest, Prepared, Responding, admitted};
use crate::http::limit::{KeyFn, Limit, Sites, Subject, limit_builder};
use crate::http::{Headers, HttpOptions, Refusal, Tiers, append};
use crate::limiter::RateLimiter;

/// Rate limiting for every request a tower service handles.
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
/// - **Limiter**: the one given to [`limiter`](RateLimitLayer::limiter),
///   else a `RateLimiter` request extension (`Extension(limiter)` in axum),
///   else the global one.
/// - **Options**: likewise, [`options`](RateLimitLayer::options), else an
///   `HttpOptions` extension, else the defaults.
/// - **Client address** (for [`by_ip`](RateLimitLayer::by_ip)): axum's
///   `ConnectInfo<SocketAddr>` (with the `axum` feature; serve with
///   `into_make_service_with_connect_info::<SocketAddr>()`), or a
///   `SocketAddr` extension, or what [`peer`](RateLimitLayer::peer) reads
///   (tonic's `TcpConnectInfo`, for example). Behind trusted proxies, the
///   forwarding header the options name.
///
/// Allowed responses carry the rate-limit fields; a refused request gets
/// `429` with `Retry-After` (a gRPC request, `grpc-status` 8,
/// `RESOURCE_EXHAUSTED`). A concurrency rule's lease is held until the inner
/// service has produced its response. Decisions go through the same
/// decision pipeline as the attribute's: overrides, shadow mode,
/// the failure policy and metrics apply alike.
#[derive(Clone)]
pub struct RateLimitLayer {
    inner: Arc<Limit<KeyFn<Parts>>>,
    limiter: Option<RateLimiter>,
    options: Option<Arc<HttpOptions>>,
    peer: Option<PeerFn>,
}

/// A closure that reads a request's peer address.
type PeerFn = Arc<dyn Fn(&Parts) -> Option<IpAddr> + Send + Sync>;

limit_builder!(RateLimitLayer, Parts);

impl RateLimitLayer {
    fn from_limit(inner: Arc<Limit<KeyFn<Parts>>>) -> Self {
        RateLimitLayer {
            inner,
            limiter: None,
            options: None,
            peer: None,
        }
    }

    /// A budget per key your closure computes from the request's head;
    /// `None` lets the request through unlimited.
    pub fn by_key(self, key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.with(|m| m.by = Subject::Key(Arc::new(key)))
    }

    /// Rules chosen per request: `pick` names a tier of `tiers` from the
    /// request's head (a plan from an API key, a header), whose rule then
    /// decides, under its own name; `None`, or a name not in the table,
    /// leaves the layer's own rule. The subject (`by_ip`, `by_header`,
    /// `by_key`) is the same.
    pub fn tiers(
        self,
        tiers: Tiers,
        pick: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|m| m.tiers = Some((tiers, Arc::new(pick))))
    }

    /// The limiter to use (instead of a request extension or the global one).
    pub fn limiter(mut self, limiter: RateLimiter) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The HTTP options to use (instead of a request extension or the
    /// defaults).
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

impl<S> Layer<S> for RateLimitLayer {
    type Service = LimitedService<S>;

    /// Logs an error when the layer's keys need a key secret its limiter
    /// (else the installed global one) lacks: its requests are refused
    /// with 500 until the limiter has one.
    fn layer(&self, inner: S) -> LimitedService<S> {
        let _ = self
            .inner
            .check_secret(self.limiter.as_ref(), self.options.as_deref());
        LimitedService {
            inner,
            sites: Arc::new(Sites::new(&self.inner)),
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
    ReqBody: Send + 'static,
    ResBody: Body<Data = bytes::Bytes> + Send,
{
    type Response = Response<LimitedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    /// Decides before anything is awaited: the subject, the key and, in
    /// process memory, the check itself, so the inner service is called at
    /// once; a store that must be awaited is awaited in the future.
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let layer = &self.layer;
        let limiter = match &layer.limiter {
            Some(limiter) => limiter,
            None => parts
                .extensions
                .get::<RateLimiter>()
                .unwrap_or_else(|| RateLimiter::global()),
        };
        let options = match &layer.options {
            Some(options) => options,
            None => parts
                .extensions
                .get::<HttpOptions>()
                .unwrap_or_else(|| HttpOptions::default_ref()),
        };
        let request = TowerRequest {
            parts: &parts,
            peer: layer.peer.as_ref(),
        };
        let (site, key) = match layer.inner.prepare(&self.sites, limiter, options, &request) {
            Prepared::Pass => {
                let future = self.inner.call(Request::from_parts(parts, body));
                return ResponseFuture::inner(future, None);
            }
            Prepared::Refuse(refusal) => {
                return ResponseFuture::ready(refused(refusal, is_grpc(&parts.headers)));
            }
            Prepared::Check(site, key) => (site, key),
        };
        if !layer.inner.settles()
            && let Some(checked) = crate::pipeline::check_now(site, limiter, &key)
        {
            return match admitted(checked, options) {
                Ok(held) => {
                    let future = self.inner.call(Request::from_parts(parts, body));
                    ResponseFuture::inner(future, Some(held))
                }
                Err(refusal) => ResponseFuture::ready(refused(refusal, is_grpc(&parts.headers))),
            };
        }
        // The store must be awaited (or a refund after the response): the
        // service that was made ready answers this request, a clone takes
        // its place.
        let grpc = is_grpc(&parts.headers);
        let (site, key) = (Arc::clone(site), key.into_owned());
        let limiter = limiter.clone();
        let options = match &layer.options {
            Some(options) => Arc::clone(options),
            None => Arc::new(options.clone()),
        };
        let limit = Arc::clone(&layer.inner);
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(Box::pin(async move {
            let checked = crate::pipeline::check_on(&site, Some(&limiter), &key).await;
            let (held, fields) = match admitted(checked, &options) {
                Ok(held) => held,
                Err(refusal) => return Ok(refused(refusal, grpc)),
            };
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            let status = response.status().as_u16();
            limit.finish(held, &site, &limiter, &key, status).await;
            append(response.headers_mut(), fields);
            Ok(response.map(Either::Left))
        }))
    }
}

/// A response future that must wait for the store, boxed.
type Waiting<B, E> = Pin<Box<dyn Future<Output = Result<Response<LimitedBody<B>>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The future of a [`LimitedService`]'s response.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        stage: Responding<F, Response<B>, Response<LimitedBody<B>>, E, Waiting<B, E>>,
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn inner(future: F, held: Option<Held>) -> Self {
        let finish = |mut response: Response<B>, held: Option<Held>| {
            if let Some((permit, fields)) = held {
                drop(permit);
                append(response.headers_mut(), fields);
            }
            response.map(Either::Left)
        };
        let stage = Responding::Inner {
            future,
            held,
            finish,
        };
        ResponseFuture { stage }
    }

    fn ready(response: Response<LimitedBody<B>>) -> Self {
        let stage = Responding::Ready {
            answer: Some(Ok(response)),
        };
        ResponseFuture { stage }
    }

    fn waiting(future: Waiting<B, E>) -> Self {
        let stage = Responding::Waiting { future };
        ResponseFuture { stage }
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

/// A request's head and the layer's peer reader, as the middleware flow
/// reads them.
struct TowerRequest<'a> {
    parts: &'a Parts,
    peer: Option<&'a PeerFn>,
}

impl LimitedRequest<KeyFn<Parts>> for TowerRequest<'_> {
    fn path(&self) -> &str {
        self.parts.uri.path()
    }

    fn headers(&self) -> &impl Headers {
        &self.parts.headers
    }

    fn client_ip(&self, options: &HttpOptions) -> Option<IpAddr> {
        let peer = match self.peer {
            Some(peer) => peer(self.parts),
            None => peer_of(self.parts),
        };
        if peer.is_none() {
            crate::http::no_peer();
        }
        options.client_ip(peer, &self.parts.headers)
    }

    fn run(&self, closure: &KeyFn<Parts>) -> Option<String> {
        closure(self.parts)
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

/// A refusal as a response: HTTP's status and fields, or for gRPC a
/// trailers-only `RESOURCE_EXHAUSTED` (a gRPC client reads no HTTP status).
fn refused<B>(refusal: Refusal, grpc: bool) -> Response<LimitedBody<B>> {
    if grpc {
        let mut response = Response::new(Either::Right(Full::default()));
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from_static("8"));
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
