//! Operating the limiter: counters through the `metrics` facade, shadow mode,
//! overrides by name (environment, TOML, at run time), hostile key parts.

use std::net::Ipv4Addr;
use std::sync::LazyLock;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratelimit_runtime::overrides::{self, RuleOverride};
use ratelimit_runtime::{Error, RateLimit, RateLimited, RateLimiter, Rule, rate_limit};
use ratelimit_test_support::{RedisServer, http};

/// One recorder for this test binary (the facade's recorder is global).
static SNAPSHOTTER: LazyLock<Snapshotter> = LazyLock::new(|| {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    snapshotter
});

/// Override tests change process-wide state: one at a time (under nextest
/// each test is its own process anyway).
static OVERRIDES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Counter totals: a snapshot drains the recorder, so they are kept here.
static TOTALS: LazyLock<std::sync::Mutex<std::collections::HashMap<(String, String), u64>>> =
    LazyLock::new(Default::default);

/// `ratelimit_calls_total{rule, outcome}` as counted so far.
fn count(rule: &str, outcome: &str) -> u64 {
    let mut totals = TOTALS.lock().unwrap();
    for (key, _, _, value) in SNAPSHOTTER.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        if let (true, Some(r), Some(o), DebugValue::Counter(n)) = (
            key.name() == "ratelimit_calls_total",
            label("rule"),
            label("outcome"),
            value,
        ) {
            *totals.entry((r, o)).or_default() += n;
        }
    }
    totals
        .get(&(rule.to_owned(), outcome.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[rate_limit(key = "ops-metrics", count = 2, period = 60)]
async fn metered() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "ops-shadow", count = 1, period = 60, shadow)]
async fn shadowed() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn decisions_are_counted_per_rule_and_outcome() {
    LazyLock::force(&SNAPSHOTTER);
    for _ in 0..3 {
        let _ = metered().await;
    }
    assert_eq!(count("ops-metrics", "allowed"), 2);
    assert_eq!(count("ops-metrics", "limited"), 1);
    for _ in 0..3 {
        assert!(shadowed().await.is_ok(), "shadow rules never refuse");
    }
    assert_eq!(count("ops-shadow", "allowed"), 1);
    assert_eq!(count("ops-shadow", "shadow_limited"), 2);
}

#[rate_limit(key = "ops-deny", count = 5, period = 60, limiter = "absent", on_error = deny)]
async fn denied_when_failing() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "ops-allow", count = 5, period = 60, limiter = "absent", on_error = allow)]
async fn allowed_when_failing() -> Result<(), RateLimited> {
    Ok(())
}

/// A call the failure policy answers (here: the rule's limiter is not
/// installed) is one decision, `allowed` or `limited`, and a
/// `backend_error` besides; its refusal names the rule.
#[tokio::test]
async fn calls_the_failure_policy_answers_are_counted_as_decisions_too() {
    LazyLock::force(&SNAPSHOTTER);
    let refused = denied_when_failing().await.unwrap_err();
    assert!(refused.is_backend_failure());
    assert_eq!(
        (refused.name, refused.period),
        ("ops-deny", Duration::from_secs(60))
    );
    assert_eq!(count("ops-deny", "limited"), 1);
    assert_eq!(count("ops-deny", "backend_error"), 1);
    for _ in 0..2 {
        assert!(allowed_when_failing().await.is_ok());
    }
    assert_eq!(count("ops-allow", "allowed"), 2);
    assert_eq!(count("ops-allow", "backend_error"), 2);
}

#[rate_limit(
    key = "ops-limiter-shadow",
    count = 1,
    period = 60,
    limiter = "shadowing"
)]
async fn on_a_shadow_limiter() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_shadow_limiter_never_refuses_any_rule() {
    LazyLock::force(&SNAPSHOTTER);
    RateLimiter::builder()
        .shadow(true)
        .build()
        .await
        .unwrap()
        .install_as("shadowing")
        .unwrap();
    for _ in 0..4 {
        assert!(on_a_shadow_limiter().await.is_ok());
    }
    assert_eq!(count("ops-limiter-shadow", "shadow_limited"), 3);
}

#[rate_limit(key = "ops-override", count = 5, period = 60)]
async fn overridden() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "ops-from-file", count = 1, period = 60)]
async fn from_file() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "ops-from-env", count = 1, period = 60)]
async fn from_env() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "ops-exposed", count = 10, period = 60, cost = 5)]
async fn exposed() -> Result<(), RateLimited> {
    Ok(())
}

/// An override left below a call's cost when the source above it is
/// cleared (the environment's count 3 was accepted under code's 10; then
/// code's is cleared) gives way to the rule as written. Before, every call
/// failed the cost check and was let through unchecked: no limit at all.
#[tokio::test]
async fn an_override_left_below_the_cost_gives_way_to_the_rule() {
    let _one_at_a_time = OVERRIDES.lock().await;
    overrides::set(
        "ops-exposed",
        RuleOverride {
            count: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    overrides::load_str("ops-exposed.count=3").unwrap();
    overrides::clear("ops-exposed");
    let mut passed = 0;
    for _ in 0..10 {
        if exposed().await.is_ok() {
            passed += 1;
        }
    }
    assert_eq!(passed, 2, "10 units of the written rule, 5 a call");
}

#[tokio::test]
async fn overrides_apply_while_running_and_keep_the_state() {
    let _one_at_a_time = OVERRIDES.lock().await;
    assert!(overridden().await.is_ok());
    assert!(overridden().await.is_ok());
    // Tighten while running: the two calls made so far still count.
    overrides::set(
        "ops-override",
        RuleOverride {
            count: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(overridden().await.is_ok());
    let refused = overridden().await.unwrap_err();
    assert_eq!((refused.limit, refused.remaining), (3, 0));
    // Shadow it: the limit is recorded, nothing is refused.
    overrides::set(
        "ops-override",
        RuleOverride {
            count: Some(3),
            shadow: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(overridden().await.is_ok());
    overrides::clear("ops-override");
    // Back to 5, with 3 used: two more pass.
    assert!(overridden().await.is_ok());
    assert!(overridden().await.is_ok());
    assert!(overridden().await.is_err());
}

#[tokio::test]
async fn overrides_from_toml_and_the_environment() {
    let _one_at_a_time = OVERRIDES.lock().await;
    let path =
        std::env::temp_dir().join(format!("ratelimit-overrides-{}.toml", std::process::id()));
    std::fs::write(&path, "[rules.ops-from-file]\ncount = 3\nperiod = \"2m\"\n").unwrap();
    assert_eq!(overrides::load_toml(&path).unwrap(), 1);
    for _ in 0..3 {
        assert!(from_file().await.is_ok());
    }
    assert!(from_file().await.is_err());
    let _ = std::fs::remove_file(&path);

    assert_eq!(
        overrides::load_str("ops-from-env.count = 2; ops-from-env.period=90").unwrap(),
        1
    );
    assert!(from_env().await.is_ok());
    assert!(from_env().await.is_ok());
    assert!(from_env().await.is_err());
}

#[rate_limit(key = "ops-reloaded", count = 1, period = 60)]
async fn reloaded() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_reloaded_file_is_the_whole_truth_and_a_bad_one_changes_nothing() {
    let _one_at_a_time = OVERRIDES.lock().await;
    let path = std::env::temp_dir().join(format!("ratelimit-reload-{}.toml", std::process::id()));
    std::fs::write(&path, "[rules.ops-reloaded]\ncount = 3\n").unwrap();
    overrides::reload_toml(&path).unwrap();
    for _ in 0..3 {
        assert!(reloaded().await.is_ok());
    }
    assert!(reloaded().await.is_err());
    std::fs::write(&path, "[rules.ops-reloaded]\ncount = 0\n").unwrap();
    let error = overrides::reload_toml(&path).unwrap_err().to_string();
    assert!(
        error.contains("ops-reloaded") && error.contains("count"),
        "{error}"
    );
    assert!(reloaded().await.is_err(), "the bad file changed nothing");
    std::fs::write(&path, "[rules.ops-reloaded]\ncount = 4\n").unwrap();
    overrides::reload_toml(&path).unwrap();
    assert!(reloaded().await.is_ok(), "raised to 4 while running");
    std::fs::write(&path, "").unwrap();
    overrides::reload_toml(&path).unwrap();
    assert!(
        reloaded().await.is_err(),
        "removed from the file: back to 1"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn bad_overrides_are_start_up_errors_that_say_which_and_why() {
    let _one_at_a_time = OVERRIDES.blocking_lock();
    let unknown = overrides::load_str("no-such-rule.count=3").unwrap_err();
    let text = unknown.to_string();
    assert!(matches!(unknown, Error::Config(_)));
    assert!(
        text.contains("`no-such-rule`") && text.contains("no rule has that name"),
        "{text}"
    );
    assert!(text.contains("ops-override"), "lists the rules: {text}");

    for (bad, why) in [
        ("ops-override.count=0", "count must be between 1"),
        ("ops-override.count=many", "whole number"),
        ("ops-override.period=10 parsecs", "unknown unit"),
        (
            "ops-override.burst=5",
            "`burst` applies to token_bucket and gcra",
        ),
        ("ops-override.colour=blue", "unknown setting `colour`"),
        ("ops-override", "write name.setting=value"),
    ] {
        let text = overrides::load_str(bad).unwrap_err().to_string();
        assert!(text.contains(why), "{bad}: {text}");
    }
    // All or nothing: a good entry next to a bad one is not applied.
    assert!(overrides::load_str("ops-from-env.count=7; no-such-rule.count=1").is_err());
    assert!(!overrides::rule_names().is_empty());
}

#[rate_limit(key = "ops-costly", count = 5, period = 60, cost = 3)]
async fn costly() -> Result<(), RateLimited> {
    Ok(())
}

#[test]
fn an_override_under_a_calls_cost_is_refused_for_attribute_and_middleware() {
    let _one_at_a_time = OVERRIDES.blocking_lock();
    let count = |n| RuleOverride {
        count: Some(n),
        ..Default::default()
    };
    // A call of the attribute takes 3 units: a count of 2 would let none
    // pass (each call would be let through unchecked), so it is refused.
    let error = overrides::set("ops-costly", count(2))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`ops-costly`") && error.contains("takes 3 units"),
        "{error}"
    );
    assert!(overrides::load_str("ops-costly.count=2").is_err());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    overrides::set("ops-costly", count(3)).unwrap();
    runtime.block_on(async {
        assert!(costly().await.is_ok());
        assert!(costly().await.is_err(), "3 of 3 units used");
    });
    overrides::clear("ops-costly");

    // The middleware's cost, set after its name or before it.
    let rule = Rule::fixed_window(5, Duration::from_secs(60));
    let _named_first = RateLimit::new(rule).name("ops-mw-costly").cost(4);
    let _cost_first = RateLimit::new(rule).cost(2).name("ops-mw-cost-first");
    for (name, units) in [("ops-mw-costly", 4), ("ops-mw-cost-first", 2)] {
        let error = overrides::set(name, count(units - 1))
            .unwrap_err()
            .to_string();
        assert!(error.contains(&format!("takes {units} units")), "{error}");
        overrides::set(name, count(units)).unwrap();
        overrides::clear(name);
    }
}

#[rate_limit(key = "ops-mixed", count = 10, period = 60, algorithm = gcra)]
async fn mixed() -> Result<(), RateLimited> {
    Ok(())
}

#[test]
fn overrides_know_the_names_middleware_ends_with_and_every_rule_under_a_name() {
    let _one_at_a_time = OVERRIDES.blocking_lock();
    let rule = Rule::fixed_window(5, Duration::from_secs(60));
    let count = RuleOverride {
        count: Some(6),
        ..Default::default()
    };
    // A builder renamed: the name it had is no rule's any more.
    let _renamed = RateLimit::new(rule)
        .name("ops-first-name")
        .name("ops-last-name");
    let names = overrides::rule_names();
    assert!(names.iter().any(|n| n == "ops-last-name"), "{names:?}");
    assert!(!names.iter().any(|n| n == "ops-first-name"), "{names:?}");
    let error = overrides::set("ops-first-name", count)
        .unwrap_err()
        .to_string();
    assert!(error.contains("no rule has that name"), "{error}");

    // A clone renamed: its source is still a middleware under its own name.
    let template = RateLimit::new(rule).name("ops-template");
    let _derived = template.clone().name("ops-derived");
    for name in ["ops-template", "ops-derived"] {
        overrides::set(name, count).unwrap();
        overrides::clear(name);
    }

    // A name shared by a gcra call site and a fixed-window middleware: a
    // burst is refused, as the fixed window cannot take one (it was checked
    // against the first rule found alone, then dropped for the middleware).
    let _shared = RateLimit::new(rule).name("ops-mixed");
    let burst = RuleOverride {
        burst: Some(4),
        ..Default::default()
    };
    let error = overrides::set("ops-mixed", burst).unwrap_err().to_string();
    assert!(error.contains("this rule is fixed_window"), "{error}");
    overrides::set("ops-mixed", count).unwrap();
    overrides::clear("ops-mixed");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(runtime.block_on(mixed()).is_ok());
}

#[test]
#[should_panic(expected = "cost must be between 1 and the rule's capacity (5), not 6")]
fn a_middleware_cost_over_the_rules_capacity_is_a_start_up_panic() {
    let _ = RateLimit::new(Rule::fixed_window(5, Duration::from_secs(60))).cost(6);
}

#[test]
#[should_panic(expected = "cost must be between 1 and the rule's capacity (5), not 0")]
fn a_middleware_cost_of_zero_is_a_start_up_panic() {
    let _ = RateLimit::new(Rule::fixed_window(5, Duration::from_secs(60))).cost(0);
}

#[rate_limit(key = "user:{name}", count = 1, period = 60, limiter = "hostile")]
async fn per_name(name: String) -> Result<(), RateLimited> {
    let _ = name;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_key_parts_cannot_escape_or_bloat_the_key() {
    let redis = RedisServer::start();
    RateLimiter::builder()
        .redis(redis.url())
        .key_secret("test secret")
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
        .install_as("hostile")
        .unwrap();
    let hostile = [
        "x".repeat(1 << 20),
        "{tag}".to_owned(),
        "a*b?[c]".to_owned(),
        "line\nbreak\r\n".to_owned(),
        "colon:arg:other".to_owned(),
        "\u{0}\u{7f}é😀".to_owned(),
        String::new(),
        "plain-name".to_owned(),
    ];
    for name in &hostile {
        assert!(per_name(name.clone()).await.is_ok(), "{:.20?}", name);
        assert!(
            per_name(name.clone()).await.is_err(),
            "each value keeps its own budget"
        );
    }
    let keys = redis.keys_with_pttl("limiter:*");
    assert_eq!(keys.len(), hostile.len());
    for (key, pttl) in &keys {
        assert!(*pttl > 0);
        assert!(key.len() <= "limiter:user:".len() + 64, "{key}");
        let part = key.strip_prefix("limiter:user:").expect("in its namespace");
        assert!(
            !part.contains([':', '{', '}', '*', '?', '[', ']', '\n', '\r', ' ', '\0']),
            "{part:?}"
        );
    }
    assert!(
        keys.iter().any(|(k, _)| k == "limiter:user:plain-name"),
        "safe parts stay readable"
    );
}

/// Serves one handler on a free loopback port, one worker.
fn serve<S: actix_web::dev::HttpServiceFactory + 'static>(
    service: fn() -> S,
) -> std::net::SocketAddr {
    let server = actix_web::HttpServer::new(move || actix_web::App::new().service(service()))
        .workers(1)
        .bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    addr
}

#[rate_limit(key = "api", count = 100, period = 60, by = header("x-api-key"))]
#[actix_web::get("/api")]
async fn api() -> impl actix_web::Responder {
    "ok"
}

#[actix_web::test]
async fn a_huge_header_is_refused_by_the_server_and_changes_nothing() {
    let addr = serve(|| api);
    let one = std::net::IpAddr::V4(Ipv4Addr::LOCALHOST);
    let huge = "k".repeat(1 << 20);
    let reply = http(one, addr, "GET", "/api", &[("x-api-key", &huge)]).await;
    if let Ok(reply) = reply {
        assert!(reply.status >= 400, "{}", reply.status);
    }
    let odd = http(one, addr, "GET", "/api", &[("x-api-key", "{a}*[b]")])
        .await
        .unwrap();
    assert_eq!(odd.status, 200);
    assert_eq!(
        http(one, addr, "GET", "/api", &[]).await.unwrap().status,
        200,
        "still serving"
    );
}

/// Overrides the rule `name`'s count and period (in seconds).
fn override_count_and_period(name: &str, count: u64, period: u64) {
    let rule = RuleOverride {
        count: Some(count),
        period: Some(Duration::from_secs(period)),
        ..Default::default()
    };
    overrides::set(name, rule).unwrap();
}

#[rate_limit(key = "ops-override-headers", count = 5, period = 60)]
#[actix_web::get("/overridden")]
async fn overridden_handler() -> impl actix_web::Responder {
    "ok"
}

#[actix_web::test]
async fn headers_state_the_overridden_rule() {
    let _one_at_a_time = OVERRIDES.lock().await;
    let addr = serve(|| overridden_handler);
    let one = std::net::IpAddr::V4(Ipv4Addr::LOCALHOST);
    let get = || http(one, addr, "GET", "/overridden", &[]);
    let reply = get().await.unwrap();
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"ops-override-headers\";q=5;w=60")
    );
    override_count_and_period("ops-override-headers", 7, 90);
    let reply = get().await.unwrap();
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"ops-override-headers\";q=7;w=90"),
        "the policy is the rule in force"
    );
    overrides::clear("ops-override-headers");
    let reply = get().await.unwrap();
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"ops-override-headers\";q=5;w=60"),
        "back to the rule as written"
    );
}

/// A server whose one route is behind `limit`, with `limiter` as its app's.
fn serve_behind(limit: RateLimit, limiter: RateLimiter, workers: usize) -> std::net::SocketAddr {
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(limiter.clone())
            .wrap(limit.clone())
            .route("/", actix_web::web::get().to(|| async { "ok" }))
    })
    .workers(workers)
    .bind((Ipv4Addr::LOCALHOST, 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    addr
}

/// The middleware decides through the same pipeline as the attribute: its
/// requests are counted per rule and outcome, over real HTTP.
#[actix_web::test]
async fn middleware_decisions_are_counted_like_the_attributes() {
    LazyLock::force(&SNAPSHOTTER);
    let rule = Rule::fixed_window(2, Duration::from_secs(60));
    let limit = RateLimit::new(rule).name("ops-mw-metrics");
    let addr = serve_behind(limit, RateLimiter::in_memory(), 1);
    let one = std::net::IpAddr::V4(Ipv4Addr::LOCALHOST);
    let statuses: Vec<u16> = futures_statuses(addr, one, 3).await;
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(count("ops-mw-metrics", "allowed"), 2);
    assert_eq!(count("ops-mw-metrics", "limited"), 1);
}

async fn futures_statuses(
    addr: std::net::SocketAddr,
    from: std::net::IpAddr,
    n: usize,
) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(http(from, addr, "GET", "/", &[]).await.unwrap().status);
    }
    statuses
}

/// A middleware's global budget is its app limiter's: each app's limiter
/// has a budget of its own, shared with checks by hand of the key.
#[actix_web::test]
async fn a_middleware_global_budget_is_one_per_store_shared_with_checks_by_hand() {
    let rule = Rule::fixed_window(2, Duration::from_secs(60));
    let limit = RateLimit::new(rule).name("ops-mw-pinned");
    let one = std::net::IpAddr::V4(Ipv4Addr::LOCALHOST);
    for _ in 0..2 {
        let limiter = RateLimiter::in_memory();
        let addr = serve_behind(limit.clone(), limiter.clone(), 1);
        assert_eq!(http(one, addr, "GET", "/", &[]).await.unwrap().status, 200);
        let by_hand = limiter.check(&rule, "limiter:ops-mw-pinned").await.unwrap();
        assert_eq!(
            (by_hand.allowed, by_hand.remaining),
            (true, 0),
            "the request counted"
        );
        assert_eq!(http(one, addr, "GET", "/", &[]).await.unwrap().status, 429);
    }
}

/// A middleware keeps its rule's `RateLimit-Policy` item per worker: each
/// response still carries its own remaining count, and an override's rule
/// is stated while it is in force.
#[actix_web::test]
async fn a_middleware_states_each_response_and_the_overridden_rule() {
    let _one_at_a_time = OVERRIDES.lock().await;
    let limit = RateLimit::new(Rule::fixed_window(5, Duration::from_secs(60))).name("ops-mw-kept");
    let addr = serve_behind(limit, RateLimiter::in_memory(), 1);
    let one = std::net::IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut fields = Vec::new();
    for step in 0..4 {
        if step == 2 {
            override_count_and_period("ops-mw-kept", 9, 90);
        }
        if step == 3 {
            overrides::clear("ops-mw-kept");
        }
        let reply = http(one, addr, "GET", "/", &[]).await.unwrap();
        assert_eq!(reply.status, 200);
        let field = |name| reply.header(name).map(str::to_owned);
        fields.push((field("ratelimit-policy"), field("ratelimit")));
    }
    let policy = |i: usize| fields[i].0.as_deref().unwrap();
    let state = |i: usize| fields[i].1.as_deref().unwrap();
    assert_eq!(policy(0), "\"ops-mw-kept\";q=5;w=60");
    assert_eq!(state(0), "\"ops-mw-kept\";r=4;t=60");
    assert_eq!(policy(1), policy(0));
    assert_eq!(
        state(1),
        "\"ops-mw-kept\";r=3;t=60",
        "written for each response"
    );
    assert_eq!(policy(2), "\"ops-mw-kept\";q=9;w=90", "the override's rule");
    assert!(state(2).starts_with("\"ops-mw-kept\";r="), "{}", state(2));
    assert_eq!(policy(3), policy(0), "the rule as written again");
    assert!(state(3).starts_with("\"ops-mw-kept\";r="), "{}", state(3));
}

#[actix_web::test]
async fn a_middleware_built_before_the_server_takes_overrides_loaded_at_start_up() {
    let _one_at_a_time = OVERRIDES.lock().await;
    // Built once, before the overrides are loaded (so its name is known),
    // and cloned into the app factory: it is Send and Sync.
    let limit = RateLimit::new(Rule::fixed_window(2, Duration::from_secs(60))).name("ops-mw-early");
    overrides::load_str("ops-mw-early.count = 4").unwrap();
    // One store for both workers.
    let addr = serve_behind(limit, RateLimiter::in_memory(), 2);
    let one = std::net::IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(http(one, addr, "GET", "/", &[]).await.unwrap().status);
    }
    overrides::clear("ops-mw-early");
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 429],
        "the overridden count, 4"
    );
}

/// Backend latency (a histogram per result), coalesced batch sizes, and the
/// circuit breaker's state (a gauge), through the `metrics` facade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_batches_and_the_circuit_are_measured() {
    LazyLock::force(&SNAPSHOTTER);
    let mut redis = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(redis.url())
        .key_secret("test secret")
        .timeout(Duration::from_millis(100))
        .probe_interval(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let rule = Rule::fixed_window(100, Duration::from_secs(60));
    for _ in 0..5 {
        assert!(
            limiter
                .check(&rule, "limiter:ops-latency")
                .await
                .unwrap()
                .allowed
        );
    }
    redis.kill();
    for _ in 0..5 {
        // Answered in memory (the default policy) once Redis fails.
        limiter.check(&rule, "limiter:ops-latency").await.unwrap();
    }
    let mut latencies = std::collections::HashMap::new();
    let (mut batches, mut circuit) = (0, None);
    for (key, _, _, value) in SNAPSHOTTER.snapshot().into_vec() {
        let key = key.key();
        let result = key
            .labels()
            .find(|l| l.key() == "result")
            .map(|l| l.value().to_owned());
        match (key.name(), value) {
            ("ratelimit_backend_seconds", DebugValue::Histogram(values)) => {
                *latencies.entry(result.unwrap()).or_insert(0) += values.len();
            }
            ("ratelimit_batch_size", DebugValue::Histogram(values)) => batches += values.len(),
            ("ratelimit_circuit_open", DebugValue::Gauge(open)) => circuit = Some(open.0),
            _ => {}
        }
    }
    assert_eq!(latencies.get("ok"), Some(&5), "{latencies:?}");
    assert!(
        latencies.get("error").is_some_and(|n| *n >= 3),
        "{latencies:?}"
    );
    assert!(batches >= 5, "{batches} batches");
    assert_eq!(circuit, Some(1.0), "the circuit opened");
}
