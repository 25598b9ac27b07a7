//! Answering a connection's requests: each one run against the device
//! and its reply queued, reads sent from the file's pages where they may
//! be, large writes placed into them.

use std::cell::Cell;

use export::Backing;

use crate::alone::LOCKSTEP_PLACED_MIN;
use crate::exports::{ExportCounters, Served};
use crate::gather::Taken;
use crate::ops::{self, Outcome, ReadShape};
use crate::outbox::Outbox;
use crate::placed::{PlacedWrite, PLACED_WRITE_MIN};
use crate::proto::*;
use crate::reply::{self, Answering};
use crate::transmission::{count, run_guarded};
use crate::wire::{self, Agreed, Command, Framing, RequestHeader};

/// How requests are answered on this connection.
pub(super) struct Answerer<'a> {
    pub(super) backing: &'a Backing,
    pub(super) counters: &'a ExportCounters,
    pub(super) agreed: &'a Agreed,
    pub(super) framing: Framing,
    /// Whether reply bytes may come from the device file's pages: only
    /// where the kernel reads them (a plain socket), as a page gone from
    /// under the mapping faults in user space (TLS would encrypt there).
    pub(super) zero_copy: bool,
    /// Requests taken so far, for the spin policy's trials.
    pub(super) requests: Cell<u64>,
    /// Their bytes on the wire, for gathering.
    pub(super) request_bytes: Cell<u64>,
}

impl<'a> Answerer<'a> {
    pub(super) fn new(served: &'a Served, agreed: &'a Agreed, zero_copy: bool) -> Answerer<'a> {
        Answerer {
            backing: &served.export.backing,
            counters: &served.counters,
            agreed,
            framing: Framing::of(agreed),
            zero_copy,
            requests: Cell::new(0),
            request_bytes: Cell::new(0),
        }
    }

    /// A request of `bytes` on the wire is taken.
    pub(super) fn taking(&self, bytes: usize) {
        self.request_bytes
            .set(self.request_bytes.get() + bytes as u64);
    }

    /// What was taken so far.
    pub(super) fn taken(&self) -> Taken {
        Taken::new(self.requests.get(), self.request_bytes.get())
    }

    /// Runs request `h` with its `payload` and queues its reply; true for
    /// NBD_CMD_DISC, which has none.
    pub(super) fn answer(&self, h: &RequestHeader, payload: &[u8], out: &mut Outbox<'a>) -> bool {
        self.requests.set(self.requests.get() + 1);
        let req = Answering {
            cookie: h.cookie,
            offset: h.offset,
        };
        let cmd = match wire::check_request(h, self.agreed) {
            Ok(Command::Disconnect) => return true,
            Ok(cmd) => cmd,
            Err(refused) => {
                ExportCounters::add(&self.counters.requests().errors, 1);
                let outcome = Outcome::Failed {
                    error: refused.error,
                    message: refused.why.to_string(),
                };
                self.queue(req, outcome, out);
                return false;
            }
        };
        let shape = match (self.framing, cmd) {
            (Framing::Simple, _) | (_, Command::Read { df: true, .. }) => ReadShape::Whole,
            _ => ReadShape::Sparse,
        };
        if let Command::Read { offset, len, .. } = cmd {
            let len = len as usize;
            if len > 0 && ops::reads_whole(&**self.backing.device(), len, shape) {
                let outcome = self.read_whole(req, offset, len, out);
                count(self.counters, cmd, &outcome);
                if !matches!(outcome, Outcome::Done) {
                    self.queue(req, outcome, out);
                }
                return false;
            }
        }
        let outcome = run_guarded(self.backing, cmd, payload, shape);
        count(self.counters, cmd, &outcome);
        self.queue(req, outcome, out);
        false
    }

    /// Whether write payloads can be received into the file's pages: a
    /// device with a memory map, on a plain socket.
    pub(super) fn places_writes(&self) -> bool {
        self.zero_copy && self.backing.device().memory_map().is_some()
    }

    /// A write of `payload_len` bytes, not all of them in the buffer yet,
    /// to receive straight into the file's pages; `None` where it is
    /// refused (answered once its payload is in), too short to gain from
    /// it, or the device or the stream cannot.
    pub(super) fn place(
        &self,
        h: &RequestHeader,
        payload_len: usize,
        lockstep: bool,
    ) -> Option<PlacedWrite> {
        let least = if lockstep {
            LOCKSTEP_PLACED_MIN
        } else {
            PLACED_WRITE_MIN
        };
        if payload_len < least || !self.places_writes() {
            return None;
        }
        let Ok(Command::Write { offset, len, fua }) = wire::check_request(h, self.agreed) else {
            return None;
        };
        Some(PlacedWrite::new(h.cookie, offset, len as usize, fua))
    }

    /// Answers a placed write whose payload is all in.
    pub(super) fn finish_placed(&self, p: PlacedWrite, out: &mut Outbox<'a>) {
        self.requests.set(self.requests.get() + 1);
        let req = Answering {
            cookie: p.cookie,
            offset: p.offset,
        };
        let cmd = p.command();
        let outcome = p.finish(self.backing);
        count(self.counters, cmd, &outcome);
        self.queue(req, outcome, out);
    }

    /// Queues the reply of `outcome`; `Done` straight into the scratch
    /// buffer, the rest as the reply module frames it.
    pub(super) fn queue(&self, req: Answering, outcome: Outcome, out: &mut Outbox<'a>) {
        if let Outcome::Done = outcome {
            let mark = out.mark();
            reply::put_done(self.framing, req, out.scratch());
            out.commit(mark);
            return;
        }
        for part in reply::encode(self.framing, req, outcome) {
            out.push_owned(part);
        }
    }

    /// A read answered as one run of data, from the file's pages where
    /// the device offers them, otherwise read into the scratch buffer.
    /// `Done` once its reply is queued.
    pub(super) fn read_whole(
        &self,
        req: Answering,
        offset: u64,
        len: usize,
        out: &mut Outbox<'a>,
    ) -> Outcome {
        let device = self.backing.device();
        // Held like every transport's read (a COMPARE AND WRITE of these
        // bytes cannot interleave with taking them).
        let _held = self.backing.locks.lock(offset, len as u64, false);
        let mark = out.mark();
        let b = out.scratch();
        match self.framing {
            Framing::Simple => wire::put_simple_reply(b, 0, req.cookie),
            f => {
                wire::put_chunk_header(
                    b,
                    f == Framing::Extended,
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    req.cookie,
                    req.offset,
                    8 + len as u64,
                );
                b.extend_from_slice(&offset.to_be_bytes());
            }
        }
        if self.zero_copy {
            if let Some(bytes) = device.memory_map().and_then(|m| m.lend(offset, len)) {
                out.commit(mark);
                out.push_lent(bytes);
                return Outcome::Done;
            }
            if let Some(bytes) = device.mapped_bytes(offset, len) {
                out.commit(mark);
                out.push_mapped(bytes);
                return Outcome::Done;
            }
        }
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            device.read_at(out.scratch_space(len), offset)
        }));
        match read {
            Ok(Ok(())) => {
                out.commit(mark);
                Outcome::Done
            }
            Ok(Err(e)) => {
                out.undo(mark);
                Outcome::Failed {
                    error: ops::errno(&e),
                    message: e.to_string(),
                }
            }
            Err(_) => {
                out.undo(mark);
                Outcome::Failed {
                    error: EIO,
                    message: "the device call failed".into(),
                }
            }
        }
    }
}
