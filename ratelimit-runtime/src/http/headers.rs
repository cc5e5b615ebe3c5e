//! What limited responses carry: the IETF draft's `RateLimit-Policy` and
//! `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers, as Structured
//! Field lists), the widely deployed `X-RateLimit-*`, and for a refusal its
//! status, `Retry-After` and body.

use std::time::Duration;

use ::http::StatusCode;

use super::{HeaderStyle, HttpOptions};
use crate::decision::{Cause, RateLimited};
use crate::pipeline::Report;

/// A header field for a response: its name and its value, for any
/// framework's header types without parsing the name or copying the value
/// (`HeaderName::from_static`, a value from the string's bytes). The
/// crate's own names are lowercase; an app's (in a [`Refusal`]) may be in
/// any case and are sent lowercase.
pub(crate) type Field = (&'static str, String);

/// Whether `name` is a field name the `http` crates take as it is (their
/// `from_static`, which panics on anything else): lowercase letters,
/// digits and `-`.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Says once that a field of an app's refusal could not be sent (its
/// fields are checked when configured, so only one its closure makes for
/// some refusals only can get here).
#[cold]
pub(crate) fn bad_field(name: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::error!(
            field = name,
            "a refusal's header field is not a valid name or value; it was left out (logged once)"
        );
    }
}

/// The draft's policy field: each rule's limit and window.
pub(crate) const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// The draft's state field: each rule's remaining units and reset.
pub(crate) const RATELIMIT: &str = "ratelimit";
const X_LIMIT: &str = "x-ratelimit-limit";
const X_REMAINING: &str = "x-ratelimit-remaining";
const X_RESET: &str = "x-ratelimit-reset";
const RETRY_AFTER: &str = "retry-after";
const CONTENT_TYPE: &str = "content-type";

/// Every field name this module writes, for adapters that keep their own
/// header names made once.
#[cfg(any(feature = "actix", feature = "tower"))]
pub(crate) const FIELD_NAMES: [&str; 7] = [
    RATELIMIT_POLICY,
    RATELIMIT,
    X_LIMIT,
    X_REMAINING,
    X_RESET,
    RETRY_AFTER,
    CONTENT_TYPE,
];

/// The rate-limit header fields, in `style`, for the rules a call went
/// through (none for no report).
pub(crate) fn rate_limit_headers<'a>(
    style: HeaderStyle,
    reports: impl IntoIterator<Item = &'a Report> + Clone,
) -> Vec<Field> {
    let mut fields = Vec::new();
    let draft = matches!(style, HeaderStyle::Draft | HeaderStyle::Both);
    let legacy = matches!(style, HeaderStyle::Legacy | HeaderStyle::Both);
    if !draft && !legacy {
        return fields;
    }
    let Some(tightest) = reports
        .clone()
        .into_iter()
        .min_by_key(|r| (r.remaining, std::cmp::Reverse(r.reset_after)))
    else {
        return fields;
    };
    fields.reserve(2 * usize::from(draft) + 3 * usize::from(legacy));
    if draft {
        let policy = sf_list(reports.clone(), |r| [("q", r.limit), ("w", window(r))]);
        let state = sf_list(reports, |r| {
            [("r", r.remaining), ("t", secs_up(r.reset_after))]
        });
        fields.push((RATELIMIT_POLICY, policy));
        fields.push((RATELIMIT, state));
    }
    if legacy {
        // One set of numbers: the rule closest to refusing.
        fields.push((X_LIMIT, decimal(tightest.limit)));
        fields.push((X_REMAINING, decimal(tightest.remaining)));
        fields.push((X_RESET, decimal(secs_up(tightest.reset_after))));
    }
    fields
}

fn decimal(n: u64) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

/// A refusal as an HTTP response, for any framework to send.
#[derive(Clone, Debug)]
pub struct Refusal {
    /// `429 Too Many Requests`; `503` when the backend failed under `deny`;
    /// `400` when a per-client rule cannot tell who the client is.
    pub status: StatusCode,
    /// `Content-Type`, `Retry-After` and the rate-limit fields.
    pub headers: Vec<Field>,
    /// Plain text, or JSON ([`HttpOptions::json_body`]).
    pub body: String,
}

/// The response for `limited`, with the rate-limit fields of `passed` (the
/// rules the call went through before it) and of the refusing rule.
pub(crate) fn refusal(limited: &RateLimited, passed: &[Report], options: &HttpOptions) -> Refusal {
    let Some(custom) = &options.refusal else {
        return standard(limited, passed, options);
    };
    let mut refusal = custom.build(limited);
    if custom.standard_headers {
        // `Retry-After` and the rate-limit fields, unless it set them.
        let fields = standard(limited, passed, options).headers;
        for (name, value) in fields {
            if name != CONTENT_TYPE
                && !refusal
                    .headers
                    .iter()
                    .any(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                refusal.headers.push((name, value));
            }
        }
    }
    refusal
}

/// A refusal the app builds itself, from the `RateLimited`
/// ([`HttpOptions::on_refusal`]).
#[derive(Clone)]
pub(crate) struct CustomRefusal {
    build: std::sync::Arc<dyn Fn(&RateLimited) -> Refusal + Send + Sync>,
    /// Whether `Retry-After` and the rate-limit fields are added to it.
    pub(crate) standard_headers: bool,
}

impl CustomRefusal {
    pub(crate) fn new(
        build: impl Fn(&RateLimited) -> Refusal + Send + Sync + 'static,
        standard_headers: bool,
    ) -> CustomRefusal {
        CustomRefusal {
            build: std::sync::Arc::new(build),
            standard_headers,
        }
    }

    fn build(&self, limited: &RateLimited) -> Refusal {
        (self.build)(limited)
    }

    /// Builds the refusal of each cause once and checks its fields: a name
    /// in any case, a value that can be sent.
    pub(crate) fn check(&self) -> Result<(), crate::error::Error> {
        let over = RateLimited::from_decision(&crate::decision::Decision {
            allowed: false,
            limit: 1,
            remaining: 0,
            reset_after: Duration::from_secs(1),
            retry_after: Duration::from_secs(1),
        });
        for limited in [
            over,
            RateLimited::backend_unavailable(1),
            RateLimited::unknown_client(1),
            RateLimited::misconfigured(1),
        ] {
            let limited = limited.with_rule(Duration::from_secs(1), "on_refusal");
            for (name, value) in self.build(&limited).headers {
                if ::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(crate::error::Error::Config(format!(
                        "on_refusal: {name:?} is not a header field name (letters, digits \
                         and !#$%&'*+-.^_`|~, in any case)"
                    )));
                }
                if ::http::HeaderValue::try_from(value).is_err() {
                    return Err(crate::error::Error::Config(format!(
                        "on_refusal: the value of the field {name:?} cannot be sent (a line \
                         break or another control character)"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for CustomRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomRefusal")
            .field("standard_headers", &self.standard_headers)
            .finish_non_exhaustive()
    }
}

/// The crate's own refusal.
fn standard(limited: &RateLimited, passed: &[Report], options: &HttpOptions) -> Refusal {
    let status = match limited.cause {
        Cause::OverLimit => StatusCode::TOO_MANY_REQUESTS,
        Cause::BackendUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Cause::UnknownClient => StatusCode::BAD_REQUEST,
        Cause::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let retry = limited.retry_after_secs();
    let (code, text) = match limited.cause {
        Cause::OverLimit => (
            "too_many_requests",
            format!("Too Many Requests: try again in {retry} s\n"),
        ),
        Cause::BackendUnavailable => (
            "rate_limiter_unavailable",
            "Service Unavailable: the rate limiter cannot decide; try again later\n".to_owned(),
        ),
        Cause::UnknownClient => (
            "unknown_client",
            "Bad Request: cannot tell who the client is\n".to_owned(),
        ),
        Cause::Misconfigured => (
            "rate_limiter_misconfigured",
            "Internal Server Error: the rate limiter is misconfigured (see the server's log)\n"
                .to_owned(),
        ),
    };
    let mut headers = Vec::new();
    let body = if options.json {
        headers.push((CONTENT_TYPE, "application/json".to_owned()));
        format!(
            "{{\"error\":\"{code}\",\"retry_after\":{retry},\"limit\":{},\"remaining\":{}}}",
            limited.limit, limited.remaining
        )
    } else {
        headers.push((CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()));
        text
    };
    if !matches!(limited.cause, Cause::UnknownClient | Cause::Misconfigured) {
        headers.push((RETRY_AFTER, decimal(retry)));
    }
    let refusing = (limited.cause == Cause::OverLimit).then(|| Report::from_refusal(limited));
    headers.extend(rate_limit_headers(
        options.headers,
        passed.iter().chain(refusing.as_ref()),
    ));
    Refusal {
        status,
        headers,
        body,
    }
}

/// A report's window in whole seconds, at least 1 (the draft's `w`).
fn window(report: &Report) -> u64 {
    secs_up(report.period).max(1)
}

fn secs_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A Structured Field list: each report's name as a string with two integer
/// parameters (`"api";q=100;w=60, ...`).
///
/// Rendered in a per-thread buffer and copied once into a string of exactly
/// its length: the `http` crates take such a string as the value's bytes
/// without a second allocation.
fn sf_list<'a>(
    reports: impl IntoIterator<Item = &'a Report>,
    params: impl Fn(&Report) -> [(&'static str, u64); 2],
) -> String {
    thread_local! {
        static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut out) => {
            out.clear();
            push_sf_list(&mut out, reports, params);
            out.as_str().to_owned()
        }
        Err(_) => {
            let mut out = String::new();
            push_sf_list(&mut out, reports, params);
            out
        }
    })
}

fn push_sf_list<'a>(
    out: &mut String,
    reports: impl IntoIterator<Item = &'a Report>,
    params: impl Fn(&Report) -> [(&'static str, u64); 2],
) {
    let mut digits = itoa::Buffer::new();
    for (i, report) in reports.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_sf_string(out, report.name);
        for (name, value) in params(report) {
            out.push(';');
            out.push_str(name);
            out.push('=');
            out.push_str(digits.format(value));
        }
    }
}

/// A Structured Field string: `"` and `\` escaped, anything but printable
/// ASCII replaced by `?`.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    if name
        .bytes()
        .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
    {
        out.push_str(name);
        out.push('"');
        return;
    }
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(
        name: &'static str,
        limit: u64,
        period: Duration,
        remaining: u64,
        reset: Duration,
    ) -> Report {
        Report {
            name,
            limit,
            period,
            remaining,
            reset_after: reset,
        }
    }

    #[test]
    fn draft_headers_are_structured_field_lists() {
        let reports = [
            report(
                "burst",
                10,
                Duration::from_millis(1500),
                3,
                Duration::from_millis(200),
            ),
            report(
                "say \"hi\"",
                1000,
                Duration::from_secs(3600),
                999,
                Duration::from_secs(3599),
            ),
            report("naïve\\", u64::MAX, Duration::ZERO, 5, Duration::ZERO),
        ];
        let mut rendered: Vec<(String, String)> = rate_limit_headers(HeaderStyle::Both, &reports)
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v))
            .collect();
        rendered.sort();
        let mut expected = [
            (
                "ratelimit-policy",
                r#""burst";q=10;w=2, "say \"hi\"";q=1000;w=3600, "na?ve\\";q=18446744073709551615;w=1"#,
            ),
            (
                "ratelimit",
                r#""burst";r=3;t=1, "say \"hi\"";r=999;t=3599, "na?ve\\";r=5;t=0"#,
            ),
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()));
        expected.sort();
        assert_eq!(rendered, expected);
    }

    #[test]
    fn no_report_no_field_and_style_none_sends_none() {
        let one = [report(
            "a",
            1,
            Duration::from_secs(1),
            0,
            Duration::from_secs(1),
        )];
        assert!(rate_limit_headers(HeaderStyle::Draft, &[]).is_empty());
        assert!(rate_limit_headers(HeaderStyle::None, &one).is_empty());
        assert_eq!(rate_limit_headers(HeaderStyle::Legacy, &one).len(), 3);
    }
}
