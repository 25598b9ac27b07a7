//! Replies waiting to be written, as one list of byte runs that a single
//! `writev` sends: reply headers and copied data in one scratch buffer
//! reused from batch to batch, and a read's data straight from the pages
//! of the device's file where it offers them.

use std::collections::VecDeque;
use std::io::IoSlice;

use block::{LentBytes, MappedBytes};
use bytes::Bytes;

/// One run of bytes of the outgoing stream.
enum Run<'a> {
    /// `start..end` of the scratch buffer.
    Scratch { start: usize, end: usize },
    /// Pages of the device's file, copied by the kernel when sent.
    Mapped(MappedBytes),
    /// The same, from a mapping the connection's device keeps.
    Lent(LentBytes<'a>),
    /// Bytes built elsewhere (rare replies: errors, block status, holes).
    Owned(Bytes),
}

/// Byte runs handed to one `writev` (IOV_MAX is 1024).
const SLOTS: usize = 256;

/// Runs a reply or two take (a read: its header and its data): slots for
/// these many are all a connection answering one request at a time
/// fills, and setting up all [`SLOTS`] of them costs more than its
/// request's parsing.
const FEW_SLOTS: usize = 4;

/// A scratch buffer grown past this is given back once emptied, so that
/// one large read does not keep its memory for the connection's life.
const SCRATCH_KEPT: usize = 8 << 20;

#[derive(Default)]
pub(crate) struct Outbox<'a> {
    scratch: Vec<u8>,
    runs: VecDeque<Run<'a>>,
    /// Bytes of the first run already written.
    sent_of_first: usize,
    /// Bytes not yet written.
    queued: usize,
    /// Everything is written but the stream may still buffer some.
    unflushed: bool,
}

impl<'a> Outbox<'a> {
    pub fn queued(&self) -> usize {
        self.queued
    }

    pub fn unflushed(&self) -> bool {
        self.unflushed
    }

    pub fn flushed(&mut self) {
        self.unflushed = false;
    }

    /// Where the next scratch bytes go: a mark to [`Outbox::commit`] or
    /// [`Outbox::undo`] them from.
    pub fn mark(&self) -> usize {
        self.scratch.len()
    }

    /// The scratch buffer to append to; nothing appended is sent until
    /// [`Outbox::commit`].
    pub fn scratch(&mut self) -> &mut Vec<u8> {
        &mut self.scratch
    }

    /// `len` more scratch bytes (zeros) to fill, e.g. with a read.
    pub fn scratch_space(&mut self, len: usize) -> &mut [u8] {
        let at = self.scratch.len();
        self.scratch.resize(at + len, 0);
        &mut self.scratch[at..]
    }

    /// Drops what was appended to the scratch buffer since `mark`.
    pub fn undo(&mut self, mark: usize) {
        self.scratch.truncate(mark);
    }

    /// Queues the scratch bytes appended since `mark`, joined to the run
    /// before them when that ends where they start.
    pub fn commit(&mut self, mark: usize) {
        let end = self.scratch.len();
        if end == mark {
            return;
        }
        self.queued += end - mark;
        if let Some(Run::Scratch { end: last, .. }) = self.runs.back_mut() {
            if *last == mark {
                *last = end;
                return;
            }
        }
        self.runs.push_back(Run::Scratch { start: mark, end });
    }

    pub fn push_mapped(&mut self, bytes: MappedBytes) {
        self.queued += bytes.as_ref().len();
        self.runs.push_back(Run::Mapped(bytes));
    }

    pub fn push_lent(&mut self, bytes: LentBytes<'a>) {
        self.queued += bytes.as_ref().len();
        self.runs.push_back(Run::Lent(bytes));
    }

    pub fn push_owned(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        self.queued += bytes.len();
        self.runs.push_back(Run::Owned(bytes));
    }

    /// Calls `write` with the unwritten bytes, in order, as up to
    /// [`SLOTS`] slices.
    pub fn with_slices<R>(&self, write: impl FnOnce(&[IoSlice<'_>]) -> R) -> R {
        if self.runs.len() <= FEW_SLOTS {
            let mut slots = [IoSlice::new(&[]); FEW_SLOTS];
            let n = self.slices(&mut slots);
            write(&slots[..n])
        } else {
            let mut slots = [IoSlice::new(&[]); SLOTS];
            let n = self.slices(&mut slots);
            write(&slots[..n])
        }
    }

    /// The unwritten bytes, in order, in as many of `slots` as they fill;
    /// returns how many.
    fn slices<'s>(&'s self, slots: &mut [IoSlice<'s>]) -> usize {
        let mut n = 0;
        for (i, run) in self.runs.iter().enumerate() {
            if n == slots.len() {
                break;
            }
            let bytes: &[u8] = match run {
                Run::Scratch { start, end } => &self.scratch[*start..*end],
                Run::Mapped(m) => m.as_ref(),
                Run::Lent(l) => l.as_ref(),
                Run::Owned(b) => b,
            };
            let skip = if i == 0 { self.sent_of_first } else { 0 };
            slots[n] = IoSlice::new(&bytes[skip..]);
            n += 1;
        }
        n
    }

    /// Counts `n` bytes as written, dropping the runs they complete.
    pub fn advance(&mut self, mut n: usize) {
        self.queued -= n;
        while n > 0 {
            let first = self.runs.front().expect("written bytes were queued");
            let left = run_len(first) - self.sent_of_first;
            if n < left {
                self.sent_of_first += n;
                return;
            }
            n -= left;
            self.sent_of_first = 0;
            self.runs.pop_front();
        }
        if self.runs.is_empty() {
            self.unflushed = true;
            self.scratch.clear();
            if self.scratch.capacity() > SCRATCH_KEPT {
                self.scratch.shrink_to(SCRATCH_KEPT);
            }
        }
    }
}

fn run_len(run: &Run<'_>) -> usize {
    match run {
        Run::Scratch { start, end } => end - start,
        Run::Mapped(m) => m.as_ref().len(),
        Run::Lent(l) => l.as_ref().len(),
        Run::Owned(b) => b.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unwritten(o: &Outbox) -> Vec<u8> {
        let mut slots = [IoSlice::new(&[]); 8];
        let n = o.slices(&mut slots);
        slots[..n].iter().flat_map(|s| s.to_vec()).collect()
    }

    #[test]
    fn runs_join_and_go_out_in_order_across_partial_writes() {
        let mut o = Outbox::default();
        let m = o.mark();
        o.scratch().extend_from_slice(b"head");
        o.commit(m);
        let m = o.mark();
        o.scratch_space(3).copy_from_slice(b"abc");
        o.commit(m);
        o.push_owned(Bytes::from_static(b"XY"));
        let m = o.mark();
        o.scratch().extend_from_slice(b"dropped");
        o.undo(m);
        let m = o.mark();
        o.scratch().extend_from_slice(b"tail");
        o.commit(m);
        assert_eq!(o.queued(), 13);
        assert_eq!(o.runs.len(), 3, "contiguous scratch bytes are one run");
        assert_eq!(unwritten(&o), b"headabcXYtail");
        o.advance(5);
        assert_eq!(unwritten(&o), b"bcXYtail");
        o.advance(3);
        assert_eq!(unwritten(&o), b"Ytail");
        assert!(!o.unflushed());
        o.advance(5);
        assert_eq!(o.queued(), 0);
        assert!(o.unflushed() && o.runs.is_empty() && o.scratch.is_empty());
    }

    #[test]
    fn a_few_runs_or_many_all_go_to_the_writer() {
        for runs in [1, FEW_SLOTS, FEW_SLOTS + 1, SLOTS + 3] {
            let mut o = Outbox::default();
            for i in 0..runs {
                o.push_owned(Bytes::from(vec![i as u8; 3]));
            }
            let given = o.with_slices(|s| s.iter().flat_map(|s| s.to_vec()).collect::<Vec<_>>());
            let expected: Vec<u8> = (0..runs.min(SLOTS)).flat_map(|i| [i as u8; 3]).collect();
            assert_eq!(given, expected, "{runs} runs");
        }
    }

    #[test]
    fn slices_stop_at_the_slots_given() {
        let mut o = Outbox::default();
        for i in 0..4u8 {
            o.push_owned(Bytes::from(vec![i; 2]));
        }
        let mut slots = [IoSlice::new(&[]); 3];
        assert_eq!(o.slices(&mut slots), 3);
        assert_eq!(&*slots[2], &[2, 2]);
    }
}
