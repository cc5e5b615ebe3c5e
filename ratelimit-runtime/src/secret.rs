//! Secrets the limiter holds, and how they stay out of what it prints: the
//! key secret of the digests that stand for header values (and, if asked,
//! client addresses) in keys, and the passwords of Redis URLs.

// Without HTTP nothing is digested: the secret is kept and never read.
#![cfg_attr(not(feature = "http"), allow(dead_code))]

use std::fmt;
use std::hash::{BuildHasher, Hasher as _, RandomState};
use std::sync::Arc;
use std::sync::OnceLock;

use crate::error::Error;
use crate::log_gate::LogGate;

/// The secret of the keyed digests in keys
/// ([`keys::push_digest`](crate::keys::push_digest)). Its `Debug` says
/// where it came from, never what it is.
#[derive(Clone)]
pub(crate) enum KeySecret {
    /// The application's own (`RateLimiterBuilder::key_secret`).
    Given(Arc<[u8]>),
    /// A random one made once per process: enough for a store in process
    /// memory, which no other process reads.
    Process,
    /// None, for a store other processes share though the application set
    /// no secret (and has no `by = header(..)` attribute, or `build` would
    /// have refused): a request whose key needs a digest is refused (a
    /// random secret per process would give each instance budgets of its
    /// own in the shared store).
    Missing,
    /// The built-in public secret the application opted into
    /// (`RateLimiterBuilder::public_key_secret`): the same everywhere, so
    /// instances agree, but anyone who reads keys can test guesses.
    Public,
}

/// The built-in public secret.
const PUBLIC: &[u8] = b"ratelimit-runtime key digest v1";

impl KeySecret {
    /// The secret's bytes; [`Error::Config`] when the store is shared and
    /// no secret was chosen.
    pub(crate) fn bytes(&self) -> Result<&[u8], Error> {
        match self {
            KeySecret::Given(secret) => Ok(secret),
            KeySecret::Process => Ok(process_secret()),
            KeySecret::Missing => Err(Error::Config(MISSING.to_owned())),
            KeySecret::Public => Ok(PUBLIC),
        }
    }

    /// Whether the store is shared and no secret was chosen.
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn is_missing(&self) -> bool {
        matches!(self, KeySecret::Missing)
    }
}

/// What a missing secret is told with.
pub(crate) const MISSING: &str = "a rate limit keys by a request header (`by_header`) or by a digested \
    client address (`HttpOptions::digest_client_ips`), and the limiter keeps its budgets in \
    a store other instances share without a key secret: set RateLimiterBuilder::key_secret \
    (the same on every instance, read from your secret store or the environment), or \
    .public_key_secret(true) to accept the built-in public one. Until then such requests \
    are refused";

/// Logs `error` (a missing key secret met by a request, `what` naming the
/// rule): the first, then at most one line every
/// [`LogGate::EVERY_MS`](crate::log_gate::LogGate::EVERY_MS), with how many
/// were held back.
pub(crate) fn log_missing(error: &Error, what: &str) {
    static GATE: LogGate = LogGate::new();
    if let Some(unlogged) = GATE.admit(crate::log_gate::process_millis()) {
        tracing::error!(
            %error,
            rule = what,
            unlogged,
            "request refused (at most one line per 10 s; `unlogged`: those since the last line)"
        );
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeySecret::Given(_) => "KeySecret(given, redacted)",
            KeySecret::Process => "KeySecret(random per process)",
            KeySecret::Missing => "KeySecret(missing)",
            KeySecret::Public => "KeySecret(public built-in)",
        })
    }
}

/// 32 random bytes, made once per process: SipHash outputs under std's
/// randomly keyed `RandomState` (128 random bits from the OS).
pub(crate) fn process_secret() -> &'static [u8] {
    static SECRET: OnceLock<[u8; 32]> = OnceLock::new();
    SECRET.get_or_init(|| {
        let state = RandomState::new();
        let mut secret = [0; 32];
        for (i, chunk) in secret.chunks_mut(8).enumerate() {
            let mut hasher = state.build_hasher();
            hasher.write_usize(i);
            chunk.copy_from_slice(&hasher.finish().to_le_bytes());
        }
        secret
    })
}

/// `url` with its password (and any `password=`/`pass=` parameter) replaced
/// by `***`, to print: `redis://user:***@host:6379/`. Works on malformed
/// URLs too (everything before the last `@` but a user name is taken for
/// credentials). The crate's errors and `Debug` print URLs so.
///
/// ```
/// use ratelimit_runtime::backend::redis::redact_url;
///
/// assert_eq!(redact_url("redis://app:hunter2@db:6379/0"), "redis://app:***@db:6379/0");
/// ```
#[cfg(feature = "redis")]
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    let rest = match rest.rfind('@') {
        Some(at) => {
            match rest[..at].split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                // One word before `@`: a password written without its `:`
                // as often as a user name.
                None => out.push_str("***"),
            }
            &rest[at..]
        }
        None => rest,
    };
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((name, _))
                        if ["pass", "password"]
                            .iter()
                            .any(|n| name.eq_ignore_ascii_case(n)) =>
                    {
                        out.push_str(name);
                        out.push_str("=***");
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(rest),
    }
    out
}

/// Each of `urls` redacted, as a list to print.
#[cfg(feature = "redis")]
pub(crate) fn redact_urls(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redact_url(url)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "redis")]
    #[test]
    fn passwords_leave_urls() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            (
                "redis://user:hunter2@host:6379/0",
                "redis://user:***@host:6379/0",
            ),
            ("redis://:hunter2@host", "redis://:***@host"),
            ("rediss://hunter2@host:6380", "rediss://***@host:6380"),
            ("redis://u:p@ss:w@rd@host", "redis://u:***@host"),
            (
                "redis://u:hunter2@host:notaport",
                "redis://u:***@host:notaport",
            ),
            ("user:hunter2@host:6379", "user:***@host:6379"),
            ("redis:/u:hunter2@host", "redis:***@host"),
            (
                "redis+unix:///tmp/redis.sock?db=1&pass=hunter2",
                "redis+unix:///tmp/redis.sock?db=1&pass=***",
            ),
            ("redis://h/?Password=hunter2", "redis://h/?Password=***"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("hunter2"), "{url}");
        }
    }

    #[test]
    fn a_key_secret_never_prints() {
        let given = KeySecret::Given(Arc::from(&b"hunter2"[..]));
        for secret in [
            given,
            KeySecret::Process,
            KeySecret::Missing,
            KeySecret::Public,
        ] {
            let shown = format!("{secret:?}");
            assert!(!shown.contains("hunter2") && !shown.contains("ratelimit-runtime"));
        }
        assert_eq!(process_secret(), process_secret(), "one per process");
        assert_ne!(process_secret(), PUBLIC);
    }
}
