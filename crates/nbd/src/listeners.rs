//! The addresses a server listens on, changed while it runs: a new
//! address is bound first (so a configuration change whose address is
//! taken can be refused before anything else changes) and served once the
//! change is made; a dropped address stops accepting, and the sessions
//! that came through it go on, as iSCSI's portals do.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::{ListenAddr, Server};

/// A socket bound and listening, not yet accepting.
pub enum Bound {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// Binds `addr`. A unix socket file left by a process that is gone is
/// replaced; one that still answers is not.
pub fn bind(addr: &ListenAddr) -> io::Result<Bound> {
    match addr {
        ListenAddr::Tcp(a) => {
            let l = std::net::TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            Ok(Bound::Tcp(l))
        }
        ListenAddr::Unix(path) => {
            if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
                std::fs::remove_file(path)?;
            }
            let l = std::os::unix::net::UnixListener::bind(path)?;
            l.set_nonblocking(true)?;
            Ok(Bound::Unix(l))
        }
    }
}

/// An accepting task.
type Accepting = JoinHandle<io::Result<()>>;

/// The accepting tasks of one server, by address.
pub struct Listeners {
    server: Server,
    /// Keyed by the address as text (`ListenAddr` has no order).
    running: Mutex<BTreeMap<String, (ListenAddr, Accepting)>>,
}

impl Listeners {
    pub fn new(server: Server) -> Listeners {
        Listeners {
            server,
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// Where the server accepts now.
    pub fn addrs(&self) -> Vec<ListenAddr> {
        self.running
            .lock()
            .values()
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// Starts accepting on `bound` (bound to `addr`). Needs a runtime's
    /// context.
    pub fn start(&self, addr: ListenAddr, bound: Bound) -> io::Result<()> {
        let task = self.server.serve_bound(bound)?;
        tracing::info!(%addr, "NBD listening");
        if let Some((_, old)) = self.running.lock().insert(addr.to_string(), (addr, task)) {
            old.abort();
        }
        Ok(())
    }

    /// Stops accepting on `addr`; its sessions go on. A unix socket's file
    /// goes with it. The socket is closed once the returned task has ended.
    pub fn stop(&self, addr: &ListenAddr) -> Option<Accepting> {
        let (_, task) = self.running.lock().remove(&addr.to_string())?;
        task.abort();
        if let ListenAddr::Unix(path) = addr {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!(%addr, "NBD no longer listening there; its sessions continue");
        Some(task)
    }

    /// After [`Server::shutdown`]: waits up to `grace` for every accepting
    /// task to return.
    pub async fn join(&self, grace: Duration) {
        let running = std::mem::take(&mut *self.running.lock());
        for (_, (addr, mut task)) in running {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                tracing::warn!(%addr, "NBD listener did not stop in time");
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Limits;

    #[tokio::test]
    async fn a_dropped_address_stops_accepting_and_an_added_one_starts() {
        let server = Server::new(BTreeMap::new(), Limits::default());
        let listeners = Listeners::new(server.clone());
        let dir = tempfile::tempdir().unwrap();
        let first = ListenAddr::Unix(dir.path().join("a.sock"));
        let second = ListenAddr::Tcp("127.0.0.1:0".parse().unwrap());
        let bound = bind(&first).unwrap();
        listeners.start(first.clone(), bound).unwrap();
        let ListenAddr::Unix(path) = &first else {
            unreachable!()
        };
        assert!(tokio::net::UnixStream::connect(path).await.is_ok());
        // A second bind of a live socket is refused, not stolen.
        assert!(bind(&first).is_err());
        let Bound::Tcp(tcp) = bind(&second).unwrap() else {
            unreachable!()
        };
        let port = tcp.local_addr().unwrap();
        let second = ListenAddr::Tcp(port);
        listeners.start(second.clone(), Bound::Tcp(tcp)).unwrap();
        assert_eq!(listeners.addrs().len(), 2);
        let _ = listeners.stop(&first).unwrap().await;
        assert!(!path.exists());
        assert!(tokio::net::UnixStream::connect(path).await.is_err());
        assert!(tokio::net::TcpStream::connect(port).await.is_ok());
        server.shutdown();
        listeners.join(Duration::from_secs(1)).await;
        assert!(listeners.addrs().is_empty());
    }
}
