//! One TCP connection, which is one queue: initialization (ICReq,
//! ICResp), then PDUs read and handed to the queue, replies written by a
//! task of their own under a write deadline. Input that breaks the
//! framing ends the connection with a C2HTermReq, and only it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use peer_limits::{write_deadline, OutgoingBudget, PreLoginTicket};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::outbox::{Backlog, Completer, Out};
use crate::queue::{End, Queue};
use crate::server::Context;
use crate::wire::{self, fes, kind, Digests, Fatal, IcResp, Pdu};

/// What a host may send.
pub(crate) const HOST_SENDS: &[u8] = &[
    kind::IC_REQ,
    kind::H2C_TERM,
    kind::CAPSULE_CMD,
    kind::H2C_DATA,
];

/// Bytes read from a host's socket at once.
const READ_BUFFER: usize = 64 << 10;

/// Why reading a PDU stopped.
pub(crate) enum ReadError {
    /// The framing broke: the termination request's content, and the
    /// header read so far.
    Fatal(Fatal, Vec<u8>),
    Io(std::io::Error),
}

/// Reads one whole PDU: the common header, its checks, then the rest.
pub(crate) async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    accepted: &[u8],
    digests: Digests,
    max_plen: u32,
) -> Result<Pdu, ReadError> {
    let mut head = [0u8; wire::COMMON_LEN];
    r.read_exact(&mut head).await.map_err(ReadError::Io)?;
    let c = wire::common(&head);
    let plen = wire::check_common(&c, accepted, digests, max_plen)
        .map_err(|f| ReadError::Fatal(f, head.to_vec()))?;
    let mut b = vec![0u8; plen];
    b[..wire::COMMON_LEN].copy_from_slice(&head);
    r.read_exact(&mut b[wire::COMMON_LEN..])
        .await
        .map_err(ReadError::Io)?;
    wire::decode(&b, digests).map_err(|f| {
        let header = b[..plen.min(wire::TERM_MAX_DATA)].to_vec();
        ReadError::Fatal(f, header)
    })
}

/// Writes what the queue sends, a batch of PDUs per write, until told
/// to close or the host stops reading.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Out>,
    budget: Arc<OutgoingBudget>,
    backlog: Arc<Backlog>,
    deadline: Duration,
) {
    const BATCH: usize = 256 << 10;
    let mut buf = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut taken = first.taken;
        let mut close = first.bytes.is_empty();
        // A PDU alone (a large read's data) is written as it is; only
        // several are copied together into one write.
        let mut alone = Some(first.bytes);
        buf.clear();
        while alone.as_ref().map_or(buf.len(), Vec::len) < BATCH && !close {
            let Ok(next) = rx.try_recv() else { break };
            if let Some(b) = alone.take() {
                buf.extend_from_slice(&b);
            }
            taken += next.taken;
            close = next.bytes.is_empty();
            buf.extend_from_slice(&next.bytes);
        }
        let bytes = alone.as_deref().unwrap_or(&buf);
        let r = write_deadline(deadline, w.write_all(bytes)).await;
        budget.give_back(taken);
        backlog.written(bytes.len());
        if let Err(e) = r {
            tracing::debug!("nvmf: writing to a host: {e}");
            budget.close();
            return;
        }
        if close {
            let _ = w.shutdown().await;
            return;
        }
    }
}

/// Initialization (TCP transport 3.6.2.2): the ICReq's checks and the
/// ICResp; the digests and the host's data alignment agreed.
async fn initialize(stream: &mut TcpStream, cx: &Context) -> Result<(Digests, usize), End> {
    let pdu = read_pdu(
        stream,
        &[kind::IC_REQ, kind::H2C_TERM],
        Digests::default(),
        512,
    )
    .await;
    let req = match pdu {
        Ok(Pdu::IcReq(req)) => req,
        Ok(_) => return Err(End::Closed("the host ended before initialization".into())),
        Err(ReadError::Io(e)) => return Err(End::Closed(e.to_string())),
        Err(ReadError::Fatal(f, h)) => return Err(End::Fatal(f, h)),
    };
    let bad = |fei, reason| {
        End::Fatal(
            Fatal {
                fes: fes::INVALID_HEADER_FIELD,
                fei,
                reason,
            },
            Vec::new(),
        )
    };
    if req.pfv != 0 {
        return Err(bad(8, "a PDU format version other than 0"));
    }
    if req.hpda > 31 {
        return Err(bad(10, "a host PDU data alignment above 31"));
    }
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: req.digests,
        maxh2cdata: cx.limits.max_h2c_data,
    };
    let deadline = cx.limits.write_deadline;
    write_deadline(deadline, stream.write_all(&wire::encode_ic_resp(&resp)))
        .await
        .map_err(|e| End::Closed(e.to_string()))?;
    Ok((req.digests, (usize::from(req.hpda) + 1) * 4))
}

/// Sends the termination request of `f` on a stream not yet split.
async fn terminate(stream: &mut TcpStream, f: &Fatal, header: &[u8], deadline: Duration) {
    let pdu = wire::encode_term(kind::C2H_TERM, f, header);
    let _ = write_deadline(deadline, stream.write_all(&pdu)).await;
    let _ = stream.shutdown().await;
}

/// Resolves when `rx` says true (or its sender is gone).
pub(crate) async fn until(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Resolves when `rx` says true; never without one.
async fn raised(rx: &mut Option<watch::Receiver<bool>>) {
    match rx {
        Some(rx) => until(rx).await,
        None => std::future::pending().await,
    }
}

/// One connection from accept to close.
pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    discovery_only: bool,
    cx: Arc<Context>,
    ticket: PreLoginTicket,
    mut stop: watch::Receiver<bool>,
) -> Result<(), End> {
    let limits = &cx.limits;
    let init = tokio::select! {
        r = tokio::time::timeout(limits.connect_timeout, initialize(&mut stream, &cx)) => match r {
            Ok(r) => r,
            Err(_) => Err(End::Closed("no ICReq in time".into())),
        },
        _ = ticket.evicted() => Err(End::Closed("evicted for a newer connection".into())),
        _ = crate::connection::until(&mut stop) => Err(End::Closed("shutting down".into())),
    };
    let (digests, align) = match init {
        Ok(d) => d,
        Err(End::Fatal(f, header)) => {
            terminate(&mut stream, &f, &header, limits.write_deadline).await;
            return Err(End::Fatal(f, header));
        }
        Err(e) => return Err(e),
    };
    let via = crate::fabrics::Via {
        local: stream.local_addr().ok(),
        discovery_only,
    };
    let (rd, wr) = stream.into_split();
    // Buffered: a PDU header and its rest, and the PDUs a host sent
    // together, come in one read instead of two per PDU.
    let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER, rd);
    let budget = Arc::new(OutgoingBudget::new(limits.outgoing_bytes));
    let (tx, rx) = mpsc::unbounded_channel();
    let backlog = Arc::new(Backlog::default());
    let mut writer = tokio::spawn(write_loop(
        wr,
        rx,
        budget.clone(),
        backlog.clone(),
        limits.write_deadline,
    ));
    let completer = Arc::new(Completer::new(tx, digests, align, budget.clone(), backlog));
    let mut queue = Queue::new(cx.clone(), peer, via, completer.clone(), Some(ticket));
    let max_pdu = limits.max_pdu();
    let mut ctrl_end: Option<watch::Receiver<bool>> = None;
    let connect_by = tokio::time::Instant::now() + limits.connect_timeout;
    let mut writer_done = false;
    let end = loop {
        let connected = queue.connected();
        if ctrl_end.is_none() {
            ctrl_end = queue.controller_ended();
        }
        let pdu = tokio::select! {
            r = read_pdu(&mut rd, HOST_SENDS, digests, max_pdu) => r,
            _ = raised(&mut ctrl_end) => break End::Closed("the controller ended".into()),
            _ = crate::connection::until(&mut stop) => break End::Closed("shutting down".into()),
            _ = &mut writer => {
                writer_done = true;
                break End::Stalled("the host stopped reading".into());
            }
            _ = tokio::time::sleep_until(connect_by), if !connected => break End::Closed("no Connect or authentication in time".into()),
            _ = queue.evicted(), if !connected => break End::Closed("evicted for a newer connection".into()),
        };
        let r = match pdu {
            Ok(pdu) => queue.on_pdu(pdu).await,
            Err(ReadError::Io(e)) => Err(End::Closed(e.to_string())),
            Err(ReadError::Fatal(f, h)) => Err(End::Fatal(f, h)),
        };
        if let Err(e) = r {
            break e;
        }
    };
    if let End::Stalled(_) = &end {
        // Before the answers it queued are freed: they go back to the
        // system rather than stay in the heaps.
        peer_limits::release_freed_memory();
    }
    if let End::Fatal(f, header) = &end {
        completer.send(wire::encode_term(kind::C2H_TERM, f, header), 0);
    }
    completer.send(Vec::new(), 0); // closes the connection once written
    queue.closed();
    // A writer that ended must not be polled again.
    if !writer_done
        && tokio::time::timeout(Duration::from_secs(2), &mut writer)
            .await
            .is_err()
    {
        writer.abort();
    }
    budget.close();
    match end {
        End::Closed(_) => Ok(()),
        e => Err(e),
    }
}
