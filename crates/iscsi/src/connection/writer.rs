//! The write side of a connection: it owns the socket's write half, stamps
//! StatSN, ExpCmdSN and MaxCmdSN as PDUs leave, gathers whatever is queued
//! and sends it with vectored writes, giving back the outgoing budget as
//! bytes reach the socket and giving up on a peer that takes none.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use peer_limits::{write_deadline, OutgoingBudget};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use scsi_api::FileRegion;

use super::sink::{self, Sink};
use crate::cmdsn::CmdWindow;
use crate::pdu::target::stamp_sequence_numbers;
use crate::pdu::{self, Bhs, Framing};

/// How a PDU uses the connection's StatSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatSn {
    /// Carries a status: takes the next StatSN.
    Advance,
    /// Carries the next StatSN without consuming it (R2T, NOP-In ping).
    Peek,
    /// StatSN field is reserved (Data-In without status).
    Reserved,
}

/// A PDU waiting to be written.
#[derive(Debug)]
pub(crate) struct OutPdu {
    pub bhs: Bhs,
    pub data: Bytes,
    pub statsn: StatSn,
    /// The final response of a command holding a CmdSN window slot.
    pub frees_window_slot: bool,
    /// Data sent from a file's pages instead of `data` (then empty).
    pub file: Option<FileRegion>,
    /// `data` is a file's pages through a mapping, copied only when sent.
    pub file_pages: bool,
    /// What it took of the connection's outgoing budget.
    pub charged: u32,
}

impl OutPdu {
    pub fn new(bhs: Bhs, data: Bytes, statsn: StatSn) -> OutPdu {
        OutPdu {
            bhs,
            data,
            statsn,
            frees_window_slot: false,
            file: None,
            file_pages: false,
            charged: 0,
        }
    }

    /// Memory it holds in the outgoing queue, header included. File pages
    /// are not counted: the queue holds only a reference to the file.
    pub fn queued_bytes(&self) -> usize {
        pdu::BHS_LEN + self.data.len()
    }

    /// Whether a write started after this PDU was queued could still
    /// change what the initiator gets (see connection/gate.rs).
    pub fn sends_file_pages(&self) -> bool {
        self.file.is_some() || self.file_pages
    }
}

/// What the writer is asked to do.
#[derive(Debug)]
pub(crate) enum Outgoing {
    Pdu(OutPdu),
    /// Write everything queued before this, then shut the socket down.
    Close(Option<oneshot::Sender<()>>),
}

/// Largest batch gathered into one vectored write.
const MAX_BATCH_PDUS: usize = 64;
const MAX_BATCH_BYTES: usize = 4 << 20;

/// A piece of a batch: a header, shared data, a short trailer, or file
/// pages.
enum Piece {
    Header(pdu::WireHeader),
    Data(Bytes),
    Trailer([u8; 8], usize),
    File(FileRegion),
}

impl Piece {
    fn as_slice(&self) -> &[u8] {
        match self {
            Piece::Header(h) => h.as_slice(),
            Piece::Data(b) => b,
            Piece::Trailer(t, n) => &t[..*n],
            Piece::File(_) => &[],
        }
    }
}

/// Write-side state of a connection.
pub(crate) struct Writer<W> {
    w: W,
    framing: Framing,
    statsn: u32,
    window: Arc<Mutex<CmdWindow>>,
    /// Given back what the written PDUs took; closed when the writer ends.
    budget: Option<Arc<OutgoingBudget>>,
    /// Longest a write may make no progress.
    deadline: Duration,
}

impl<W: Sink> Writer<W> {
    pub fn new(w: W, framing: Framing, first_statsn: u32, window: Arc<Mutex<CmdWindow>>) -> Self {
        Writer {
            w,
            framing,
            statsn: first_statsn,
            window,
            budget: None,
            deadline: Duration::MAX,
        }
    }

    /// Give back to `budget` what written PDUs took, and give up on a
    /// peer that accepts no bytes for `deadline`.
    pub fn limited(mut self, budget: Arc<OutgoingBudget>, deadline: Duration) -> Self {
        self.budget = Some(budget);
        self.deadline = deadline;
        self
    }

    fn stamp(&mut self, pdu: &mut OutPdu) {
        let (exp, max) = {
            let mut w = self.window.lock();
            if pdu.frees_window_slot {
                w.finished();
            }
            (w.exp_cmdsn(), w.max_cmdsn())
        };
        let statsn = match pdu.statsn {
            StatSn::Advance => {
                let sn = self.statsn;
                self.statsn = self.statsn.wrapping_add(1);
                Some(sn)
            }
            StatSn::Peek => Some(self.statsn),
            StatSn::Reserved => None,
        };
        stamp_sequence_numbers(&mut pdu.bhs, statsn, exp, max);
    }

    /// Stamp `pdu` and add its pieces to the batch; returns its size. Fails
    /// only when file data that needs a digest cannot be read.
    fn append(&mut self, mut pdu: OutPdu, pieces: &mut Vec<Piece>) -> io::Result<usize> {
        self.stamp(&mut pdu);
        if let Some(region) = pdu.file.take() {
            if !self.framing.data_digest {
                let header = pdu::wire_header(&pdu.bhs, region.len, self.framing.header_digest);
                let padding = pdu::padding_for(region.len);
                let size = header.as_slice().len() + region.len + padding;
                pieces.push(Piece::Header(header));
                pieces.push(Piece::File(region));
                if padding > 0 {
                    pieces.push(Piece::Trailer([0; 8], padding));
                }
                return Ok(size);
            }
            // The digest needs the bytes. The SCSI layer is not asked for
            // regions on such connections; this keeps the writer correct
            // whatever it is handed.
            pdu.data = Bytes::from(region.read()?);
        }
        let header = pdu::wire_header(&pdu.bhs, pdu.data.len(), self.framing.header_digest);
        let (trailer, n) = pdu::encode_trailer(&pdu.data, self.framing.data_digest);
        let size = header.as_slice().len() + pdu.data.len() + n;
        pieces.push(Piece::Header(header));
        if !pdu.data.is_empty() {
            pieces.push(Piece::Data(pdu.data));
        }
        if n > 0 {
            pieces.push(Piece::Trailer(trailer, n));
        }
        Ok(size)
    }

    /// Write a batch: runs of memory pieces with vectored writes, file
    /// pieces from their pages, corked so headers share segments with
    /// the pages after them.
    async fn write_pieces(&mut self, pieces: &[Piece]) -> io::Result<()> {
        let has_file = pieces.iter().any(|p| matches!(p, Piece::File(_)));
        if has_file {
            sink::cork(&self.w, true);
        }
        let mut result = Ok(());
        for run in pieces.split_inclusive(|p| matches!(p, Piece::File(_))) {
            let (memory, file) = match run.split_last() {
                Some((Piece::File(region), memory)) => (memory, Some(region)),
                _ => (run, None),
            };
            result = self.write_memory(memory).await;
            if let (Ok(()), Some(region)) = (&result, file) {
                result = sink::send_region(&mut self.w, region, self.deadline).await;
            }
            if result.is_err() {
                break;
            }
        }
        if has_file {
            sink::cork(&self.w, false);
        }
        result
    }

    async fn write_memory(&mut self, pieces: &[Piece]) -> io::Result<()> {
        // Position of the first unwritten byte: piece index and offset in it.
        let mut idx = 0;
        let mut off = 0;
        while idx < pieces.len() {
            let first = &pieces[idx].as_slice()[off..];
            let slices: Vec<IoSlice<'_>> = std::iter::once(first)
                .chain(pieces[idx + 1..].iter().map(Piece::as_slice))
                .map(IoSlice::new)
                .collect();
            let mut n = write_deadline(self.deadline, self.w.write_vectored(&slices)).await?;
            if n == 0 && slices.iter().any(|s| !s.is_empty()) {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while idx < pieces.len() {
                let rest = pieces[idx].as_slice().len() - off;
                if n < rest {
                    off += n;
                    break;
                }
                n -= rest;
                idx += 1;
                off = 0;
            }
        }
        Ok(())
    }

    /// Run until told to close, the channel ends, or a write fails or
    /// stalls; then close the budget, so that a sender waiting on it learns
    /// at once.
    /// Returns the write error that ended it, if one did.
    pub async fn run(mut self, rx: mpsc::Receiver<Outgoing>) -> Option<io::Error> {
        let ended = self.write_all_queued(rx).await;
        if let Some(budget) = &self.budget {
            budget.close();
        }
        ended
    }

    async fn write_all_queued(&mut self, mut rx: mpsc::Receiver<Outgoing>) -> Option<io::Error> {
        let mut pieces = Vec::new();
        while let Some(first) = rx.recv().await {
            let mut close = None;
            let mut bytes = 0;
            let mut count = 0;
            let mut charged = 0u64;
            let mut next = Some(first);
            while let Some(item) = next.take() {
                match item {
                    Outgoing::Pdu(p) => {
                        charged += u64::from(p.charged);
                        match self.append(p, &mut pieces) {
                            Ok(size) => bytes += size,
                            Err(e) => {
                                tracing::error!(error = %e, "cannot read a READ's data from its file, closing connection");
                                return None;
                            }
                        }
                    }
                    Outgoing::Close(ack) => close = Some(ack),
                }
                count += 1;
                if close.is_none() && count < MAX_BATCH_PDUS && bytes < MAX_BATCH_BYTES {
                    next = rx.try_recv().ok();
                }
            }
            let result = self.write_pieces(&pieces).await;
            pieces.clear();
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection write failed");
                return Some(e);
            }
            if let Some(budget) = &self.budget {
                budget.give_back(charged.min(u64::from(u32::MAX)) as u32);
            }
            if let Some(ack) = close {
                let _ = self.w.flush().await;
                let _ = self.w.shutdown().await;
                if let Some(ack) = ack {
                    let _ = ack.send(());
                }
                return None;
            }
        }
        None
    }
}
