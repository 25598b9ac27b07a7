//! Connections spread over runtimes of one worker thread each.
//!
//! Why not one runtime with a worker per core: a connection's work comes
//! in bursts from the socket and from the I/O pool, and each wake-up of an
//! idle worker there also wakes its sibling to look for work to steal. On
//! two cores that cost a third of the CPU per command and halved the IOPS
//! of O_DIRECT reads (docs/bench/techniques.md, section 17). With a runtime
//! of its own per thread, a connection's tasks (its loop, its writer) stay
//! on one thread and a wake-up wakes that thread only; connections are
//! placed on the runtime that serves the fewest, so sessions still spread
//! over every core.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::runtime::Handle;

/// The runtimes connections run on.
pub(crate) struct Shards {
    shards: Vec<Arc<Shard>>,
}

struct Shard {
    handle: Handle,
    /// Connections placed here and not yet ended.
    connections: AtomicUsize,
}

/// Ends a connection's count on its shard, however its task ends.
struct Placed(Arc<Shard>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shards {
    pub fn new(handles: Vec<Handle>) -> Shards {
        Shards {
            shards: handles
                .into_iter()
                .map(|handle| {
                    Arc::new(Shard {
                        handle,
                        connections: AtomicUsize::new(0),
                    })
                })
                .collect(),
        }
    }

    /// Runs `serve` with `stream` on the runtime serving the fewest
    /// connections, or on the caller's runtime when there are none. The
    /// stream moves to that runtime's reactor, so its readiness wakes the
    /// thread that serves it.
    pub fn spawn<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(shard) = self
            .shards
            .iter()
            .min_by_key(|s| s.connections.load(Ordering::Relaxed))
        else {
            tokio::spawn(serve(stream));
            return;
        };
        let std_stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot move a connection to its runtime; closing it");
                return;
            }
        };
        shard.connections.fetch_add(1, Ordering::Relaxed);
        let placed = Placed(shard.clone());
        shard.handle.spawn(async move {
            let _placed = placed;
            // Registers the socket with this runtime's reactor.
            match TcpStream::from_std(std_stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::warn!(error = %e, "cannot register a connection; closing it"),
            }
        });
    }

    /// Connections now placed on each runtime, in order.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| s.connections.load(Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// A connection accepted on one runtime is served on another: its
    /// bytes flow, it runs on the shard's thread, and the next connection
    /// goes to the shard with fewer.
    #[test]
    fn connections_go_to_the_least_loaded_runtime_and_are_served_there() {
        let shard_rts: Vec<tokio::runtime::Runtime> = (0..2)
            .map(|i| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name(format!("shard-test-{i}"))
                    .enable_all()
                    .build()
                    .unwrap()
            })
            .collect();
        let shards = Shards::new(shard_rts.iter().map(|r| r.handle().clone()).collect());
        let main = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        main.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
            let mut clients = Vec::new();
            for round in 0..3u8 {
                let mut client = TcpStream::connect(addr).await.unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                let seen = seen_tx.clone();
                shards.spawn(stream, move |mut s| async move {
                    let thread = std::thread::current().name().map(str::to_owned);
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).await.unwrap();
                    s.write_all(&[b[0] + 1]).await.unwrap();
                    seen.send(thread).unwrap();
                    // Hold the connection until the client closes it.
                    let _ = s.read(&mut b).await;
                });
                client.write_all(&[round]).await.unwrap();
                let mut b = [0u8; 1];
                client.read_exact(&mut b).await.unwrap();
                assert_eq!(b[0], round + 1);
                let thread = seen_rx.recv().await.unwrap().unwrap_or_default();
                assert!(thread.starts_with("shard-test-"), "served on {thread}");
                clients.push(client);
            }
            let mut loads = shards.loads();
            loads.sort();
            assert_eq!(loads, vec![1, 2], "three connections over two runtimes");
            drop(clients);
            for _ in 0..500 {
                if shards.loads() == vec![0, 0] {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(
                shards.loads(),
                vec![0, 0],
                "ended connections leave their runtime"
            );
        });
    }

    #[tokio::test]
    async fn without_runtimes_connections_run_on_the_callers() {
        let shards = Shards::new(Vec::new());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        shards.spawn(stream, |mut s| async move {
            s.write_all(b"x").await.unwrap();
        });
        let mut b = [0u8; 1];
        client.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"x");
    }
}
