//! The request flow of both middlewares (actix-web's `RateLimit`, the tower
//! `RateLimitLayer`), written once ([`respond`]): the verdict of each rule
//! (exempt, unknown client or the key to check) and its tier's rules,
//! decided before anything is awaited; the check (one rule answered at
//! once by process memory, else awaited, a set of rules all or nothing);
//! then a refusal or the rate-limit fields, and after the response the
//! refund its status asks for. Each framework gives its request, its inner
//! service and its responses through [`Exchange`].

use std::borrow::Cow;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::limit::{Admission, Chosen, Limit, Sites};
use super::{Field, Headers, HttpOptions, Refusal, rate_limit_headers, refusal};
use crate::decision::RateLimited;
use crate::keys;
use crate::limiter::RateLimiter;
use crate::pipeline::{self, Pass, Report};
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

/// A framework's side of one request: the request, the limiter and options
/// it is checked with, the inner service it goes to, and the responses.
pub(crate) trait Exchange<K>: LimitedRequest<K> + Sized {
    /// The inner service's response.
    type Response;
    /// The middleware's response.
    type Answer;
    /// The inner service's error.
    type Error;
    /// The inner service's response future.
    type Inner: Future<Output = Result<Self::Response, Self::Error>>;
    /// A response that waits for the store (boxed).
    type Waiting: Future<Output = Result<Self::Answer, Self::Error>> + Unpin;

    /// The limiter the request is checked by.
    fn limiter(&self) -> &RateLimiter;
    /// The HTTP options for the request.
    fn options(&self) -> &HttpOptions;
    /// Calls the inner service with the request.
    fn call(self) -> Self::Inner;
    /// Answers the request with `refusal`, without the inner service.
    fn refuse(self, refusal: Refusal) -> Self::Answer;
    /// [`deferred`] (the check awaited, then the response), boxed.
    fn wait(self, checks: Deferred<K>) -> Self::Waiting;
    /// A response's status.
    fn status(response: &Self::Response) -> u16;
    /// The status the client gets for the inner service's `error`.
    fn error_status(error: &Self::Error) -> u16;
    /// The inner service's response with the rate-limit `fields`.
    fn finish(response: Self::Response, fields: Vec<Field>) -> Self::Answer;
}

/// The response future [`respond`] makes for the exchange `X`.
pub(crate) type Flow<K, X> = Responding<
    <X as Exchange<K>>::Inner,
    <X as Exchange<K>>::Response,
    <X as Exchange<K>>::Answer,
    <X as Exchange<K>>::Error,
    <X as Exchange<K>>::Waiting,
>;

/// One request through a middleware of `limit` (with its `sites`): decided
/// before anything is awaited when it can be (exempt, refused, or one rule
/// in process memory), so the inner service is called at once; otherwise
/// the check and the response wait for the store.
pub(crate) fn respond<K, X: Exchange<K>>(
    exchange: X,
    limit: &Arc<Limit<K>>,
    sites: &Arc<Sites>,
) -> Flow<K, X> {
    let limiter = exchange.limiter();
    let options = exchange.options();
    let checks = match limit.prepare(sites, limiter, options, &exchange) {
        Prepared::Pass => return inner(exchange, None),
        Prepared::Refuse(refusal) => return ready::<K, X>(exchange.refuse(refusal)),
        Prepared::Check(site, key) => {
            if limit.refund_if.is_none()
                && let Some(checked) = pipeline::check_now(site, limiter, &key)
            {
                return match admitted(checked, options) {
                    Ok(held) => inner(exchange, Some(held)),
                    Err(refusal) => ready::<K, X>(exchange.refuse(refusal)),
                };
            }
            vec![(Arc::clone(site), key.into_owned())]
        }
        Prepared::CheckAll(checks) => checks,
    };
    // The store must be awaited, or a set checked, or a refund after the
    // response.
    let deferred = Deferred {
        limit: Arc::clone(limit),
        checks,
    };
    Responding::Waiting {
        future: exchange.wait(deferred),
    }
}

/// The inner service's response, to be finished with what `held` holds.
fn inner<K, X: Exchange<K>>(exchange: X, held: Option<Held>) -> Flow<K, X> {
    Responding::Inner {
        future: exchange.call(),
        held,
        finish: X::finish,
    }
}

/// An answer given without the inner service.
fn ready<K, X: Exchange<K>>(answer: X::Answer) -> Flow<K, X> {
    Responding::Ready {
        answer: Some(Ok(answer)),
    }
}

/// What a request waits for the store with: the sites and keys to check
/// it under, all or nothing.
pub(crate) struct Deferred<K> {
    limit: Arc<Limit<K>>,
    checks: Vec<(Arc<Site>, String)>,
}

/// The check awaited, then the inner service's response with the fields
/// (the permits held until it is produced), then what its status gives
/// back.
pub(crate) async fn deferred<K, X: Exchange<K>>(
    exchange: X,
    deferred: Deferred<K>,
) -> Result<X::Answer, X::Error> {
    let limiter = exchange.limiter();
    let options = exchange.options();
    let (passes, fields) = match deferred.check(limiter, options).await {
        Ok(admitted) => admitted,
        Err(refusal) => return Ok(exchange.refuse(refusal)),
    };
    let refunds = deferred.limit.refund_if.is_some();
    let limiter = refunds.then(|| exchange.limiter().clone());
    let answer = exchange.call().await;
    let status = match &answer {
        Ok(response) => X::status(response),
        Err(error) => X::error_status(error),
    };
    let charges: Vec<_> = passes.iter().map(|pass| pass.permit().charge()).collect();
    // The permits (leases) go once the response is produced.
    drop(passes);
    if let Some(limiter) = limiter {
        for ((site, key), charge) in deferred.checks.iter().zip(charges) {
            (deferred.limit)
                .settle(site, &limiter, key, charge, status)
                .await;
        }
    }
    answer.map(|response| X::finish(response, fields))
}

impl<K> Deferred<K> {
    /// Checks the request under each site, all or nothing: the permits and
    /// the fields of every rule, or the refusal (with the fields of the
    /// rules that would have let it through).
    async fn check(
        &self,
        limiter: &RateLimiter,
        options: &HttpOptions,
    ) -> Result<(Vec<Pass>, Vec<Field>), Refusal> {
        if let [(site, key)] = &self.checks[..] {
            let checked = pipeline::check_on(site, Some(limiter), key).await;
            return admitted(checked, options).map(|(pass, fields)| (vec![pass], fields));
        }
        let set: Vec<(&Site, &str)> = self
            .checks
            .iter()
            .map(|(site, key)| (&**site, key.as_str()))
            .collect();
        let mut seen = vec![None; set.len()];
        match pipeline::check_all_on(&set, Some(limiter), &mut seen).await {
            Ok(passes) => {
                let fields = rate_limit_headers(options.headers, passes.iter().map(Pass::report));
                Ok((passes, fields))
            }
            Err((_, limited)) => {
                let passed: Vec<Report> = seen.into_iter().flatten().collect();
                Err(refusal(&limited, &passed, options))
            }
        }
    }
}

/// What a middleware does with a request, decided before anything is
/// awaited.
pub(crate) enum Prepared<'a> {
    /// Unlimited (an exempt path, or no rule applies): call the inner
    /// service as it is.
    Pass,
    /// Refused: answer with this, without calling the inner service.
    Refuse(Refusal),
    /// Check it at this site under this key.
    Check(&'a Arc<Site>, Cow<'a, str>),
    /// Check it under several rules at once, all or nothing.
    CheckAll(Vec<(Arc<Site>, String)>),
}

impl<K> Limit<K> {
    /// What to do with `request` under this middleware's rules (or their
    /// tiers') on `limiter`: pass it, refuse it, or the sites and keys to
    /// check it under.
    pub(crate) fn prepare<'a>(
        &'a self,
        sites: &'a Sites,
        limiter: &RateLimiter,
        options: &HttpOptions,
        request: &impl LimitedRequest<K>,
    ) -> Prepared<'a> {
        if self.exempt_path(request.path()) {
            return Prepared::Pass;
        }
        let mut one: Option<(&'a Arc<Site>, Cow<'a, str>)> = None;
        let mut set: Vec<(Arc<Site>, String)> = Vec::new();
        let mut add = |site: &'a Arc<Site>, key: Cow<'a, str>| match one.take() {
            None if set.is_empty() => one = Some((site, key)),
            first => {
                set.extend(first.map(|(site, key)| (Arc::clone(site), key.into_owned())));
                set.push((Arc::clone(site), key.into_owned()));
            }
        };
        for (rule, rule_sites) in self.rules.iter().zip(&sites.rules) {
            let verdict = rule.verdict(
                &rule_sites.own,
                options,
                limiter,
                || request.client_ip(options),
                request.headers(),
                |closure| request.run(closure),
            );
            let key = match verdict {
                Admission::Pass => continue,
                Admission::Check(key) => key,
                Admission::Refuse(limited) => {
                    return Prepared::Refuse(refusal(&limited, &[], options));
                }
            };
            match rule_sites.choose(rule, key, |pick| request.run(pick)) {
                Chosen::One(site, key) => add(site, key),
                Chosen::Tier(tier, subject) => {
                    for site in tier {
                        add(
                            site,
                            Cow::Owned(keys::key(site.prefix, site.name, &subject)),
                        );
                    }
                }
            }
        }
        match one {
            Some((site, key)) => Prepared::Check(site, key),
            None if set.is_empty() => Prepared::Pass,
            None => Prepared::CheckAll(set),
        }
    }
}

/// The checked request's fate: the permit to hold until the response and
/// the rate-limit fields it gets, or the refusal to answer.
fn admitted(checked: Result<Pass, RateLimited>, options: &HttpOptions) -> Result<Held, Refusal> {
    match checked {
        Ok(held) => {
            let fields = rate_limit_headers(options.headers, [held.report()]);
            Ok((held, fields))
        }
        Err(limited) => Err(refusal(&limited, &[], options)),
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
            finish: fn(T, Vec<Field>) -> U,
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
                let fields = match held.take() {
                    // The permit goes once the response is produced.
                    Some((permit, fields)) => {
                        drop(permit);
                        fields
                    }
                    None => Vec::new(),
                };
                Poll::Ready(Ok(finish(response, fields)))
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
