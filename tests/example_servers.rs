//! The example servers as the README runs them, over real TCP: the README's
//! `curl` loop answers 200 200 200 429; with `RATELIMIT_OVERRIDES_FILE`
//! and `RATELIMIT_OVERRIDES` both set, both apply (the variable's over the
//! file's), to the attribute's rules and to the middleware's or layer's.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ratelimit_test_support::{first_ok, free_port, http};

const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A running example server, stopped when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the example `name` on a free port with `envs`, and waits until
/// it answers.
async fn start(name: &str, envs: &[(&str, &str)]) -> Server {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let child = Command::new(common::example_binary(name))
        .env("BIND", addr.to_string())
        .env_remove("REDIS_URL")
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    let server = Server { child, addr };
    first_ok(
        "the example server never answered",
        Duration::from_millis(50),
        || async move { http(CLIENT, addr, "GET", "/limitTest", &[]).await.map(drop) },
    )
    .await;
    server
}

/// The statuses of `n` GETs of `path`.
async fn statuses(server: &Server, path: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        let reply = http(CLIENT, server.addr, "GET", path, &[]).await.unwrap();
        statuses.push(reply.status);
    }
    statuses
}

/// Runs `name` as the README does, then with both sources of overrides:
/// the file lowers `/limitTest3` and `/limitTest4` to 1, the variable
/// raises `/limitTest3` to 2 (it wins) and lowers the rule `mw_rule` of the
/// middleware or layer on `mw_path` to 2.
async fn serves_as_the_readme_says(name: &str, mw_rule: &str, mw_path: &str) {
    {
        let server = start(name, &[]).await;
        assert_eq!(
            statuses(&server, "/limitTest3", 4).await,
            [200, 200, 200, 429],
            "{name}"
        );
    }

    let dir = std::env::temp_dir().join(format!("ratelimit-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        "[rules.ip_limit_test]\ncount = 1\n\n[rules.demote_test]\ncount = 1\n",
    )
    .unwrap();
    let overrides = format!("ip_limit_test.count=2; {mw_rule}.count=2");
    let server = start(
        name,
        &[
            ("RATELIMIT_OVERRIDES_FILE", file.to_str().unwrap()),
            ("RATELIMIT_OVERRIDES", &overrides),
        ],
    )
    .await;
    assert_eq!(
        statuses(&server, "/limitTest3", 3).await,
        [200, 200, 429],
        "{name}: the variable's count (2) over the file's (1)"
    );
    assert_eq!(
        statuses(&server, "/limitTest4", 2).await,
        [200, 429],
        "{name}: the file's count (1)"
    );
    assert_eq!(
        statuses(&server, mw_path, 3).await,
        [200, 200, 429],
        "{name}: the variable's count (2) for `{mw_rule}`"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actix_server_serves_as_the_readme_says() {
    serves_as_the_readme_says("actix_server", "bench_mw", "/bench/middleware").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_axum_server_serves_as_the_readme_says() {
    serves_as_the_readme_says("axum_server", "layer", "/layer/limitTest2").await;
}
