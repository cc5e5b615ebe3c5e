//! The Redis user the README gives (its `ACL SETUSER` line, read from the
//! README itself) may do all the limiter does: every algorithm, leases,
//! stacked rules, give-backs, resets, waiting turns, local quotas, limits
//! per subject and fleet-wide overrides, on one server and on a cluster.
//! Redis logs every command it refuses (`ACL LOG`); that log stays empty.

use std::time::Duration;

use ratelimit_runtime::backend::redis::RedisTarget;
use ratelimit_runtime::{Algorithm, RateLimiter, Rule, SubjectLimit};
use ratelimit_test_support::{RedisCluster, RedisServer, calls_of};

/// The README's `ACL SETUSER` line, split into arguments, with the
/// password `password` as the test's.
fn readme_acl() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("the README");
    let line = readme
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("ACL SETUSER limiter "))
        .expect("an `ACL SETUSER limiter ..` line in the README");
    line.split_whitespace()
        .skip(1)
        .map(|arg| match arg {
            ">password" => ">s3cret".to_owned(),
            other => other.to_owned(),
        })
        .collect()
}

/// Makes the README's user on the node `connection` talks to.
fn make_user(connection: &mut redis::Connection) {
    let _: () = redis::cmd("ACL")
        .arg(readme_acl())
        .query(connection)
        .expect("the README's ACL SETUSER line");
}

/// What the node refused the README's user: `ACL LOG` entries, as text.
fn refused(connection: &mut redis::Connection) -> Vec<String> {
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query(connection)
        .expect("ACL LOG");
    log.iter().map(|entry| format!("{entry:?}")).collect()
}

/// `url` with the README's user and the test's password.
fn as_user(url: &str) -> String {
    url.replacen("redis://", "redis://limiter:s3cret@", 1)
}

const PERIOD: Duration = Duration::from_secs(60);

/// Every feature that sends a command to Redis, once or twice each; every
/// call must succeed (a refused command would fail it, and show in the log).
async fn exercise(limiter: &RateLimiter) {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let rule = Rule::new(algorithm, 2, PERIOD);
        let key = format!("limiter:acl:{algorithm:?}");
        let first = limiter.check(&rule, &key).await.unwrap();
        assert!(first.allowed, "{algorithm:?}");
        limiter.peek(&rule, &key).await.unwrap();
        let permit = limiter.acquire(&rule, &key, 1).await.unwrap();
        let charge = permit.charge().expect("a charge to give back");
        limiter.refund(&rule, &key, charge).await.unwrap();
        limiter.reset(&rule, &key).await.unwrap();
    }

    let leases = Rule::concurrency(1, PERIOD);
    let held = limiter
        .acquire(&leases, "limiter:acl:lease", 1)
        .await
        .unwrap();
    assert!(held.decision().allowed);
    held.release().await.unwrap();

    let (a, b) = (Rule::fixed_window(5, PERIOD), Rule::sliding_log(5, PERIOD));
    let set = limiter
        .check_all(&[(&a, "limiter:acl:set:a", 1), (&b, "limiter:acl:set:b", 1)])
        .await
        .unwrap();
    assert!(set.allowed());

    let paced = Rule::gcra(1, PERIOD);
    limiter
        .until_ready(&paced, "limiter:acl:paced", 1, Duration::ZERO)
        .await
        .unwrap();

    let blocks = Rule::fixed_window(100, PERIOD).with_local_quota(10);
    assert!(
        limiter
            .check(&blocks, "limiter:acl:blocks")
            .await
            .unwrap()
            .allowed
    );

    let plan = Rule::fixed_window(2, PERIOD).with_subject_limits();
    limiter
        .set_subject_limit(&plan, "limiter:acl:tenant", Some(SubjectLimit::new(5)))
        .await
        .unwrap();
    let own = limiter.check(&plan, "limiter:acl:tenant").await.unwrap();
    assert_eq!(own.limit, 5, "the subject's own limit was read");
}

/// A limiter as the README's user, with fleet-wide overrides on (read at
/// once when built).
async fn limiter(target: impl Into<RedisTarget>) -> RateLimiter {
    RateLimiter::builder()
        .redis(target)
        .timeout(Duration::from_secs(2))
        .fleet_overrides(true)
        .build()
        .await
        .expect("the README's user may build a limiter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_user_may_do_all_the_limiter_does() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    make_user(&mut admin);
    let limiter = limiter(as_user(&server.url())).await;
    exercise(&limiter).await;
    assert!(calls_of(&mut admin, "fcall") > 0, "checks went by FCALL");
    assert_eq!(refused(&mut admin), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_user_may_do_all_the_limiter_does_on_a_cluster() {
    let cluster = RedisCluster::start();
    for node in &cluster.nodes {
        make_user(&mut node.connection());
    }
    let urls: Vec<String> = cluster.urls().iter().map(|url| as_user(url)).collect();
    let limiter = limiter(urls).await;
    exercise(&limiter).await;
    for node in &cluster.nodes {
        assert_eq!(
            refused(&mut node.connection()),
            Vec::<String>::new(),
            "node {}",
            node.port()
        );
    }
}
