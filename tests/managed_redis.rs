//! Redis as teams run it, against real servers the tests start: TLS with a
//! certificate authority made on the spot (and a wrong one), an ACL user
//! (and a wrong password), Sentinels that fail a killed master over, and a
//! client, connection manager or cluster client of the user's own.

use std::time::{Duration, Instant};

use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend, RedisTarget};
use ratelimit_runtime::{Backend, Error, OnError, RateLimiter, Rule};
use ratelimit_test_support::{
    MASTER_NAME, RedisCluster, RedisServer, SentinelSet, TestCa, TlsServer, acl_server, first_ok,
};

const RULE: Rule = Rule::fixed_window(10, Duration::from_secs(120));

/// Three checks of `key` leave 7, 6, 5 of 10: each counted once, in Redis.
async fn counts(limiter: &RateLimiter, key: &str) {
    for left in [9, 8, 7] {
        let decision = limiter.check(&RULE, key).await.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, left, "{key}");
    }
}

/// A limiter that refuses rather than count in memory when Redis fails, so
/// a passing check was Redis's.
fn builder() -> ratelimit_runtime::RateLimiterBuilder {
    RateLimiter::builder()
        .timeout(Duration::from_secs(2))
        .on_backend_error(OnError::Deny)
}

#[tokio::test]
async fn tls_with_the_servers_authority_counts_and_a_wrong_one_fails_build() {
    let ca = TestCa::new();
    let server = TlsServer::start(&ca);
    let limiter = builder()
        .redis(RedisTarget::from(server.url()).tls_root_certificate(ca.ca_pem()))
        .build()
        .await
        .expect("a TLS connection");
    counts(&limiter, "limiter:tls").await;
    // The count is in the server (read on its plain port).
    assert!(server.server.stored_state("limiter:tls").is_some());

    let wrong = TestCa::new();
    let error = builder()
        .redis(RedisTarget::from(server.url()).tls_root_certificate(wrong.ca_pem()))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("a certificate of another authority");
    let message = error.to_string();
    assert!(
        message.contains("certificate") && message.contains(&server.tls_port().to_string()),
        "{message}"
    );
}

#[tokio::test]
async fn an_acl_user_counts_and_a_wrong_password_fails_build_clearly() {
    let server = acl_server();
    let url = |password: &str| format!("redis://limiter:{password}@127.0.0.1:{}/", server.port());
    let limiter = builder().redis(url("s3cret")).build().await.unwrap();
    counts(&limiter, "limiter:acl").await;

    for lazy in [false, true] {
        let error = builder()
            .redis(url("wrong"))
            .start_degraded(lazy)
            .build()
            .await
            .expect_err("a wrong password");
        let message = error.to_string();
        assert!(
            matches!(error, Error::Config(_)) && message.contains("credentials"),
            "a wrong password is not Redis being down (degraded start: {lazy}): {error:?}"
        );
    }
}

/// A Sentinel client of the test's own (`SentinelClient`, the way to give
/// the master's password, database or TLS) for the master of `set`.
fn sentinel_client(set: &SentinelSet) -> redis::sentinel::SentinelClient {
    redis::sentinel::SentinelClient::build(
        set.sentinel_urls(),
        MASTER_NAME,
        None,
        redis::sentinel::SentinelServerType::Master,
    )
    .unwrap()
}

/// Both ways to name Sentinels: the backend by `RedisTarget::sentinel`, the
/// limiter by a `SentinelClient`; each follows the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_fail_over_and_the_limiter_follows_the_new_master() {
    let mut set = SentinelSet::start();
    let old_master = set.servers[0].port();
    let options = ConnectOptions {
        timeout: Duration::from_millis(500),
        ..ConnectOptions::default()
    };
    let redis = RedisBackend::connect(
        RedisTarget::sentinel(MASTER_NAME, set.sentinel_urls()),
        options,
    )
    .await
    .unwrap();
    let limiter = builder()
        .redis(sentinel_client(&set))
        .timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    counts(&limiter, "limiter:sentinel").await;
    // Let the replica catch up, then kill the master.
    let replicated = Instant::now() + Duration::from_secs(5);
    while set.servers[1].stored_state("limiter:sentinel").is_none() {
        assert!(
            Instant::now() < replicated,
            "the replica never had the count"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set.servers[0].kill();
    let killed = Instant::now();
    // The backend follows the promoted replica, with its count.
    loop {
        match redis.check(&RULE, "limiter:sentinel", 1).await {
            Ok(decision) => {
                assert_eq!(decision.remaining, 10 - 3 - 1, "{decision:?}");
                break;
            }
            Err(_) => {
                assert!(
                    killed.elapsed() < Duration::from_secs(30),
                    "no failover in 30 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_ne!(set.master_port(), Some(old_master), "a replica took over");
    // And so does the limiter, on the same count.
    let decision = first_ok("the limiter stayed off", Duration::from_millis(100), || {
        limiter.check(&RULE, "limiter:sentinel")
    })
    .await;
    assert_eq!(decision.remaining, 10 - 3 - 2, "{decision:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connection_manager_or_cluster_client_of_your_own() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let from_client = builder().redis(client.clone()).build().await.unwrap();
    counts(&from_client, "limiter:own-client").await;

    let manager = client.get_connection_manager().await.unwrap();
    let from_manager = builder().redis(manager).build().await.unwrap();
    counts(&from_manager, "limiter:own-manager").await;

    let cluster = RedisCluster::start();
    let cluster_client = redis::cluster::ClusterClient::builder(cluster.urls())
        .retries(0)
        .build()
        .unwrap();
    let from_cluster = builder().redis(cluster_client).build().await.unwrap();
    counts(&from_cluster, "limiter:own-cluster").await;
}

/// Every spelling of a list of a cluster's nodes (an array, a slice, a
/// `Vec`, references to them) reaches the cluster, and one URL (`&str`,
/// `&String`) one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_url_or_a_node_list_connects() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let array = builder()
        .redis([urls[0].as_str(), urls[1].as_str()])
        .build()
        .await
        .unwrap();
    counts(&array, "limiter:nodes-array").await;
    let slice = builder().redis(&urls[..]).build().await.unwrap();
    counts(&slice, "limiter:nodes-slice").await;
    let vec_ref = builder().redis(&urls).build().await.unwrap();
    counts(&vec_ref, "limiter:nodes-vec-ref").await;
    let array_ref = builder()
        .redis(&[urls[1].clone(), urls[2].clone()])
        .build()
        .await
        .unwrap();
    counts(&array_ref, "limiter:nodes-array-ref").await;
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    let backend = RedisBackend::connect(urls.clone(), options).await.unwrap();
    let decision = backend.check(&RULE, "limiter:nodes-vec", 1).await.unwrap();
    assert_eq!(decision.remaining, 9);
    for key in [
        "limiter:nodes-array",
        "limiter:nodes-slice",
        "limiter:nodes-vec-ref",
        "limiter:nodes-array-ref",
        "limiter:nodes-vec",
    ] {
        assert_eq!(cluster.keys_with_pttl(key).len(), 1, "{key} in the cluster");
    }

    let server = RedisServer::start();
    let url = server.url();
    let by_str = builder().redis(url.as_str()).build().await.unwrap();
    counts(&by_str, "limiter:url-str").await;
    let by_ref = RedisBackend::connect(&url, options).await.unwrap();
    assert_eq!(
        by_ref
            .check(&RULE, "limiter:url-ref", 1)
            .await
            .unwrap()
            .remaining,
        9
    );
    for key in ["limiter:url-str", "limiter:url-ref"] {
        assert!(server.stored_state(key).is_some(), "{key} in the server");
    }
}

/// A Redis Cluster over TLS (`rediss://` nodes, a private authority, given
/// to the target itself): the limiter learns the nodes' TLS endpoints and
/// counts on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_counts() {
    let ca = TestCa::new();
    let (_cluster, tls_ports) = RedisCluster::start_tls(&ca);
    let urls: Vec<String> = tls_ports
        .iter()
        .map(|port| format!("rediss://127.0.0.1:{port}/"))
        .collect();
    let limiter = builder()
        .redis(RedisTarget::from(urls).tls_root_certificate(ca.ca_pem()))
        .build()
        .await
        .expect("a TLS cluster connection");
    for n in 0..8 {
        counts(&limiter, &format!("limiter:tls-cluster:{n}")).await;
    }
}
