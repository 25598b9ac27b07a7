//! Two link ends on 127.0.0.1 and a proxy between them that a test can
//! cut and heal.
#![allow(dead_code)]

pub mod pair;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ha::link::{Link, LinkSettings, Timing};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub const SECRET: &[u8] = b"the-pair-secret-0123456789";

pub fn timing() -> Timing {
    Timing {
        heartbeat_interval: Duration::from_millis(50),
        heartbeat_timeout: Duration::from_millis(400),
    }
}

pub fn settings(node: &str, peer: &str, peer_address: String, secret: &[u8]) -> LinkSettings {
    LinkSettings {
        node: node.into(),
        peer: peer.into(),
        peer_address,
        listen: "127.0.0.1:0".parse().unwrap(),
        secret: secret.to_vec(),
        timing: timing(),
    }
}

/// Node "b" (the listener) and node "a" (which dials b through `proxy`).
pub async fn pair(secret_a: &[u8]) -> (Arc<Link>, Arc<Link>, Proxy) {
    let b = Link::start(settings("b", "a", "127.0.0.1:1".into(), SECRET))
        .await
        .unwrap();
    let proxy = Proxy::start(b.local_addr()).await;
    let a = Link::start(settings("a", "b", proxy.addr.to_string(), secret_a))
        .await
        .unwrap();
    (a, b, proxy)
}

pub async fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Forwards connections to a target until cut.
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (c, cs) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped at once
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                cs.lock().push(task);
            }
        });
        Proxy { addr, cut, conns }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for t in self.conns.lock().drain(..) {
            t.abort();
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}
