//! The transmission phase of one connection over a device that may
//! block: requests read in order, run concurrently on blocking threads,
//! answered as each finishes (plain reads and writes of a device that
//! answers on threads of its own go through [`crate::started_async`]).
//! Devices that never block are served by [`crate::batched`] instead.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use export::Backing;
use peer_limits::{write_deadline, OutgoingBudget};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::batched;
use crate::exports::ExportCounters;
use crate::handshake::Negotiated;
use crate::ops::{self, Outcome, ReadShape};
use crate::placed::RecvInto;
use crate::reply::{self, Answering};
use crate::started_async;
use crate::wire::{self, Command, Framing};
use crate::Limits;

/// Least a request costs in the in-flight budget, so that requests
/// without data are bounded in number too.
const MIN_COST: usize = 4096;

/// What a block status reply can take at most (extents of 16 bytes).
const STATUS_COST: usize = 1 << 20;

/// A reply ready to be written, and the budget it held.
struct Outgoing {
    parts: Vec<Bytes>,
    cost: u32,
}

/// What every connection of a server shares.
pub(crate) struct Shared {
    pub limits: Limits,
    /// Bounds the blocking threads running device calls, server-wide.
    pub device_slots: Arc<Semaphore>,
}

/// Why a connection ended other than by NBD_CMD_DISC or shutdown.
#[derive(Debug)]
pub(crate) struct Ended {
    pub reason: String,
    /// The client broke the protocol (as opposed to leaving or stalling).
    pub protocol: bool,
    /// The client accepted no reply bytes for the write deadline.
    pub stalled: bool,
}

pub(crate) fn gone(reason: String) -> Ended {
    Ended {
        reason,
        protocol: false,
        stalled: false,
    }
}

pub(crate) fn protocol_error(reason: String) -> Ended {
    Ended {
        protocol: true,
        ..gone(reason)
    }
}

/// The client stopped reading: its queued replies are about to be freed,
/// and given back to the system rather than kept in the heaps.
pub(crate) fn stalled(deadline: Duration) -> Ended {
    peer_limits::release_freed_memory();
    Ended {
        stalled: true,
        ..gone(format!(
            "the client read no replies for {} ms",
            deadline.as_millis()
        ))
    }
}

/// Aborts the task writing replies when transmission is dropped: a
/// shutdown that stops waiting for a stalled client must not leave the
/// writer holding the socket until its deadline.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs transmission until the client disconnects, breaks the protocol,
/// or the server shuts down. `Err` carries the reason to log.
pub(crate) async fn transmit<R, W>(
    reader: R,
    writer: W,
    negotiated: Negotiated,
    shared: Arc<Shared>,
    zero_copy: bool,
    mut shutdown: watch::Receiver<bool>,
    end: Arc<Notify>,
) -> Result<(), Ended>
where
    R: AsyncRead + RecvInto + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    if !negotiated.served.export.device().capabilities().may_block {
        let deadline = shared.limits.write_deadline;
        return batched::transmit(
            reader, writer, negotiated, deadline, zero_copy, shutdown, &end,
        )
        .await;
    }
    let Negotiated { served, agreed } = negotiated;
    let framing = Framing::of(&agreed);
    let budget = Arc::new(OutgoingBudget::new(shared.limits.in_flight_bytes));
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let writer_failed = Arc::new(Notify::new());
    let deadline = shared.limits.write_deadline;
    let writing = tokio::spawn(write_replies(
        writer,
        rx,
        budget.clone(),
        writer_failed.clone(),
        deadline,
    ));
    let _abort_writer = AbortOnDrop(writing.abort_handle());
    let backing = served.export.backing.clone();
    let counters = served.counters.clone();
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let header_len = wire::request_header_len(agreed.extended);
    let mut header = [0u8; 32];
    let ended: Result<(), Ended> = loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break Ok(()),
            _ = writer_failed.notified() => break Ok(()),
            _ = end.notified() => break Ok(()),
            r = reader.read_exact(&mut header[..header_len]) => match r {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    break Err(gone("the client closed the connection without NBD_CMD_DISC".into()))
                }
                Err(e) => break Err(gone(format!("reading a request: {e}"))),
            },
        }
        let h = match wire::decode_request(
            &header[..header_len],
            agreed.extended,
            agreed.max_payload,
        ) {
            Ok(h) => h,
            Err(e) => break Err(protocol_error(format!("malformed request: {e}"))),
        };
        let payload_len = h.payload_len(agreed.extended) as usize;
        let checked = wire::check_request(&h, &agreed);
        let cost = match checked {
            Ok(Command::Read { len, .. }) => len as usize,
            Ok(Command::BlockStatus { .. }) => STATUS_COST,
            _ => payload_len,
        }
        .max(MIN_COST);
        // Waits while the connection has its fill of bytes in flight; the
        // writer closes the budget if the client stops reading replies.
        let Ok(taken) = budget.take(cost, Duration::from_secs(24 * 3600)).await else {
            break Err(gone("the client stopped reading replies".into()));
        };
        let mut payload = vec![0; payload_len];
        if let Err(e) = reader.read_exact(&mut payload).await {
            budget.give_back(taken);
            break Err(gone(format!("reading a write's data: {e}")));
        }
        let answering = Answering {
            cookie: h.cookie,
            offset: h.offset,
        };
        let cmd = match checked {
            Ok(Command::Disconnect) => {
                budget.give_back(taken);
                break Ok(());
            }
            Ok(cmd) => cmd,
            Err(refused) => {
                ExportCounters::add(&counters.requests().errors, 1);
                let outcome = Outcome::Failed {
                    error: refused.error,
                    message: refused.why.to_string(),
                };
                let parts = reply::encode(framing, answering, outcome);
                let _ = tx.send(Outgoing { parts, cost: taken });
                continue;
            }
        };
        let shape = match (framing, cmd) {
            (Framing::Simple, _) | (_, Command::Read { df: true, .. }) => ReadShape::Whole,
            _ => ReadShape::Sparse,
        };
        let finish = {
            let (counters, tx) = (counters.clone(), tx.clone());
            move |outcome: Outcome| {
                count(&counters, cmd, &outcome);
                let parts = reply::encode(framing, answering, outcome);
                let _ = tx.send(Outgoing { parts, cost: taken });
            }
        };
        let payload = match started_async::start(&backing, cmd, payload, shape, finish) {
            Ok(()) => continue,
            Err(payload) => payload,
        };
        let backing = backing.clone();
        let counters = counters.clone();
        let tx = tx.clone();
        // The whole request, from the device call to the queued reply, in
        // one closure: on a blocking thread it needs no task of its own.
        let answer = move || {
            let outcome = run_guarded(&backing, cmd, &payload, shape);
            count(&counters, cmd, &outcome);
            let parts = reply::encode(framing, answering, outcome);
            let _ = tx.send(Outgoing { parts, cost: taken });
        };
        // Waiting here for a free device thread holds back reading
        // further requests, as a full pool should.
        let Ok(slot) = shared.device_slots.clone().acquire_owned().await else {
            break Ok(());
        };
        tokio::task::spawn_blocking(move || {
            answer();
            drop(slot);
        });
    };
    // Requests still running hold senders; the writer ends once they
    // have all answered.
    drop(tx);
    let written = writing
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
    match (ended, written) {
        (_, Err(e)) if e.kind() == io::ErrorKind::TimedOut => Err(stalled(deadline)),
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(gone(format!("writing replies: {e}"))),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// Runs a command, a panic in the device becoming an I/O error for this
/// request instead of a reply that never comes.
pub(crate) fn run_guarded(
    backing: &Backing,
    cmd: Command,
    payload: &[u8],
    shape: ReadShape,
) -> Outcome {
    let run = std::panic::AssertUnwindSafe(|| ops::run_on(backing, cmd, payload, shape));
    std::panic::catch_unwind(run).unwrap_or_else(|_| Outcome::Failed {
        error: crate::proto::EIO,
        message: "the device call failed".into(),
    })
}

pub(crate) fn count(c: &ExportCounters, cmd: Command, outcome: &Outcome) {
    let c = c.requests();
    if matches!(outcome, Outcome::Failed { .. }) {
        ExportCounters::add(&c.errors, 1);
        return;
    }
    match cmd {
        Command::Read { len, .. } => {
            ExportCounters::add(&c.reads, 1);
            ExportCounters::add(&c.read_bytes, len);
        }
        Command::Write { len, .. } => {
            ExportCounters::add(&c.writes, 1);
            ExportCounters::add(&c.write_bytes, len);
        }
        Command::Flush => ExportCounters::add(&c.flushes, 1),
        Command::Trim { .. } => ExportCounters::add(&c.trims, 1),
        Command::WriteZeroes { .. } => ExportCounters::add(&c.zeroes, 1),
        Command::BlockStatus { .. } => ExportCounters::add(&c.block_status, 1),
        Command::Cache { .. } | Command::Disconnect => {}
    }
}

/// Writes replies as they come, flushing when none is waiting, and gives
/// their bytes back to the budget once written. A client that accepts no
/// data within the deadline ends the connection.
async fn write_replies<W: AsyncWrite + Unpin>(
    writer: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    budget: Arc<OutgoingBudget>,
    failed: Arc<Notify>,
    deadline: Duration,
) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(256 * 1024, writer);
    let result = async {
        while let Some(first) = rx.recv().await {
            let mut next = Some(first);
            while let Some(item) = next {
                for part in &item.parts {
                    write_deadline(deadline, out.write_all(part)).await?;
                }
                budget.give_back(item.cost);
                next = rx.try_recv().ok();
            }
            write_deadline(deadline, out.flush()).await?;
        }
        write_deadline(deadline, out.shutdown()).await
    }
    .await;
    if result
        .as_ref()
        .is_err_and(|e| e.kind() == io::ErrorKind::TimedOut)
    {
        // Before the queue below is dropped.
        peer_limits::release_freed_memory();
    }
    if result.is_err() {
        // Wakes the reader, waiting for budget or for a request: the
        // connection is over.
        budget.close();
        failed.notify_one();
    }
    result
}
