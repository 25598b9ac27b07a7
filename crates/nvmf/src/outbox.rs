//! What a queue sends: PDUs handed to the connection's writer, and the
//! completions of its commands, each sent once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use peer_limits::OutgoingBudget;
use tokio::sync::{mpsc, Notify};

use crate::capsule::Cqe;
use crate::status::Status;
use crate::wire::{self, kind, DataHeader, Digests};

/// Most data bytes in one C2HData PDU.
const C2H_CHUNK: usize = 1 << 20;

/// A PDU for the writer, with what it took from the outgoing budget.
pub(crate) struct Out {
    pub bytes: Vec<u8>,
    pub taken: u32,
}

/// Bytes handed to the writer and not yet written. Every host PDU is
/// read only while this is under the connection's limit, so a host that
/// sends commands and reads no answers pins a bounded amount.
#[derive(Default)]
pub(crate) struct Backlog {
    bytes: AtomicUsize,
    drained: Notify,
}

impl Backlog {
    fn add(&self, n: usize) {
        self.bytes.fetch_add(n, Ordering::SeqCst);
    }

    pub(crate) fn written(&self, n: usize) {
        self.bytes.fetch_sub(n, Ordering::SeqCst);
        self.drained.notify_waiters();
    }

    pub(crate) fn queued(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    /// Waits until at most `limit` bytes wait; false when that takes
    /// longer than `deadline` (the host stopped reading).
    pub(crate) async fn below(&self, limit: usize, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.queued() <= limit {
                return true;
            }
            if tokio::time::timeout_at(until, drained).await.is_err() {
                return false;
            }
        }
    }
}

/// The sending side of one queue.
pub struct Completer {
    tx: mpsc::UnboundedSender<Out>,
    pub(crate) digests: Digests,
    /// The host's PDU data alignment in bytes.
    pub(crate) align: usize,
    pub(crate) budget: Arc<OutgoingBudget>,
    pub(crate) backlog: Arc<Backlog>,
    sqid: AtomicU16,
    /// Submission queue head: entries fetched, modulo the queue size.
    sqhd: AtomicU32,
    sq_entries: AtomicU32,
    /// The host turned SQ flow control off at Connect: completions carry
    /// no head, and a read's data PDU may stand for its completion.
    flow_off: AtomicBool,
    inflight: Mutex<HashSet<u16>>,
}

impl Completer {
    pub(crate) fn new(
        tx: mpsc::UnboundedSender<Out>,
        digests: Digests,
        align: usize,
        budget: Arc<OutgoingBudget>,
        backlog: Arc<Backlog>,
    ) -> Completer {
        Completer {
            tx,
            digests,
            align,
            budget,
            backlog,
            sqid: AtomicU16::new(0),
            sqhd: AtomicU32::new(0),
            sq_entries: AtomicU32::new(32),
            flow_off: AtomicBool::new(false),
            inflight: Mutex::new(HashSet::new()),
        }
    }

    /// The queue as Connect set it up.
    pub(crate) fn connected(&self, sqid: u16, entries: u32, flow_off: bool) {
        self.sqid.store(sqid, Ordering::Relaxed);
        self.sq_entries.store(entries.max(1), Ordering::Relaxed);
        self.flow_off.store(flow_off, Ordering::Relaxed);
    }

    pub(crate) fn sqid(&self) -> u16 {
        self.sqid.load(Ordering::Relaxed)
    }

    pub(crate) fn entries(&self) -> u32 {
        self.sq_entries.load(Ordering::Relaxed)
    }

    pub(crate) fn send(&self, bytes: Vec<u8>, taken: u32) -> bool {
        let len = bytes.len();
        self.backlog.add(len);
        let ok = self.tx.send(Out { bytes, taken }).is_ok();
        if !ok {
            self.budget.give_back(taken);
            self.backlog.written(len);
        }
        ok
    }

    /// A command was fetched: it is in flight until completed. False
    /// when its id is in flight already.
    pub(crate) fn fetched(&self, cid: u16) -> bool {
        let entries = self.entries();
        let _ = self
            .sqhd
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some((h + 1) % entries)
            });
        self.inflight.lock().insert(cid)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.inflight.lock().len()
    }

    fn cqe(&self, cid: u16, status: Status, result: u64) -> Vec<u8> {
        let sq_head = if self.flow_off.load(Ordering::Relaxed) {
            0
        } else {
            self.sqhd.load(Ordering::Relaxed) as u16
        };
        let cqe = Cqe {
            result,
            sq_head,
            sq_id: self.sqid(),
            cid,
            status,
        };
        wire::encode_response(&cqe.encode(), self.digests)
    }

    /// Completes `cid` with a response capsule.
    pub fn complete_now(&self, cid: u16, status: Status, result: u64) {
        self.inflight.lock().remove(&cid);
        self.send(self.cqe(cid, status, result), 0);
    }

    /// Answers a command that was never fetched as one (an id already in
    /// flight): its completion leaves the first one in flight.
    pub(crate) fn refuse(&self, cid: u16, status: Status) {
        self.send(self.cqe(cid, status, 0), 0);
    }

    /// Completes `cid`, sending `data` to the host first when it
    /// succeeded; `taken` is what the data took from the outgoing budget.
    pub(crate) fn complete_with_data(
        &self,
        cid: u16,
        status: Status,
        result: u64,
        data: &[u8],
        taken: u32,
    ) {
        if !status.is_success() || data.is_empty() {
            self.budget.give_back(taken);
            self.complete_now(cid, status, result);
            return;
        }
        let success_flag = self.flow_off.load(Ordering::Relaxed) && result == 0;
        if success_flag {
            // Out of flight before the data is sent: the host may reuse
            // the id as soon as it has the last PDU.
            self.inflight.lock().remove(&cid);
        }
        let chunks = data.len().div_ceil(C2H_CHUNK);
        for (i, chunk) in data.chunks(C2H_CHUNK).enumerate() {
            let last = i + 1 == chunks;
            let h = DataHeader {
                cccid: cid,
                ttag: 0,
                offset: (i * C2H_CHUNK) as u32,
                len: chunk.len() as u32,
                last,
                success: last && success_flag,
            };
            let pdu = wire::encode_data(kind::C2H_DATA, &h, chunk, self.digests, self.align);
            self.send(pdu, if last { taken } else { 0 });
        }
        if !success_flag {
            self.complete_now(cid, status, result);
        }
    }
}
