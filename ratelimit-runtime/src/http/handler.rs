//! `#[rate_limit]` on HTTP handlers, for any framework the crate adapts:
//! [`HttpCall`], an extractor in actix-web and in axum that tells the
//! expansion who the client is and which limiter and options the app set,
//! and [`Reply`], the handler's response with the rate-limit fields (or the
//! refusal), a responder in actix-web and in axum.

use std::net::IpAddr;

use super::{Field, HttpOptions, Refusal, rate_limit_headers, refusal};
use crate::decision::RateLimited;
use crate::limiter::RateLimiter;
use crate::pipeline::{self, Pass, Report};
use crate::site::Site;

/// What `#[rate_limit]` reads of an HTTP request: the limiter and
/// [`HttpOptions`] the app set, the client's address, and the values of the
/// headers `by = header(..)` rules name. An extractor in actix-web (feature
/// `actix`) and in axum (feature `axum`); the attribute adds one to a
/// handler that needs it, first among its parameters. It keeps its own
/// copies (`Send`, whatever the framework), taken when it is extracted.
///
/// - actix-web: the limiter and options are app data
///   (`App::app_data(limiter)` or `web::Data<RateLimiter>`, and the same for
///   `HttpOptions`); the peer is the connection's.
/// - axum: they are request extensions (`Router::layer(Extension(limiter))`,
///   `Extension(options)`); the peer is axum's `ConnectInfo<SocketAddr>`, so
///   serve the router with
///   `into_make_service_with_connect_info::<SocketAddr>()`.
///
/// Without a limiter of the app's, the global one is used; without options,
/// the installed ones ([`HttpOptions::install`]), else the defaults (no
/// trusted proxy, draft headers).
///
/// Its `Debug` names the headers it kept, never their values (API keys),
/// so a `#[tracing::instrument]` under `#[rate_limit]`, which records the
/// extractor the attribute adds, logs no secret; nor the client's address
/// when the options digest addresses.
#[derive(Clone)]
pub struct HttpCall {
    limiter: Option<RateLimiter>,
    options: Option<HttpOptions>,
    client: Option<IpAddr>,
    /// Whether the request carried no peer address.
    pub(super) no_peer: bool,
    /// The values of the headers rules are keyed by.
    headers: Vec<(&'static str, Box<[u8]>)>,
}

impl std::fmt::Debug for HttpCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| *name).collect();
        let mut out = f.debug_struct("HttpCall");
        if self.options().digest_ips {
            out.field("client", &self.client.map(|_| "<digested>"));
        } else {
            out.field("client", &self.client);
        }
        out.field("headers", &headers)
            .field(
                "limiter",
                &self.limiter.as_ref().map(RateLimiter::backend_name),
            )
            .finish_non_exhaustive()
    }
}

impl HttpCall {
    /// What a handler needs of a request: `limiter` and `options` the app's,
    /// `peer` the TCP peer's address, `header` a field's first value.
    pub(crate) fn new<'h>(
        limiter: Option<RateLimiter>,
        options: Option<HttpOptions>,
        peer: Option<IpAddr>,
        all: &impl super::Headers,
        header: impl Fn(&str) -> Option<&'h [u8]>,
    ) -> HttpCall {
        if limiter.is_some() {
            RateLimiter::note_app_limiter();
        }
        let client = options
            .as_ref()
            .unwrap_or_else(|| HttpOptions::default_ref())
            .client_ip(peer, all);
        let mut headers: Vec<(&'static str, Box<[u8]>)> = Vec::new();
        for &name in crate::keys::HEADER_SUBJECTS {
            if !headers
                .iter()
                .any(|(known, _)| known.eq_ignore_ascii_case(name))
                && let Some(value) = header(name)
            {
                headers.push((name, value.into()));
            }
        }
        HttpCall {
            limiter,
            options,
            client,
            no_peer: peer.is_none(),
            headers,
        }
    }

    /// The limiter for this request: the app's, else the global one.
    pub fn limiter(&self) -> &RateLimiter {
        self.limiter
            .as_ref()
            .unwrap_or_else(|| RateLimiter::global())
    }

    /// The HTTP options for this request: the app's, else the installed
    /// ones, else the defaults.
    pub fn options(&self) -> &HttpOptions {
        self.options
            .as_ref()
            .unwrap_or_else(|| HttpOptions::default_ref())
    }

    /// The client's address as the options tell it: the peer's, or behind
    /// a trusted proxy the one its forwarding header names.
    pub fn client_ip(&self) -> Option<IpAddr> {
        self.client
    }

    /// The first value of the request header `name`, if a `by = header(..)`
    /// rule of the program names it.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(_, value)| &**value)
    }
}

/// Whose budget a handler's rule charges.
#[derive(Clone, Copy, Debug)]
pub enum By {
    /// Everyone's.
    Global,
    /// The client address's.
    Ip,
    /// The value of this request header.
    Header(&'static str),
}

/// Checks one call of a handler under `site`: the key is `base` plus the
/// subject `by` names; the limiter is the site's named one, else the app's.
pub async fn check(site: &Site, base: &str, by: By, call: &HttpCall) -> Result<Pass, RateLimited> {
    let limiter = match site.limiter {
        Some(_) => site.limiter(),
        None => Some(call.limiter()),
    };
    // A named limiter that is not installed: the in-memory fallback's.
    let secret = match limiter {
        Some(limiter) => limiter.key_secret(),
        None => Ok(crate::secret::process_secret()),
    };
    let needs_secret = match by {
        By::Global => return pipeline::check_on(site, limiter, base).await,
        By::Ip => call.options().digest_ips,
        By::Header(_) => true,
    };
    let secret = match secret {
        Ok(secret) => secret,
        Err(error) if needs_secret => return Err(site.misconfigured(&error)),
        // Not read: addresses are kept as they are.
        Err(_) => &[],
    };
    let key = match by {
        By::Global => return pipeline::check_on(site, limiter, base).await,
        By::Ip => match call.options().ip_subject(
            base,
            secret,
            call.client_ip().or_else(|| {
                if call.no_peer {
                    super::no_peer();
                }
                None
            }),
        ) {
            Ok(key) => key,
            Err(()) => return Err(site.unknown_client()),
        },
        By::Header(name) => call
            .options()
            .header_key(base, secret, name, call.header(name)),
    };
    pipeline::check_on(site, limiter, &key).await
}

/// A limited handler's response: its own value (or its fallback's) with the
/// rate-limit fields of the rules the call went through, or the refusal.
/// A responder in actix-web and in axum when `T` and `F` are.
#[derive(Debug)]
pub struct Reply<T, F = NoFallback> {
    pub(crate) kind: ReplyKind<T, F>,
    /// The rate-limit fields added to the value's response.
    pub(crate) fields: Vec<Field>,
}

#[derive(Debug)]
pub(crate) enum ReplyKind<T, F> {
    Allowed(T),
    Demoted(F),
    Refused(Refusal),
}

/// The fallback type of a handler without one: no value.
#[derive(Debug)]
pub enum NoFallback {}

impl<T, F> Reply<T, F> {
    /// The handler's value, with the fields of every rule it passed.
    #[doc(hidden)]
    pub fn allowed(value: T, seen: &[Option<Report>], call: &HttpCall) -> Self {
        let fields = rate_limit_headers(call.options().headers, seen.iter().flatten());
        Reply {
            kind: ReplyKind::Allowed(value),
            fields,
        }
    }

    /// The refusal of `limited`, with the fields of the rules passed before.
    #[doc(hidden)]
    pub fn refused(limited: RateLimited, seen: &[Option<Report>], call: &HttpCall) -> Self {
        let passed: Vec<Report> = seen.iter().flatten().copied().collect();
        Reply {
            kind: ReplyKind::Refused(refusal(&limited, &passed, call.options())),
            fields: Vec::new(),
        }
    }

    /// A fallback's value for `limited`, with every rule's fields (the
    /// refusing one's included).
    #[doc(hidden)]
    pub fn demoted(
        value: F,
        limited: &RateLimited,
        seen: &[Option<Report>],
        call: &HttpCall,
    ) -> Self {
        let refusing = Report::from_refusal(limited);
        let reports = seen.iter().flatten().chain(std::iter::once(&refusing));
        Reply {
            kind: ReplyKind::Demoted(value),
            fields: rate_limit_headers(call.options().headers, reports),
        }
    }
}
