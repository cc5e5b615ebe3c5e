//! Hierarchical quotas: an API whose every call draws on three budgets at
//! once, its API key's, its organisation's and everyone's, checked as one
//! set of rules with keys built from the request. The call passes only if
//! all three have room, and then takes from all three; a call one budget
//! refuses takes nothing from the other two. One organisation is on a
//! larger plan: its own limit, set at run time, which the organisation
//! rule reads before its count (on Redis, in the check's own script).
//!
//! `cargo run --example hierarchical` (in process memory; set `REDIS_URL`,
//! for example `redis://127.0.0.1:6379/`, to keep the budgets in Redis,
//! where the set is one script run). On Redis Cluster, give the three keys
//! one hash tag (`limiter:{api}:...`) to keep the set one atomic call.

mod support;

use std::time::Duration;

use ratelimit_runtime::{RateLimiter, Rule, SubjectLimit, Verdict};

const MINUTE: Duration = Duration::from_secs(60);

/// Each API key: 4 calls a minute.
const PER_KEY: Rule = Rule::fixed_window(4, MINUTE);
/// Each organisation, all its keys together: 6 calls a minute, unless the
/// organisation has a limit of its own (its plan's).
const PER_ORG: Rule = Rule::fixed_window(6, MINUTE).with_subject_limits();
/// The whole API: 9 calls a minute, refilled smoothly.
const GLOBAL: Rule = Rule::token_bucket(9, MINUTE);

/// What the API knows of a key: its id (the budget is the id's, so the key
/// itself is never written to the store) and its organisation.
struct Account {
    key_id: &'static str,
    org: &'static str,
}

/// The API's keys, as its database would hold them.
fn account(api_key: &str) -> Option<Account> {
    let (key_id, org) = match api_key {
        "sk-acme-ci" => ("k1", "acme"),
        "sk-acme-web" => ("k2", "acme"),
        "sk-initech" => ("k3", "initech"),
        _ => return None,
    };
    Some(Account { key_id, org })
}

/// A request, as far as the limits care: the `x-api-key` header.
struct Request {
    api_key: &'static str,
}

/// The three budgets a request draws on, each with its storage key.
fn budgets(account: &Account) -> [(&'static Rule, String); 3] {
    [
        (&PER_KEY, format!("limiter:api:key:{}", account.key_id)),
        (&PER_ORG, format!("limiter:api:org:{}", account.org)),
        (&GLOBAL, "limiter:api:global".to_owned()),
    ]
}

const NAMES: [&str; 3] = ["key", "org", "global"];

/// Checks `request` under its three rules, all or nothing.
async fn handle(limiter: &RateLimiter, request: &Request) -> Result<String, String> {
    let account = account(request.api_key).ok_or("401: unknown API key")?;
    let budgets = budgets(&account);
    let set: Vec<(&Rule, &str, u64)> = budgets
        .iter()
        .map(|(rule, key)| (*rule, key.as_str(), 1))
        .collect();
    let verdict = limiter
        .check_all(&set)
        .await
        .map_err(|error| format!("503: {error}"))?;
    let left = left(&verdict);
    match verdict.refused() {
        None => Ok(format!("200 ({left})")),
        Some(rule) => {
            let limited = verdict.rate_limited().expect("a refused verdict");
            Err(format!(
                "429 by the {} rule, retry in {} s ({left}: nothing taken)",
                NAMES[rule],
                limited.retry_after_secs()
            ))
        }
    }
}

/// Each budget's units left, as the verdict says them.
fn left(verdict: &Verdict) -> String {
    NAMES
        .iter()
        .zip(verdict.decisions())
        .map(|(name, decision)| format!("{name} {}", decision.remaining))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::main]
async fn main() -> Result<(), support::Failure> {
    support::init_logs();
    let (limiter, backend) = support::limiter().await?;
    println!("budgets in {backend}");
    println!("per key 4/min, per organisation 6/min (initech 8/min), global 9/min\n");
    // initech's plan: 8 calls a minute for the organisation. Kept with the
    // budgets (on Redis, a hash every instance reads); `None` clears it.
    let initech = budgets(&account("sk-initech").expect("a known key"));
    limiter
        .set_subject_limit(&PER_ORG, &initech[1].1, Some(SubjectLimit::new(8)))
        .await?;
    // Whole budgets to begin with (an earlier run may have left some spent
    // in Redis).
    for api_key in ["sk-acme-ci", "sk-acme-web", "sk-initech"] {
        for (rule, key) in budgets(&account(api_key).expect("a known key")) {
            limiter.reset(rule, &key).await?;
        }
    }

    let requests = [
        // acme's CI spends its key's 4, then its key refuses.
        ("sk-acme-ci", 5),
        // acme's web app: the organisation has 2 left for it.
        ("sk-acme-web", 3),
        // initech: the global budget has 3 left (acme's refused calls took
        // none of it), then the global rule refuses.
        ("sk-initech", 4),
        ("sk-unknown", 1),
    ];
    for (api_key, calls) in requests {
        println!("{api_key}:");
        for call in 1..=calls {
            let answer = handle(&limiter, &Request { api_key }).await;
            match answer {
                Ok(text) | Err(text) => println!("  call {call}: {text}"),
            }
        }
    }
    Ok(())
}
