//! Pacing a client: [`PaceLayer`] wraps any tower [`Service`] that makes
//! calls *out* (an HTTP client, a gRPC channel) so that each request waits
//! its turn under a rule ([`RateLimiter::until_ready`]) before it is sent,
//! instead of being refused by the service on the other side.
//!
//! ```
//! use std::convert::Infallible;
//! use std::future::{Ready, ready};
//! use std::task::{Context, Poll};
//! use std::time::{Duration, Instant};
//!
//! use ratelimit_runtime::pace::{PaceError, PaceLayer};
//! use ratelimit_runtime::{RateLimiter, Rule};
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! /// The client being paced: here, one that answers at once.
//! #[derive(Clone)]
//! struct Partner;
//!
//! impl Service<&'static str> for Partner {
//!     type Response = u16;
//!     type Error = Infallible;
//!     type Future = Ready<Result<u16, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _order: &'static str) -> Self::Future {
//!         ready(Ok(200))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // 20 calls a second to the partner, one at a time; a call waits up to
//! // 2 s for its turn. Every request shares the key "partner" here; a key
//! // per tenant would come from the request.
//! const PARTNER: Rule = Rule::gcra(20, Duration::from_secs(1)).with_burst(1);
//! let layer = PaceLayer::new(
//!     RateLimiter::in_memory(),
//!     PARTNER,
//!     |_: &&'static str| "partner".to_owned(),
//!     Duration::from_secs(2),
//! );
//! let mut client = layer.layer(Partner);
//! let start = Instant::now();
//! for order in ["a", "b", "c"] {
//!     assert_eq!(client.call(order).await.ok(), Some(200));
//! }
//! assert!(start.elapsed() >= Duration::from_millis(100)); // 50 ms apart
//! # let short = PaceLayer::new(RateLimiter::in_memory(), PARTNER, |_: &&'static str| "p".to_owned(), Duration::ZERO);
//! # let mut short = short.layer(Partner);
//! # assert!(short.call("x").await.is_ok());
//! # assert!(matches!(short.call("y").await, Err(PaceError::Limited(_))));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use crate::decision::RateLimited;
use crate::error::Error;
use crate::limiter::RateLimiter;
use crate::rule::Rule;

/// A tower [`Layer`] that paces the requests of the client it wraps: each
/// waits its turn under `rule` for the key `key` gives it, for at most
/// `max_wait`, then goes to the inner service; one that cannot go within
/// `max_wait` is refused at once with [`PaceError::Limited`] and never
/// sent. Turns are reserved as [`RateLimiter::until_ready`] reserves them
/// (on Redis, across every process sharing it); a request dropped while it
/// waits gives its turn back.
#[derive(Clone)]
pub struct PaceLayer<K> {
    limiter: RateLimiter,
    rule: Rule,
    key: K,
    max_wait: Duration,
}

impl<K> PaceLayer<K> {
    /// Paces requests under `rule` on `limiter`, each keyed by `key`
    /// (`|request| -> String`, the full key: a fixed one paces every
    /// request together), waiting at most `max_wait`. The rule must be
    /// `gcra` or `token_bucket` (else every request answers
    /// [`PaceError::Limiter`] with [`Error::Unsupported`]).
    pub fn new(limiter: RateLimiter, rule: Rule, key: K, max_wait: Duration) -> Self {
        PaceLayer {
            limiter,
            rule,
            key,
            max_wait,
        }
    }
}

impl<K> fmt::Debug for PaceLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("rule", &self.rule)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl<S, K: Clone> Layer<S> for PaceLayer<K> {
    type Service = Pace<S, K>;

    fn layer(&self, inner: S) -> Pace<S, K> {
        Pace {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`PaceLayer`]: the inner client, paced.
#[derive(Clone)]
pub struct Pace<S, K> {
    inner: S,
    layer: PaceLayer<K>,
}

impl<S, K> fmt::Debug for Pace<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pace")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

/// Why a paced request was not answered by the inner service.
#[derive(Debug)]
pub enum PaceError<E> {
    /// Its turn was beyond `max_wait`: refused at once, never sent.
    Limited(RateLimited),
    /// The limiter failed (a backend error under the `deny` policy, or
    /// [`Error::Unsupported`] for a rule or backend that keeps no turns).
    Limiter(Error),
    /// The inner service's own error.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for PaceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaceError::Limited(limited) => limited.fmt(f),
            PaceError::Limiter(error) => error.fmt(f),
            PaceError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for PaceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PaceError::Limited(_) => None,
            PaceError::Limiter(error) => Some(error),
            PaceError::Inner(error) => Some(error),
        }
    }
}

type PaceFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, PaceError<E>>> + Send>>;

impl<S, K, Req> Service<Req> for Pace<S, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    K: Fn(&Req) -> String,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = PaceError<S::Error>;
    type Future = PaceFuture<S::Response, S::Error>;

    /// Always ready: the inner service's readiness is awaited once the
    /// request's turn has come, so a waiting request holds none of it.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let key = (self.layer.key)(&request);
        let (limiter, rule, max_wait) = (
            self.layer.limiter.clone(),
            self.layer.rule,
            self.layer.max_wait,
        );
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let decision = limiter
                .until_ready(&rule, &key, 1, max_wait)
                .await
                .map_err(PaceError::Limiter)?;
            if !decision.allowed {
                return Err(PaceError::Limited(RateLimited::from_decision(&decision)));
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(PaceError::Inner)?;
            inner.call(request).await.map_err(PaceError::Inner)
        })
    }
}
