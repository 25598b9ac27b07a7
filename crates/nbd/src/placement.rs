//! Connections spread over runtimes of one worker thread each, when the
//! daemon gives such runtimes: a connection's wake-ups then wake its own
//! thread only, where in one runtime of several workers each wake-up of an
//! idle worker also wakes a sibling to look for work to steal (on two
//! cores that cost more CPU per request than the request itself). Each
//! connection goes to the runtime serving the fewest.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use tokio::net::{TcpStream, UnixStream};
use tokio::runtime::Handle;

struct Runtime {
    handle: Handle,
    /// Connections placed here and not yet ended.
    connections: AtomicUsize,
}

/// Ends a connection's count on its runtime, however its task ends.
struct Placed(Arc<Runtime>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that can move from one runtime's reactor to another's.
pub(crate) trait Movable: Sized + Send + 'static {
    type Std: Send + 'static;
    fn into_std(self) -> std::io::Result<Self::Std>;
    fn from_std(s: Self::Std) -> std::io::Result<Self>;
}

impl Movable for TcpStream {
    type Std = std::net::TcpStream;
    fn into_std(self) -> std::io::Result<Self::Std> {
        TcpStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> std::io::Result<Self> {
        TcpStream::from_std(s)
    }
}

impl Movable for UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_std(self) -> std::io::Result<Self::Std> {
        UnixStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> std::io::Result<Self> {
        UnixStream::from_std(s)
    }
}

#[derive(Default)]
pub(crate) struct Placement {
    runtimes: RwLock<Vec<Arc<Runtime>>>,
}

impl Placement {
    pub fn set(&self, handles: Vec<Handle>) {
        *self.runtimes.write() = handles
            .into_iter()
            .map(|handle| {
                Arc::new(Runtime {
                    handle,
                    connections: AtomicUsize::new(0),
                })
            })
            .collect();
    }

    /// Runs `serve` with `stream` on the runtime serving the fewest
    /// connections, or on the caller's runtime when none was given. The
    /// stream moves to that runtime's reactor, so its readiness wakes the
    /// thread that serves it.
    pub fn spawn<S, F, Fut>(&self, stream: S, serve: F)
    where
        S: Movable,
        F: FnOnce(S) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let runtime = self
            .runtimes
            .read()
            .iter()
            .min_by_key(|r| r.connections.load(Ordering::Relaxed))
            .cloned();
        let Some(runtime) = runtime else {
            tokio::spawn(serve(stream));
            return;
        };
        let std_stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("nbd: cannot move a connection to its runtime, closing it: {e}");
                return;
            }
        };
        runtime.connections.fetch_add(1, Ordering::Relaxed);
        let placed = Placed(runtime.clone());
        runtime.handle.spawn(async move {
            let _placed = placed;
            match S::from_std(std_stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::warn!("nbd: cannot register a connection, closing it: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[test]
    fn connections_run_on_the_least_loaded_runtime_given() {
        let runtime = |name: &str| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .enable_all()
                .build()
                .unwrap()
        };
        let (a, b) = (runtime("nbd-a"), runtime("nbd-b"));
        let main = runtime("nbd-main");
        let placement = Arc::new(Placement::default());
        placement.set(vec![a.handle().clone(), b.handle().clone()]);
        main.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let mut clients = Vec::new();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for _ in 0..2 {
                clients.push(TcpStream::connect(addr).await.unwrap());
                let (stream, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                placement.spawn(stream, move |mut s: TcpStream| async move {
                    let name = std::thread::current().name().unwrap().to_string();
                    s.write_all(b"x").await.unwrap();
                    tx.send(name).unwrap();
                    let _ = s.read_u8().await;
                });
            }
            let mut names = vec![rx.recv().await.unwrap(), rx.recv().await.unwrap()];
            names.sort();
            assert_eq!(names, ["nbd-a", "nbd-b"]);
            for c in &mut clients {
                assert_eq!(c.read_u8().await.unwrap(), b'x');
            }
        });
    }
}
