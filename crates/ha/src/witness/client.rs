//! A node's side of the witness: one authenticated request and its
//! answer, bounded in time. [`BlockingClient`] runs the requests on a
//! thread of its own, so that the mirror's write path (which may run on
//! any thread, the daemon's runtime's included) can wait for an answer
//! without depending on that runtime.

use std::io;
use std::sync::mpsc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::wire::{self, Answer, Request, MAX_MESSAGE, WITNESS_NAME};
use crate::link::handshake;

#[derive(Clone)]
pub struct WitnessClient {
    /// The witness's `host:port`.
    pub address: String,
    /// This node's name, proved with `secret`.
    pub node: String,
    pub secret: Vec<u8>,
    /// How long one request may take, connecting included.
    pub timeout: Duration,
}

impl std::fmt::Debug for WitnessClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WitnessClient")
            .field("address", &self.address)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl WitnessClient {
    /// Sends `req` over a new connection and returns the answer.
    pub async fn ask(&self, req: &Request) -> io::Result<Answer> {
        let exchange = async {
            let mut s = TcpStream::connect(&self.address).await?;
            s.set_nodelay(true)?;
            handshake::dial(&mut s, &self.node, WITNESS_NAME, &self.secret).await?;
            let (kind, payload) = req.encode();
            s.write_all(&crate::wire::encode(kind, &payload)).await?;
            let f = crate::wire::read_frame(&mut s, MAX_MESSAGE).await?;
            if f.kind != wire::ANSWER {
                return Err(crate::wire::malformed(format!("witness frame {}", f.kind)));
            }
            wire::decode_answer(&f.payload)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the witness at {} did not answer", self.address),
                )
            })?
    }
}

type Job = (Request, mpsc::Sender<io::Result<Answer>>);

/// Requests to the witness from any thread, carried out one at a time
/// on a thread with a runtime of its own.
pub struct BlockingClient {
    jobs: mpsc::SyncSender<Job>,
    timeout: Duration,
}

impl BlockingClient {
    pub fn new(client: WitnessClient) -> io::Result<BlockingClient> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(64);
        let timeout = client.timeout;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("witness-client".into())
            .spawn(move || {
                for (req, reply) in rx {
                    let _ = reply.send(rt.block_on(client.ask(&req)));
                }
            })?;
        Ok(BlockingClient { jobs, timeout })
    }

    /// The answer to `req`; an error when the witness cannot be reached
    /// or does not answer in time (requests queued before it count).
    pub fn ask(&self, req: Request) -> io::Result<Answer> {
        let (tx, rx) = mpsc::channel();
        self.jobs.try_send((req, tx)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                "too many witness requests queued",
            )
        })?;
        rx.recv_timeout(self.timeout * 2).map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the witness did not answer in time",
            )
        })?
    }

    /// Sends `req` without waiting for the answer.
    pub fn send(&self, req: Request) {
        let (tx, _) = mpsc::channel();
        let _ = self.jobs.try_send((req, tx));
    }
}
