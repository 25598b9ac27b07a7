//! The iSCSI listeners of the running daemon. A configuration change that
//! adds a portal starts its listener; one that removes a portal stops
//! accepting there, and (as LIO does when a network portal is deleted)
//! the sessions already logged in through it keep running until they log
//! out or the daemon stops. Other portals are never touched.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

pub struct Portals {
    server: Arc<iscsi::Server>,
    running: BTreeMap<SocketAddr, Running>,
}

/// A listening socket. IPv6 sockets are IPv6-only so that `0.0.0.0:3260`
/// and `[::]:3260` can both be portals.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

impl Portals {
    pub fn new(server: Arc<iscsi::Server>) -> Portals {
        Portals {
            server,
            running: BTreeMap::new(),
        }
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.running.keys().copied().collect()
    }

    /// Every portal with a listener, and whether it still accepts (its
    /// accept loop has not ended).
    pub fn listening(&self) -> Vec<(SocketAddr, bool)> {
        self.running
            .iter()
            .map(|(addr, r)| (*addr, !r.task.is_finished()))
            .collect()
    }

    /// Starts accepting on `listener` (bound to `addr`). Needs the I/O
    /// runtime's context.
    pub fn start(&mut self, addr: SocketAddr, listener: TcpListener) {
        let (stop, stopped) = watch::channel(false);
        let server = self.server.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = server.serve_until(listener, stopped).await {
                tracing::error!(%addr, error = %e, "portal listener failed");
            }
        });
        self.running.insert(addr, Running { stop, task });
    }

    /// Stops accepting on `addr`; its sessions go on. The listening socket
    /// is closed when the returned task ends.
    pub fn stop(&mut self, addr: SocketAddr) -> Option<JoinHandle<()>> {
        let r = self.running.remove(&addr)?;
        let _ = r.stop.send(true);
        tracing::info!(%addr, "portal removed; its sessions continue until they log out");
        Some(r.task)
    }

    /// After [`iscsi::Server::shutdown`]: waits up to `grace` for every
    /// listener to return, then aborts the rest.
    pub async fn join_all(&mut self, grace: Duration) {
        let running = std::mem::take(&mut self.running);
        for (addr, r) in running {
            let mut task = r.task;
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                tracing::warn!(%addr, "listener did not stop in time");
                task.abort();
            }
        }
    }
}

/// The addresses in `wanted` not yet served, and those served but no
/// longer wanted.
pub fn changes(
    running: &[SocketAddr],
    wanted: &[SocketAddr],
) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    let added = wanted
        .iter()
        .filter(|a| !running.contains(a))
        .copied()
        .collect();
    let removed = running
        .iter()
        .filter(|a| !wanted.contains(a))
        .copied()
        .collect();
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_the_set_differences() {
        let a: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:3261".parse().unwrap();
        let c: SocketAddr = "[::1]:3260".parse().unwrap();
        assert_eq!(changes(&[a, b], &[b, c]), (vec![c], vec![a]));
        assert_eq!(changes(&[a], &[a]), (vec![], vec![]));
    }

    #[tokio::test]
    async fn a_stopped_portal_refuses_new_connections() {
        let server = iscsi::Server::new(iscsi::ServerOptions::default(), Vec::new());
        let mut portals = Portals::new(server);
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        portals.start(addr, listener);
        assert_eq!(portals.addrs(), vec![addr]);
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
        let task = portals.stop(addr).expect("a running portal");
        assert!(portals.addrs().is_empty());
        assert!(portals.stop(addr).is_none());
        // The listener is closed once its task has returned.
        task.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
