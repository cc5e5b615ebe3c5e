//! [`RedisTarget`]: which Redis a limiter keeps its budgets in, however it
//! is named (a URL, a cluster's nodes, Sentinels, a client of your own).

use std::fmt;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;

use super::connection::Endpoint;
use super::{ConnectOptions, cluster_builder, tls};
use crate::error::Error;
use crate::secret::{redact_url, redact_urls};

/// The Redis a limiter keeps its budgets in: one server, a Redis Cluster,
/// the master a set of Sentinels names, or a client or connection of your
/// own. Given to [`RateLimiterBuilder::redis`](crate::RateLimiterBuilder::redis)
/// or [`RedisBackend::connect`](super::RedisBackend::connect), which take
/// anything that converts into it, as redis-rs's `IntoConnectionInfo` does:
///
/// | You give | The limiter uses |
/// |---|---|
/// | a URL (`&str`, `String`): `"redis://user:pass@host:6379/0"`, `rediss://` for TLS | that server |
/// | a list of URLs (array, slice or `Vec`, or a reference to one): `["redis://a:7000", "redis://b:7001"]` | the Redis Cluster those nodes belong to |
/// | [`RedisTarget::sentinel`]`("mymaster", ["redis://s1:26379", ..])` | the master the Sentinels name, followed through failovers (feature `sentinel`) |
/// | a [`redis::Client`] | the server it connects to (a connection made from it) |
/// | a [`redis::aio::ConnectionManager`] | that connection (it reconnects as you configured it) |
/// | a [`redis::cluster::ClusterClient`] | that cluster (build it with `.retries(0)`) |
/// | a `redis::sentinel::SentinelClient` | the master it names (feature `sentinel`) |
///
/// URLs are parsed when the limiter connects: a malformed one is then an
/// [`Error::Config`] whose message leaves the password out. A target prints
/// (`Debug`) without passwords.
///
/// ```no_run
/// use ratelimit_runtime::RateLimiter;
/// # async fn start() -> Result<(), ratelimit_runtime::Error> {
/// let one = RateLimiter::builder().redis("redis://127.0.0.1:6379").build().await?;
/// let cluster = RateLimiter::builder()
///     .redis(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct RedisTarget {
    kind: TargetKind,
    #[cfg(feature = "tls")]
    tls_root: Option<Vec<u8>>,
}

enum TargetKind {
    Url(String),
    Cluster(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        master_name: String,
        sentinels: Vec<String>,
    },
    #[cfg(feature = "sentinel")]
    SentinelClient(Box<SentinelClient>),
    Client(Box<redis::Client>),
    Manager(ConnectionManager),
    ClusterClient(Box<ClusterClient>),
}

#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelClient;

impl RedisTarget {
    fn new(kind: TargetKind) -> RedisTarget {
        RedisTarget {
            kind,
            #[cfg(feature = "tls")]
            tls_root: None,
        }
    }

    /// The master that the Sentinels at `sentinels` (`redis://host:26379`)
    /// name for `master_name` (feature `sentinel`). The limiter follows it:
    /// when its connection fails, the Sentinels are asked again, so after a
    /// failover it goes on with the promoted replica. Replication is
    /// asynchronous: what the old master counted last, before the replica
    /// had it, is lost with it.
    ///
    /// For a master that needs a password, a database or TLS, build a
    /// `redis::sentinel::SentinelClient` (of `SentinelServerType::Master`)
    /// with those settings and give it instead.
    #[cfg(feature = "sentinel")]
    pub fn sentinel<S: AsRef<str>>(
        master_name: impl Into<String>,
        sentinels: impl IntoIterator<Item = S>,
    ) -> RedisTarget {
        RedisTarget::new(TargetKind::Sentinel {
            master_name: master_name.into(),
            sentinels: urls(sentinels),
        })
    }

    /// Trusts the certificate authority `pem` (PEM) for this target's
    /// `rediss://` URLs (one server's, or a cluster's nodes'), instead of
    /// the system's roots (feature `tls`). A client of your own carries its
    /// own TLS settings: connecting to one with a root certificate given
    /// here is an [`Error::Config`].
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> RedisTarget {
        self.tls_root = Some(pem.into());
        self
    }

    /// What the connection is made from: URLs parsed (errors without their
    /// passwords), a cluster client with the limiter's timeouts.
    pub(super) fn endpoint(self, options: &ConnectOptions) -> Result<Endpoint, Error> {
        tls::install_provider();
        #[cfg(feature = "tls")]
        let tls_root = match (&self.kind, self.tls_root) {
            (TargetKind::Url(_) | TargetKind::Cluster(_), root) => root,
            (_, None) => None,
            (_, Some(_)) => {
                return Err(Error::Config(format!(
                    "a TLS root certificate applies to `rediss://` URLs, not to {}: \
                     configure the TLS of a client of your own on the client",
                    self.kind.what()
                )));
            }
        };
        match self.kind {
            TargetKind::Url(url) => {
                let bad = |e: redis::RedisError| {
                    Error::Config(format!("bad Redis URL {:?}: {e}", redact_url(&url)))
                };
                #[cfg(feature = "tls")]
                if let Some(root) = tls_root {
                    return redis::Client::build_with_tls(url.as_str(), tls::certificates(&root))
                        .map(Endpoint::Single)
                        .map_err(|e| {
                            Error::Config(format!(
                                "bad Redis URL or certificate {:?}: {e}",
                                redact_url(&url)
                            ))
                        });
                }
                redis::Client::open(url.as_str())
                    .map(Endpoint::Single)
                    .map_err(bad)
            }
            TargetKind::Cluster(urls) => {
                let builder = cluster_builder(&urls, *options);
                #[cfg(feature = "tls")]
                let builder = match tls_root {
                    Some(root) => builder.certs(tls::certificates(&root)),
                    None => builder,
                };
                let client = builder.build().map_err(|e| {
                    Error::Config(format!(
                        "bad Redis Cluster URLs {:?}: {e}",
                        redact_urls(&urls)
                    ))
                })?;
                Ok(Endpoint::Cluster(Box::new(client)))
            }
            #[cfg(feature = "sentinel")]
            TargetKind::Sentinel {
                master_name,
                sentinels,
            } => {
                use redis::sentinel::SentinelServerType;
                // A `String` without TLS, `impl AsRef<str>` with it.
                #[allow(clippy::unnecessary_to_owned)]
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master_name.to_owned(),
                    None,
                    SentinelServerType::Master,
                )
                .map_err(|e| {
                    Error::Config(format!(
                        "bad Sentinel URLs {:?}: {e}",
                        redact_urls(&sentinels)
                    ))
                })?;
                Ok(sentinel_endpoint(client))
            }
            #[cfg(feature = "sentinel")]
            TargetKind::SentinelClient(client) => Ok(sentinel_endpoint(*client)),
            TargetKind::Client(client) => Ok(Endpoint::Single(*client)),
            TargetKind::Manager(manager) => Ok(Endpoint::Manager(manager)),
            TargetKind::ClusterClient(client) => Ok(Endpoint::Cluster(client)),
        }
    }
}

/// Asks `client` for the master at each connect.
#[cfg(feature = "sentinel")]
fn sentinel_endpoint(client: SentinelClient) -> Endpoint {
    let client = std::sync::Arc::new(tokio::sync::Mutex::new(client));
    Endpoint::Sentinel(Box::new(move || {
        let client = std::sync::Arc::clone(&client);
        Box::pin(async move { client.lock().await.async_get_client().await })
    }))
}

impl TargetKind {
    /// What the target is, in words, for errors.
    #[cfg(feature = "tls")]
    fn what(&self) -> &'static str {
        match self {
            TargetKind::Url(_) => "a URL",
            TargetKind::Cluster(_) => "cluster URLs",
            #[cfg(feature = "sentinel")]
            TargetKind::Sentinel { .. } => {
                "Sentinels (build a redis::sentinel::SentinelClient with your certificates)"
            }
            #[cfg(feature = "sentinel")]
            TargetKind::SentinelClient(_) => "a Sentinel client",
            TargetKind::Client(_) => "a redis::Client",
            TargetKind::Manager(_) => "a connection manager",
            TargetKind::ClusterClient(_) => "a cluster client",
        }
    }
}

/// Prints no password (URLs redacted) and no certificate.
impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("RedisTarget");
        out.field("target", &self.kind);
        #[cfg(feature = "tls")]
        out.field("tls_root_certificate", &self.tls_root.is_some());
        out.finish()
    }
}

impl fmt::Debug for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetKind::Url(url) => f.debug_tuple("Url").field(&redact_url(url)).finish(),
            TargetKind::Cluster(urls) => {
                f.debug_tuple("Cluster").field(&redact_urls(urls)).finish()
            }
            #[cfg(feature = "sentinel")]
            TargetKind::Sentinel {
                master_name,
                sentinels,
            } => f
                .debug_tuple("Sentinel")
                .field(master_name)
                .field(&redact_urls(sentinels))
                .finish(),
            #[cfg(feature = "sentinel")]
            TargetKind::SentinelClient(_) => f.write_str("SentinelClient"),
            TargetKind::Client(client) => f
                .debug_tuple("Client")
                .field(&client.get_connection_info().addr().to_string())
                .finish(),
            TargetKind::Manager(_) => f.write_str("ConnectionManager"),
            TargetKind::ClusterClient(_) => f.write_str("ClusterClient"),
        }
    }
}

fn urls<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Vec<String> {
    urls.into_iter()
        .map(|url| url.as_ref().to_owned())
        .collect()
}

/// One server, by URL.
impl From<&str> for RedisTarget {
    fn from(url: &str) -> RedisTarget {
        RedisTarget::new(TargetKind::Url(url.to_owned()))
    }
}

/// One server, by URL.
impl From<String> for RedisTarget {
    fn from(url: String) -> RedisTarget {
        RedisTarget::new(TargetKind::Url(url))
    }
}

/// One server, by URL.
impl From<&String> for RedisTarget {
    fn from(url: &String) -> RedisTarget {
        RedisTarget::from(url.as_str())
    }
}

/// A Redis Cluster, through any of these nodes.
impl<S: AsRef<str>> From<Vec<S>> for RedisTarget {
    fn from(nodes: Vec<S>) -> RedisTarget {
        RedisTarget::new(TargetKind::Cluster(urls(nodes)))
    }
}

/// A Redis Cluster, through any of these nodes.
impl<S: AsRef<str>> From<&Vec<S>> for RedisTarget {
    fn from(nodes: &Vec<S>) -> RedisTarget {
        RedisTarget::new(TargetKind::Cluster(urls(nodes)))
    }
}

/// A Redis Cluster, through any of these nodes.
impl<S: AsRef<str>, const N: usize> From<&[S; N]> for RedisTarget {
    fn from(nodes: &[S; N]) -> RedisTarget {
        RedisTarget::new(TargetKind::Cluster(urls(nodes)))
    }
}

/// A Redis Cluster, through any of these nodes.
impl<S: AsRef<str>> From<&[S]> for RedisTarget {
    fn from(nodes: &[S]) -> RedisTarget {
        RedisTarget::new(TargetKind::Cluster(urls(nodes)))
    }
}

/// A Redis Cluster, through any of these nodes.
impl<S: AsRef<str>, const N: usize> From<[S; N]> for RedisTarget {
    fn from(nodes: [S; N]) -> RedisTarget {
        RedisTarget::new(TargetKind::Cluster(urls(nodes)))
    }
}

/// The server this client connects to: the limiter makes its own
/// connection from it (your TLS, authentication and timeouts).
impl From<redis::Client> for RedisTarget {
    fn from(client: redis::Client) -> RedisTarget {
        RedisTarget::new(TargetKind::Client(Box::new(client)))
    }
}

/// This connection: the limiter sends its calls on it (and its clones), and
/// it reconnects as you configured it.
impl From<ConnectionManager> for RedisTarget {
    fn from(manager: ConnectionManager) -> RedisTarget {
        RedisTarget::new(TargetKind::Manager(manager))
    }
}

/// The cluster this client reaches. Build it with `.retries(0)`: with
/// retries, the client sends a request again when its connection drops,
/// also a script call a node already ran (a check counted twice).
impl From<ClusterClient> for RedisTarget {
    fn from(client: ClusterClient) -> RedisTarget {
        RedisTarget::new(TargetKind::ClusterClient(Box::new(client)))
    }
}

/// The master this Sentinel client names (build it with
/// `SentinelServerType::Master`), asked again after a failure; see
/// [`RedisTarget::sentinel`].
#[cfg(feature = "sentinel")]
impl From<SentinelClient> for RedisTarget {
    fn from(client: SentinelClient) -> RedisTarget {
        RedisTarget::new(TargetKind::SentinelClient(Box::new(client)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lists_and_clients_name_their_kind_and_print_no_password() {
        let cluster = |target: RedisTarget| matches!(target.kind, TargetKind::Cluster(_));
        let one = RedisTarget::from("redis://app:hunter2@db:6379/0");
        assert!(matches!(one.kind, TargetKind::Url(_)));
        assert_eq!(
            format!("{:?}", one.kind),
            r#"Url("redis://app:***@db:6379/0")"#
        );
        let owned = RedisTarget::from(String::from("redis://db"));
        assert!(matches!(owned.kind, TargetKind::Url(_)));

        let array = RedisTarget::from(["redis://:hunter2@a:7000", "redis://b:7001"]);
        assert!(!format!("{array:?}").contains("hunter2"), "{array:?}");
        assert!(cluster(array));
        let nodes = vec!["redis://a:7000".to_owned()];
        assert!(cluster(RedisTarget::from(&nodes[..])));
        assert!(cluster(RedisTarget::from(&nodes)));
        assert!(cluster(RedisTarget::from(&["redis://a:7000"])));
        assert!(cluster(RedisTarget::from(nodes)));
        assert!(cluster(RedisTarget::from(&["redis://a:7000"][..])));
    }

    #[cfg(feature = "sentinel")]
    #[test]
    fn sentinels_print_no_password() {
        let target = RedisTarget::sentinel("mymaster", ["redis://:hunter2@s1:26379"]);
        let shown = format!("{target:?}");
        assert!(
            shown.contains("mymaster") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_root_certificate_for_a_client_of_your_own_is_a_config_error() {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let target = RedisTarget::from(client).tls_root_certificate(b"pem".to_vec());
        let error = target.endpoint(&ConnectOptions::default()).err().unwrap();
        assert!(
            matches!(&error, Error::Config(m) if m.contains("a redis::Client")),
            "{error:?}"
        );
    }
}
