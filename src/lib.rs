//! Support for this workspace's tests, examples and benches: real
//! `redis-server` processes started on free ports, and a plain HTTP/1.1
//! client that can choose its source address. Not published.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        let mut last_error = String::new();
        for _ in 0..5 {
            match RedisServer::try_start() {
                Ok(server) => return server,
                Err(error) => last_error = error,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    fn try_start() -> Result<RedisServer, String> {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("ratelimit-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let child = Command::new(redis_server_bin())
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&dir)
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

    /// Panics unless every key matching `pattern` has a TTL, and at least one key matches.
    pub fn assert_all_keys_expire(&self, pattern: &str) {
        let keys = self.keys_with_pttl(pattern);
        assert!(!keys.is_empty(), "no key matches {pattern:?}");
        let without: Vec<_> = keys.iter().filter(|(_, pttl)| *pttl <= 0).collect();
        assert!(without.is_empty(), "keys without a TTL: {without:?}");
    }

    /// Panics if any key matching `pattern` lacks a TTL (no key at all is fine:
    /// a drained sorted set is deleted by Redis).
    pub fn assert_no_key_without_ttl(&self, pattern: &str) {
        let without: Vec<_> = self
            .keys_with_pttl(pattern)
            .into_iter()
            .filter(|(_, pttl)| *pttl <= 0)
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let socket = if from.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(std::net::SocketAddr::new(from, 0))?;
    let mut stream = socket.connect(to).await?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
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
