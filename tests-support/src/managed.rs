//! Redis as managed deployments run it: TLS with certificates made on the
//! spot, ACL users, and Sentinels watching a master and its replica.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{RedisServer, free_port};

const OPENSSL_HINT: &str =
    "install it with `apt-get install -y openssl` (./scripts/test does that when run as root)";

/// A certificate authority and a server certificate it signed (for
/// 127.0.0.1 and localhost), made with `openssl` in a folder of their own.
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
}

impl TestCa {
    /// Makes a new authority and server certificate.
    ///
    /// # Panics
    ///
    /// If `openssl` is missing (the message says how to install it) or fails.
    pub fn new() -> TestCa {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ratelimit-ca-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder for the certificates");
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("writing the extension file");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &dir,
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=ratelimit test CA",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=localhost",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        TestCa { dir }
    }

    /// The authority's certificate (PEM).
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).expect("the CA certificate")
    }

    /// A server's arguments to listen with TLS on `port`, with this
    /// authority's server certificate (clients are not asked for one).
    pub fn server_args(&self, port: u16) -> Vec<String> {
        [
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            self.path("server.crt"),
            "--tls-key-file".to_owned(),
            self.path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            self.path("ca.crt"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]
        .to_vec()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = match Command::new("openssl").args(args).current_dir(dir).output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("`openssl` was not found: {OPENSSL_HINT}")
        }
        Err(e) => panic!("could not run openssl: {e}"),
    };
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A server that also listens with TLS, on [`TlsServer::tls_port`], with a
/// certificate `ca` signed (clients are not asked for one).
#[derive(Debug)]
pub struct TlsServer {
    /// The server (its plain port too, for the harness and checks).
    pub server: RedisServer,
    tls_port: u16,
}

impl TlsServer {
    /// Starts it.
    pub fn start(ca: &TestCa) -> TlsServer {
        let tls_port = free_port();
        let args = ca.server_args(tls_port);
        let server =
            RedisServer::start_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
        TlsServer { server, tls_port }
    }

    /// `rediss://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }
}

/// A server with the ACL user `limiter`, password `s3cret` (the default
/// user stays for the harness).
pub fn acl_server() -> RedisServer {
    RedisServer::start_with_args(&["--user", "limiter", "on", ">s3cret", "~*", "&*", "+@all"])
}

/// A master, its replica, and three Sentinels watching them under the name
/// `mymaster`, quick to fail over (a master is down after 1 s).
#[derive(Debug)]
pub struct SentinelSet {
    /// The master first, then the replica.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<(Child, u16, PathBuf)>,
}

/// The name the Sentinels know the master by.
pub const MASTER_NAME: &str = "mymaster";

impl SentinelSet {
    /// Starts the servers and the Sentinels, and waits until every Sentinel
    /// knows the replica and the other Sentinels.
    ///
    /// # Panics
    ///
    /// If `redis-sentinel` is missing (the message says how to install it),
    /// or the set does not form within 30 s.
    pub fn start() -> SentinelSet {
        let master = RedisServer::start();
        let master_port = master.port().to_string();
        let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &master_port]);
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("ratelimit-sentinel-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a folder for the sentinel");
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir.display()
                ),
            )
            .expect("writing sentinel.conf");
            let child = Command::new(sentinel_bin())
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                    "`redis-sentinel` was not found: install it with `apt-get install -y \
                     redis-sentinel` (./scripts/test does that when run as root)"
                ),
                Err(e) => panic!("could not run redis-sentinel: {e}"),
            };
            sentinels.push((child, port, dir));
        }
        let set = SentinelSet {
            servers: vec![master, replica],
            sentinels,
        };
        set.wait_until_ready(Duration::from_secs(30));
        set
    }

    fn wait_until_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ready = self.sentinels.iter().all(|(_, port, _)| {
                let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
                    return false;
                };
                let Ok(mut conn) = client.get_connection() else {
                    return false;
                };
                let replicas: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(MASTER_NAME)
                    .query(&mut conn);
                let others: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(MASTER_NAME)
                    .query(&mut conn);
                replicas.is_ok_and(|r| !r.is_empty()) && others.is_ok_and(|s| s.len() == 2)
            });
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "the Sentinels did not form");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://127.0.0.1:PORT/` of each Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(_, port, _)| format!("redis://127.0.0.1:{port}/"))
            .collect()
    }

    /// The port of the server the Sentinels name master now.
    pub fn master_port(&self) -> Option<u16> {
        let (_, port, _) = &self.sentinels[0];
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
        let mut conn = client.get_connection().ok()?;
        let (_, port): (String, String) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query(&mut conn)
            .ok()?;
        port.parse().ok()
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for (child, _, dir) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `redis-sentinel`, or `$RATELIMIT_REDIS_SENTINEL`.
fn sentinel_bin() -> String {
    std::env::var("RATELIMIT_REDIS_SENTINEL").unwrap_or_else(|_| "redis-sentinel".to_owned())
}
