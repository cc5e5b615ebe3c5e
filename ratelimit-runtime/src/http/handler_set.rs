//! Stacked `#[rate_limit]` attributes on an HTTP handler: one decision for
//! all its rules ([`check_all`]).

use super::handler::{By, HttpCall};
use crate::decision::RateLimited;
use crate::pipeline::{self, Pass, Report};
use crate::site::Site;

/// Checks one call of a handler under several rules at once, all or
/// nothing (see [`pipeline::check_all`](crate::pipeline::check_all)): each
/// key is its `base` plus the subject its `By` names; the limiter is the
/// first rule's named one, else the app's. `seen` gets each rule's report.
///
/// # Errors
///
/// The place of the rule that refused the call, and its refusal (also a
/// client a per-client rule cannot tell, or a key secret missing).
pub async fn check_all(
    sites: &[(&Site, &str, By)],
    call: &HttpCall,
    seen: &mut [Option<Report>],
) -> Result<Vec<Pass>, (usize, RateLimited)> {
    let first = sites.first().map(|(site, _, _)| *site);
    let limiter = match first {
        Some(site) if site.limiter.is_some() => site.limiter(),
        _ => Some(call.limiter()),
    };
    // A named limiter that is not installed: the in-memory fallback's.
    let secret = match limiter {
        Some(limiter) => limiter.key_secret(),
        None => Ok(crate::secret::process_secret()),
    };
    let mut keys: Vec<String> = Vec::with_capacity(sites.len());
    for (i, &(site, base, by)) in sites.iter().enumerate() {
        let needs_secret = match by {
            By::Global => false,
            By::Ip => call.options().digest_ips,
            By::Header(_) => true,
        };
        let secret = match &secret {
            Ok(secret) => *secret,
            Err(error) if needs_secret => return Err((i, site.misconfigured(error))),
            // Not read: addresses are kept as they are.
            Err(_) => &[],
        };
        let key = match by {
            By::Global => base.to_owned(),
            By::Ip => {
                let ip = call.client_ip().or_else(|| {
                    if call.no_peer {
                        super::no_peer();
                    }
                    None
                });
                match call.options().ip_subject(base, secret, ip) {
                    Ok(key) => key,
                    Err(()) => return Err((i, site.unknown_client())),
                }
            }
            By::Header(name) => call
                .options()
                .header_key(base, secret, name, call.header(name)),
        };
        keys.push(key);
    }
    let set: Vec<(&Site, &str)> = sites
        .iter()
        .zip(&keys)
        .map(|((site, _, _), key)| (*site, key.as_str()))
        .collect();
    pipeline::check_all_on(&set, limiter, seen).await
}
