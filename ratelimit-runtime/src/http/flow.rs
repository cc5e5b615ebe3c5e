//! The request flow of both middlewares (actix-web's `RateLimit`, the tower
//! `RateLimitLayer`), written once: the verdict (exempt, unknown client or
//! the key to check) and the tier's rule, decided before anything is
//! awaited; the check (answered at once by process memory, else awaited);
//! then a refusal or the rate-limit fields, and after the response the
//! refund its status asks for. Each framework reads its request through
//! [`LimitedRequest`] and turns [`Refusal`]s and fields into its own
//! responses.

use std::borrow::Cow;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::limit::{Limit, Sites, Verdict};
use super::{Field, Headers, HttpOptions, Refusal, rate_limit_headers, refusal};
use crate::decision::RateLimited;
use crate::limiter::RateLimiter;
use crate::pipeline::Pass;
use crate::site::Site;

/// What an admitted request holds until its response: the permit (a
/// concurrency rule's lease) and the rate-limit fields.
pub(crate) type Held = (Pass, Vec<Field>);

/// A request as the flow reads it; `K` is the framework's closure type (a
/// middleware's `by_key` and tier picker), which the request runs.
pub(crate) trait LimitedRequest<K> {
    /// The URL's path, for exempt paths.
    fn path(&self) -> &str;
    /// The header fields, for `by_header` and forwarding headers.
    fn headers(&self) -> &impl Headers;
    /// The client's address as `options` tell it (the peer, or behind
    /// trusted proxies the hop they name).
    fn client_ip(&self, options: &HttpOptions) -> Option<IpAddr>;
    /// What the framework's closure says of this request.
    fn run(&self, closure: &K) -> Option<String>;
}

/// What a middleware does with a request, decided before anything is
/// awaited.
pub(crate) enum Prepared<'a> {
    /// Unlimited (an exempt path or subject, or no key): call the inner
    /// service as it is.
    Pass,
    /// Refused: answer with this, without calling the inner service.
    Refuse(Refusal),
    /// Check it at this site under this key.
    Check(&'a Arc<Site>, Cow<'a, str>),
}

impl<K> Limit<K> {
    /// What to do with `request` under this middleware's rule (or its
    /// tier's) on `limiter`: pass it, refuse it, or the site and key to
    /// check it under.
    pub(crate) fn prepare<'a>(
        &'a self,
        sites: &'a Sites,
        limiter: &RateLimiter,
        options: &HttpOptions,
        request: &impl LimitedRequest<K>,
    ) -> Prepared<'a> {
        let verdict = self.verdict(
            &sites.own,
            request.path(),
            options,
            limiter,
            || request.client_ip(options),
            request.headers(),
            |closure| request.run(closure),
        );
        let key = match verdict {
            Verdict::Pass => return Prepared::Pass,
            Verdict::Check(key) => key,
            Verdict::Refuse(limited) => return Prepared::Refuse(refusal(&limited, &[], options)),
        };
        let (site, key) = sites.choose(self, key, |pick| request.run(pick));
        Prepared::Check(site, key)
    }

    /// Whether a request's response may give back what it took (so the
    /// middleware must wait for the store after the response).
    pub(crate) fn settles(&self) -> bool {
        self.refund_if.is_some()
    }
}

/// The checked request's fate: the permit to hold until the response and
/// the rate-limit fields it gets, or the refusal to answer.
pub(crate) fn admitted(
    checked: Result<Pass, RateLimited>,
    options: &HttpOptions,
) -> Result<(Pass, Vec<Field>), Refusal> {
    match checked {
        Ok(held) => {
            let fields = rate_limit_headers(options.headers, [held.report()]);
            Ok((held, fields))
        }
        Err(limited) => Err(refusal(&limited, &[], options)),
    }
}

impl<K> Limit<K> {
    /// Once the inner service has answered with `status`: gives the permit
    /// back (a concurrency lease is held until the response is produced),
    /// and gives back what the request took if the middleware says so for
    /// that status.
    pub(crate) async fn finish(
        &self,
        held: Pass,
        site: &Site,
        limiter: &RateLimiter,
        key: &str,
        status: u16,
    ) {
        let charge = held.permit().charge();
        drop(held);
        self.settle(site, limiter, key, charge, status).await;
    }
}

pin_project_lite::pin_project! {
    /// A middleware's response future, for both frameworks: the inner
    /// service's response finished with the fields (`finish`: appends them
    /// and maps the body), a refusal answered at once, or a check that
    /// waits for the store (`W`, boxed by the framework).
    #[project = RespondingProj]
    pub(crate) enum Responding<F, T, U, E, W> {
        /// The inner service's response, then the fields.
        Inner {
            #[pin]
            future: F,
            held: Option<Held>,
            finish: fn(T, Option<Held>) -> U,
        },
        /// Answered without the inner service (a refusal).
        Ready { answer: Option<Result<U, E>> },
        /// The check and the response, waiting for the store.
        Waiting { future: W },
    }
}

impl<F, T, U, E, W> Future for Responding<F, T, U, E, W>
where
    F: Future<Output = Result<T, E>>,
    W: Future<Output = Result<U, E>> + Unpin,
{
    type Output = Result<U, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            RespondingProj::Inner {
                future,
                held,
                finish,
            } => {
                let response = std::task::ready!(future.poll(cx))?;
                // The permit goes once the response is produced.
                Poll::Ready(Ok(finish(response, held.take())))
            }
            RespondingProj::Ready { answer } => Poll::Ready(
                answer
                    .take()
                    .expect("a response future polled after it ended"),
            ),
            RespondingProj::Waiting { future } => Pin::new(future).poll(cx),
        }
    }
}
