//! Support for this workspace's tests, examples and benches: real
//! `redis-server` processes started on free ports, and a plain HTTP/1.1
//! client that can choose its source address. Not published.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cargo;
mod managed;
mod migration;
mod proxy;
mod stats;
pub use cargo::cargo;
pub use managed::{MASTER_NAME, SentinelSet, TestCa, TlsServer, acl_server};
pub use migration::Migration;
pub use proxy::Proxy;
pub use stats::{calls_of, command_stat, script_calls};

/// Where to find `redis-server`: `$RATELIMIT_REDIS_SERVER`, else `redis-server` on `PATH`.
fn redis_server_bin() -> String {
    std::env::var("RATELIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

const INSTALL_HINT: &str = "install it with `apt-get install -y redis-server` \
    (./scripts/test does that when run as root), or point RATELIMIT_REDIS_SERVER at the binary";

/// A `redis-server` of our own on a free loopback port, with no persistence.
/// Killed when dropped (also when the test panics).
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If `redis-server` is not installed (the message says how to install
    /// it), or no server answers within 10 s.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[], free_port)
    }

    /// Starts a server with extra arguments.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_with(extra, free_port)
    }

    /// Starts a server with extra arguments, on a port `pick_port` chooses.
    fn start_with(extra: &[&str], pick_port: fn() -> u16) -> RedisServer {
        let mut last_error = String::new();
        for _ in 0..5 {
            match RedisServer::try_start(pick_port(), extra) {
                Ok(server) => return server,
                Err(error) => last_error = error,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// Starts a server again on the port it had (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.restart_with_args(&[]);
    }

    /// Kills the server and starts one with extra arguments on its port
    /// (`--rename-command FCALL ""`: a server without a command).
    ///
    /// # Panics
    ///
    /// If no server answers on the port within 10 s.
    pub fn restart_with_args(&mut self, extra: &[&str]) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match RedisServer::try_start(self.port, extra) {
                Ok(mut server) => {
                    // Swap the new process in; the old handle (same port, same
                    // folder) must not delete what the new one uses.
                    std::mem::swap(self, &mut server);
                    std::mem::forget(server);
                    return;
                }
                Err(error) if Instant::now() > deadline => {
                    panic!("could not restart redis-server: {error}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Stops the process (SIGSTOP): it keeps its connections but answers nothing.
    pub fn pause(&self) {
        signal(self.child.id(), "STOP");
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        signal(self.child.id(), "CONT");
    }

    fn try_start(port: u16, extra: &[&str]) -> Result<RedisServer, String> {
        let dir =
            std::env::temp_dir().join(format!("ratelimit-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // RATELIMIT_REDIS_CPUS pins the server (benchmarks): taskset -c CPUS.
        let mut command = match std::env::var("RATELIMIT_REDIS_CPUS") {
            Ok(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpus]).arg(redis_server_bin());
                c
            }
            Err(_) => Command::new(redis_server_bin()),
        };
        let child = command
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("`{}` was not found: {INSTALL_HINT}", redis_server_bin())
            }
            Err(e) => panic!("could not run `{}`: {e}", redis_server_bin()),
        };
        let mut server = RedisServer { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = server.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = server.child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                return Err(format!(
                    "redis-server exited ({status}) on port {port}: {stderr}"
                ));
            }
            if ping(port) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "redis-server on port {port} did not answer PING within 10 s"
        ))
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The URL of a new user (password `secret`) who may do everything but
    /// `denied` (an ACL rule such as "-function" or "-fcall").
    pub fn user_url(&self, user: &str, denied: &str) -> String {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(">secret")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg(denied)
            .query(&mut self.connection())
            .expect("ACL SETUSER on the test redis-server");
        format!("redis://{user}:secret@127.0.0.1:{}", self.port)
    }

    /// A plain (blocking) connection, for inspecting what the limiter wrote.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection())
            .expect("connecting to the test redis-server")
    }

    /// Every key matching `pattern`, with its `PTTL` in milliseconds
    /// (-1: no TTL, -2: gone).
    pub fn keys_with_pttl(&self, pattern: &str) -> Vec<(String, i64)> {
        let mut conn = self.connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut conn)
            .expect("KEYS");
        keys.into_iter()
            .map(|key| {
                let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).expect("PTTL");
                (key, pttl)
            })
            .collect()
    }

    /// The state a script keeps in a string key: its tag (`'F'`, `'W'`,
    /// `'T'`, `'G'`) and its numbers (big-endian doubles after the header
    /// `"rl"`, the format's version and the tag), or `None` when the key
    /// holds no such state.
    pub fn stored_state(&self, key: &str) -> Option<(char, Vec<f64>)> {
        let bytes: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query(&mut self.connection())
            .expect("GET");
        let bytes = bytes?;
        let (_version, rest) = bytes.strip_prefix(b"rl")?.split_first()?;
        let (&tag, numbers) = rest.split_first()?;
        if numbers.len() % 8 != 0 {
            return None;
        }
        let numbers = numbers
            .chunks_exact(8)
            .map(|chunk| f64::from_be_bytes(chunk.try_into().expect("8 bytes")))
            .collect();
        Some((char::from(tag), numbers))
    }

    /// Panics unless every key matching `pattern` has a TTL, and at least one key matches.
    pub fn assert_all_keys_expire(&self, pattern: &str) {
        let keys = self.keys_with_pttl(pattern);
        assert!(!keys.is_empty(), "no key matches {pattern:?}");
        // -1: no TTL. (-2: gone between KEYS and PTTL, which is fine.)
        let without: Vec<_> = keys.iter().filter(|(_, pttl)| *pttl == -1).collect();
        assert!(without.is_empty(), "keys without a TTL: {without:?}");
    }

    /// Panics if any key matching `pattern` lacks a TTL (no key at all is fine:
    /// a drained sorted set is deleted by Redis).
    pub fn assert_no_key_without_ttl(&self, pattern: &str) {
        let without: Vec<_> = self
            .keys_with_pttl(pattern)
            .into_iter()
            .filter(|(_, pttl)| *pttl == -1)
            .collect();
        assert!(without.is_empty(), "keys without a TTL: {without:?}");
    }

    /// Kills the server now (for failure tests); dropping it does the same.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// A port that was free a moment ago (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding an ephemeral loopback port")
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// An HTTP response as read off the wire.
#[derive(Debug)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl HttpReply {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/1.1 request from the local address `from` (any port) to
/// `to`, over a new TCP connection, and reads the whole reply.
pub async fn http(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpReply> {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    http_bytes(from, to, method, path, &headers).await
}

/// [`http`] with header values of any bytes (not text, say), sent as they are.
pub async fn http_bytes(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> std::io::Result<HttpReply> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let socket = if from.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(std::net::SocketAddr::new(from, 0))?;
    let mut stream = socket.connect(to).await?;
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n").into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name.as_bytes());
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    stream.write_all(&request).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP reply: {text:?}")))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(HttpReply {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A Redis Cluster of our own: three masters and three replicas
/// (`redis-cli --cluster create ... --cluster-replicas 1`), on free loopback
/// ports, with a 1 s node timeout so failovers are quick. Killed when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    /// The six nodes.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six nodes, joins them, and waits until every slot is served
    /// and every master has its replica.
    ///
    /// # Panics
    ///
    /// If redis-server or redis-cli is missing (the message says how to
    /// install them), or the cluster does not form within 30 s.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(Vec::new)
    }

    /// [`start`](Self::start) with each node also listening with TLS (a
    /// certificate `ca` signed) and talking TLS on the cluster bus; returns
    /// the cluster and each node's TLS port.
    pub fn start_tls(ca: &TestCa) -> (RedisCluster, Vec<u16>) {
        let ports = std::sync::Mutex::new(Vec::new());
        let cluster = RedisCluster::start_with(|| {
            let port = free_port();
            ports.lock().unwrap().push(port);
            let mut args = vec![
                "--tls-cluster".to_owned(),
                "yes".to_owned(),
                "--tls-replication".to_owned(),
                "yes".to_owned(),
            ];
            args.extend(ca.server_args(port));
            args
        });
        let ports = ports.into_inner().unwrap();
        (cluster, ports)
    }

    fn start_with(extra: impl Fn() -> Vec<String>) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                let extra = extra();
                let mut args: Vec<&str> = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    // A replica may take over however recently it synced
                    // (a fresh test cluster would otherwise refuse).
                    "--cluster-replica-validity-factor",
                    "0",
                    "--cluster-config-file",
                    "nodes.conf",
                ];
                args.extend(extra.iter().map(String::as_str));
                RedisServer::start_with(&args, free_cluster_port)
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output();
        let output = match output {
            Ok(output) => output,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("`redis-cli` was not found: {INSTALL_HINT}")
            }
            Err(e) => panic!("could not run redis-cli: {e}"),
        };
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ready(Duration::from_secs(30));
        cluster
    }

    /// `redis://127.0.0.1:PORT/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits until every node sees `cluster_state:ok` and each of three
    /// masters has a connected replica.
    pub fn wait_until_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ready = self.nodes.iter().filter(|n| !n.child_exited()).all(|node| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
            }) && self.masters().len() == 3
                && self.nodes.iter().filter(|n| !n.child_exited()).all(|node| {
                    let info: String = redis::cmd("INFO")
                        .arg("replication")
                        .query(&mut node.connection())
                        .unwrap_or_default();
                    info.contains("connected_slaves:1") || info.contains("master_link_status:up")
                });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// The ports of the masters that are up and serve slots.
    pub fn masters(&self) -> Vec<u16> {
        let Some(alive) = self.nodes.iter().find(|n| !n.child_exited()) else {
            return Vec::new();
        };
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut alive.connection())
            .unwrap_or_default();
        nodes
            .lines()
            .filter(|line| {
                line.contains("master") && !line.contains("fail") && line.split(' ').count() > 8
            })
            .filter_map(|line| {
                line.split(' ')
                    .nth(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// The port of the master that serves `key`. Right after a failover a
    /// node may not know the new master yet: asked again (for up to 10 s).
    ///
    /// # Panics
    ///
    /// If no master serves the key within 10 s.
    pub fn master_for(&self, key: &str) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.try_master_for(key) {
                Ok(port) => return port,
                Err(error) if Instant::now() > deadline => panic!("{error}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn try_master_for(&self, key: &str) -> Result<u16, String> {
        let alive = self
            .nodes
            .iter()
            .find(|n| !n.child_exited())
            .expect("a node up");
        let mut conn = alive.connection();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn).unwrap();
        for line in nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
        {
            let fields: Vec<&str> = line.split(' ').collect();
            let serves = fields.iter().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<i64>(), hi.parse::<i64>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
            });
            if serves {
                let address = fields[1].split('@').next().unwrap();
                return Ok(address.rsplit(':').next().unwrap().parse().unwrap());
            }
        }
        Err(format!("no master serves {key} (slot {slot})"))
    }

    /// How many keys matching `pattern` each master holds.
    pub fn keys_per_master(&self, pattern: &str) -> Vec<(u16, usize)> {
        self.masters()
            .into_iter()
            .map(|port| {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(pattern)
                    .query(&mut self.node(port).connection())
                    .unwrap();
                (port, keys.len())
            })
            .collect()
    }

    /// Every key matching `pattern` on every master, with its `PTTL`.
    pub fn keys_with_pttl(&self, pattern: &str) -> Vec<(String, i64)> {
        self.masters()
            .into_iter()
            .flat_map(|port| self.node(port).keys_with_pttl(pattern))
            .collect()
    }

    /// Makes the node on `port` tell clients to reach it at `announced`
    /// (a [`Proxy`] in front of it), and waits until every node says so.
    ///
    /// # Panics
    ///
    /// If the nodes do not all say so within 10 s.
    pub fn announce(&self, port: u16, announced: u16) {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-announce-port")
            .arg(announced)
            .query(&mut self.node(port).connection())
            .expect("CONFIG SET cluster-announce-port");
        let deadline = Instant::now() + Duration::from_secs(10);
        let address = format!("127.0.0.1:{announced}@");
        while !self.nodes.iter().all(|node| {
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query::<String>(&mut node.connection())
                .is_ok_and(|nodes| nodes.contains(&address))
        }) {
            assert!(
                Instant::now() < deadline,
                "the nodes did not learn {address}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node on `port`, to pause or resume.
    pub fn node_on(&self, port: u16) -> &RedisServer {
        self.node(port)
    }

    /// A connection to the node on `port` itself.
    pub fn connection(&self, port: u16) -> redis::Connection {
        self.node(port).connection()
    }

    /// Kills the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
    }
}

impl RedisServer {
    fn child_exited(&self) -> bool {
        // A killed server has been waited for; `try_wait` on it reports so.
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)),
            Duration::from_millis(100),
        )
        .is_err()
    }
}

/// A port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    let random = RandomState::new();
    for attempt in 0u32..1000 {
        let port = 20_000 + (random.hash_one(attempt) % 25_000) as u16;
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

/// Runs a future that is ready at once (the in-memory limiter never waits):
/// one poll, no executor. For benchmarks.
///
/// # Panics
///
/// If the future is not ready after one poll.
pub fn ready<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the future was not ready at once"),
    }
}

/// The first success of `attempt`, tried again every `every` for up to 10
/// seconds (a connection made again, a failover the client has yet to see).
///
/// # Panics
///
/// With `what` and the last error, if none succeeds in time.
pub async fn first_ok<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    every: Duration,
    mut attempt: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) => assert!(Instant::now() < deadline, "{what}: {error}"),
        }
        tokio::time::sleep(every).await;
    }
}
