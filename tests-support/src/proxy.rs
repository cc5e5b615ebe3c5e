//! A TCP proxy in front of a Redis server, for fault tests: it forwards
//! both ways and, when asked, loses or holds back a reply: the server has
//! run what it was sent, and the client sees its connection drop, or the
//! answer come late.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The request pattern whose reply meets a fault, until one does.
type Armed = Arc<Mutex<Option<(Vec<u8>, Fault)>>>;

/// What happens to the reply to an armed request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Lose,
    Delay(Duration),
}

/// A proxy on a free loopback port to `127.0.0.1:<target>`. Its threads
/// end with the test process.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    armed: Armed,
}

impl Proxy {
    /// Starts forwarding every connection made to [`Proxy::port`].
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        let armed: Armed = Arc::default();
        let shared = armed.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, target)) else {
                    continue;
                };
                let (client_in, server_out) = (
                    client.try_clone().expect("a socket"),
                    server.try_clone().expect("a socket"),
                );
                // Set when this connection sent the armed request.
                let fault: Arc<Mutex<Option<Fault>>> = Arc::default();
                let (armed, marked) = (shared.clone(), fault.clone());
                std::thread::spawn(move || {
                    pump(client_in, server_out, |bytes| {
                        let mut armed = armed.lock().unwrap_or_else(|e| e.into_inner());
                        if armed.as_ref().is_some_and(|(p, _)| contains(bytes, p)) {
                            let (_, fault) = armed.take().expect("armed");
                            *marked.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
                        }
                        true
                    });
                });
                std::thread::spawn(move || {
                    pump(server, client, |_| {
                        match fault.lock().unwrap_or_else(|e| e.into_inner()).take() {
                            None => true,
                            Some(Fault::Lose) => false,
                            Some(Fault::Delay(by)) => {
                                std::thread::sleep(by);
                                true
                            }
                        }
                    });
                });
            }
        });
        Proxy { port, armed }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Loses the reply to the next request that contains `pattern` (the
    /// request reaches the server): that connection is closed both ways
    /// instead.
    pub fn lose_reply_to(&self, pattern: &[u8]) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((pattern.to_vec(), Fault::Lose));
    }

    /// Holds back the reply to the next request that contains `pattern`
    /// (the request reaches the server) for `by`.
    pub fn delay_reply_to(&self, pattern: &[u8], by: Duration) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((pattern.to_vec(), Fault::Delay(by)));
    }
}

fn contains(bytes: &[u8], pattern: &[u8]) -> bool {
    bytes.windows(pattern.len()).any(|w| w == pattern)
}

/// Copies `from` to `to` while `forward` says so of each chunk read.
fn pump(mut from: TcpStream, mut to: TcpStream, mut forward: impl FnMut(&[u8]) -> bool) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !forward(&buffer[..n]) || to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
