//! The replication link over real TCP on 127.0.0.1.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pair, wait_for, SECRET};
use ha::link::{handshake, Endpoint, Incoming, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Default)]
struct Echo {
    connected: AtomicUsize,
    disconnected: AtomicUsize,
}

impl Endpoint for Echo {
    fn connected(&self, _: &Arc<Session>) {
        self.connected.fetch_add(1, Ordering::SeqCst);
    }
    fn disconnected(&self, _: u64) {
        self.disconnected.fetch_add(1, Ordering::SeqCst);
    }
    fn notice(&self, _: &Arc<Session>, _: Vec<u8>) {}
    fn request(&self, r: Incoming) {
        let mut body = b"echo:".to_vec();
        body.extend_from_slice(&r.payload);
        r.reply(&body);
    }
}

const UP: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cross_an_authenticated_link_and_it_reconnects_after_a_cut() {
    let (a, b, proxy) = pair(SECRET).await;
    let echo = Arc::new(Echo::default());
    b.register("vol0", echo.clone());
    wait_for("the link", UP, || {
        a.status().connected && b.status().connected
    })
    .await;
    let s = a.session().unwrap();
    let reply = tokio::task::spawn_blocking(move || {
        let r = s.request("vol0", b"hi").unwrap().wait(UP).unwrap();
        let none = s.request("nothing", b"hi").unwrap().wait(UP).unwrap();
        (r, none)
    })
    .await
    .unwrap();
    assert_eq!(reply.0, b"echo:hi");
    assert_eq!(reply.1[0], ha::link::NO_SUCH_DEVICE);
    wait_for("a heartbeat", UP, || a.status().rtt_us.is_some()).await;

    // Heartbeats keep an idle link up past the timeout.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(a.status().sessions, 1);

    proxy.cut();
    wait_for("both ends to see the cut", UP, || {
        !a.status().connected && !b.status().connected
    })
    .await;
    assert_eq!(echo.disconnected.load(Ordering::SeqCst), 1);
    proxy.heal();
    wait_for("the dialer to reconnect", UP, || b.status().connected).await;
    assert_eq!(a.status().sessions, 2);
    assert_eq!(echo.connected.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_and_counted() {
    let (a, b, _proxy) = pair(b"not-the-pair-secret-at-all").await;
    let echo = Arc::new(Echo::default());
    b.register("vol0", echo.clone());
    wait_for("failures", UP, || b.status().auth_failures >= 2).await;
    assert!(!a.status().connected && !b.status().connected);
    assert_eq!(echo.connected.load(Ordering::SeqCst), 0);
    assert_eq!(b.status().sessions, 0);
}

/// Reads until the peer closes; true if it did within the time.
async fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    r.await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_their_connection() {
    let (a, b, _proxy) = pair(SECRET).await;
    wait_for("the link", UP, || a.status().connected).await;
    let first = b.session().unwrap().id;

    // Before authentication: garbage, an oversized length, a wrong kind.
    for junk in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        [1u8, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0].to_vec(),
        ha::wire::encode(3, &[0; 32]),
    ] {
        let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
        s.write_all(&junk).await.unwrap();
        assert!(closed_by_peer(&mut s).await);
    }
    assert_eq!(b.session().unwrap().id, first, "the pair's session goes on");

    // After authentication: a frame of an unknown kind, then one whose
    // payload is cut short.
    for junk in [ha::wire::encode(99, b"x"), ha::wire::encode(20, &[1, 2, 3])] {
        let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
        handshake::dial(&mut s, "a", "b", SECRET).await.unwrap();
        s.write_all(&junk).await.unwrap();
        assert!(closed_by_peer(&mut s).await);
    }
    // The real dialer comes back.
    wait_for("the link again", UP, || {
        a.status().connected && b.status().connected
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_hold_only_their_own_sources_budget() {
    let (a, b, _proxy) = pair(SECRET).await;
    wait_for("the link", UP, || a.status().connected).await;
    // Ten connections from another address that never say a word.
    let mut silent = Vec::new();
    for _ in 0..10 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        silent.push(socket.connect(b.local_addr()).await.unwrap());
    }
    let mut closed = 0;
    for s in &mut silent {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 6, "past four per source, refused at once");
    // The pair's own connection is untouched, and comes back after a cut.
    b.drop_session("test");
    wait_for("the link again", UP, || {
        b.status().connected && b.status().sessions == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_peer_that_falls_silent_is_declared_gone() {
    let (a, b, proxy) = pair(SECRET).await;
    wait_for("the link", UP, || a.status().connected).await;
    proxy.cut();
    let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
    handshake::dial(&mut s, "a", "b", SECRET).await.unwrap();
    wait_for("the session", UP, || {
        b.status().sessions == 2 && b.status().connected
    })
    .await;
    // It reads nothing and sends nothing: the heartbeat timeout ends it.
    let start = std::time::Instant::now();
    wait_for("the timeout", UP, || !b.status().connected).await;
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(closed_by_peer(&mut s).await);
}
