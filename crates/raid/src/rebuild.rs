//! Rebuild of a RAID5/6 member in large steps: a batch of rows is read
//! from every other member at once, one call each, and the batch's
//! rebuilt chunks go to the new member in one call while the next batch
//! is being read. A row at a time, the reads of a rebuild would queue one
//! behind another and leave the members mostly idle.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use crate::core::{array_failed, Core};
use crate::geometry::Role;
use crate::gf;
use crate::locks::StripeGuard;
use crate::member::{Member, SyncState, Zeroing};

/// Bytes of each member one rebuild step covers.
pub const STEP_BYTES: u64 = 1 << 20;

/// A batch of rows read and rebuilt, its stripes still locked, waiting to
/// be written to the member being rebuilt.
pub struct Batch<'a> {
    pub rows: Range<u64>,
    pub chunks: Vec<u8>,
    pub guards: Vec<StripeGuard<'a>>,
}

impl Core {
    /// Whether `slot` can be rebuilt in batches: a parity array whose
    /// other members are each in sync or gone, so that one read of a
    /// member serves every row of a batch.
    pub fn rebuilds_in_batches(&self, slot: usize) -> bool {
        self.geo.is_parity()
            && self.members().iter().enumerate().all(|(s, m)| {
                s == slot
                    || m.as_ref().is_none_or(|m| {
                        matches!(*m.state.read(), SyncState::InSync | SyncState::Failed)
                    })
            })
    }

    /// Locks `rows`, reads them from the other members and computes
    /// `slot`'s chunks of them. `None`: a member failed on the way.
    pub fn read_batch(&self, slot: usize, rows: Range<u64>) -> io::Result<Option<Batch<'_>>> {
        let g = self.geo;
        let guards: Vec<_> = rows.clone().map(|r| self.locks.lock(r)).collect();
        let members = self.members();
        let len = ((rows.end - rows.start) * g.chunk) as usize;
        let sources: Vec<Option<&Arc<Member>>> = members
            .iter()
            .enumerate()
            .map(|(s, m)| m.as_ref().filter(|m| s != slot && m.is_in_sync()))
            .collect();
        let reads: Vec<Option<io::Result<Vec<u8>>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = sources
                .iter()
                .map(|m| {
                    m.map(|m| {
                        scope.spawn(move || {
                            let mut buf = vec![0u8; len];
                            m.read(&mut buf, rows.start * g.chunk).map(|()| buf)
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.map(|h| h.join().expect("rebuild read thread")))
                .collect()
        });
        let mut columns: Vec<Option<Vec<u8>>> = Vec::with_capacity(reads.len());
        for (s, r) in reads.into_iter().enumerate() {
            match r {
                None => columns.push(None),
                Some(Ok(buf)) => columns.push(Some(buf)),
                Some(Err(e)) => {
                    let m = sources[s].expect("read from");
                    self.fail_member(s, m, &e);
                    return Ok(None);
                }
            }
        }
        let mut chunks = vec![0u8; len];
        let step = g.chunk as usize;
        for (i, row) in rows.clone().enumerate() {
            let at = i * step..(i + 1) * step;
            let piece = |s: usize| columns[s].as_ref().map(|c| &c[at.clone()]);
            let mut data: Vec<Option<&[u8]>> = vec![None; g.data_columns()];
            let (mut p, mut q) = (None, None);
            for s in 0..g.members {
                match g.role_in_row(row, s) {
                    Role::Data(c) => data[c] = piece(s),
                    Role::P => p = piece(s),
                    Role::Q => q = piece(s),
                }
            }
            let rebuilt = self.rebuild_columns(&data, p, q)?;
            let mut whole: Vec<&[u8]> = Vec::with_capacity(data.len());
            for (c, d) in data.iter().enumerate() {
                match d {
                    Some(d) => whole.push(d),
                    None => whole.push(
                        rebuilt
                            .iter()
                            .find(|r| r.0 == c)
                            .map(|r| r.1.as_slice())
                            .ok_or_else(array_failed)?,
                    ),
                }
            }
            let out = &mut chunks[at];
            match g.role_in_row(row, slot) {
                Role::Data(c) => out.copy_from_slice(whole[c]),
                Role::P => gf::p_of(&whole, out),
                Role::Q => {
                    let cols: Vec<Option<&[u8]>> = whole.iter().map(|c| Some(*c)).collect();
                    gf::q_of(&cols, out);
                }
            }
        }
        Ok(Some(Batch {
            rows,
            chunks,
            guards,
        }))
    }

    /// Writes a batch to the member being rebuilt in `slot` and counts its
    /// rows done, before its stripes are unlocked: no write of the array
    /// slips in between.
    pub fn write_batch(&self, slot: usize, target: &Member, batch: Batch<'_>) {
        if target.is_failed() {
            return;
        }
        if let Err(e) = self.write_chunks(target, &batch) {
            self.fail_member(slot, target, &e);
            return;
        }
        if let SyncState::Recovering { done_rows, .. } = &mut *target.state.write() {
            *done_rows = batch.rows.end;
        }
        drop(batch.guards);
    }

    /// Writes a batch's chunks to `target`'s own device. Runs of zero
    /// chunks are discarded (to zeros) rather than written: a rebuild
    /// keeps a thin member thin where the array holds nothing.
    pub fn write_chunks(&self, target: &Member, batch: &Batch<'_>) -> io::Result<()> {
        let chunk = self.geo.chunk as usize;
        let zero: Vec<bool> = batch
            .chunks
            .chunks(chunk)
            .map(|c| c.iter().all(|b| *b == 0))
            .collect();
        let mut at = 0;
        while at < zero.len() {
            let end = (at..zero.len())
                .find(|i| zero[*i] != zero[at])
                .unwrap_or(zero.len());
            let offset = (batch.rows.start + at as u64) * self.geo.chunk;
            if zero[at] {
                target.zero_own(Zeroing::Discard, offset, ((end - at) * chunk) as u64)?;
            } else {
                target.write_own(&batch.chunks[at * chunk..end * chunk], offset, false)?;
            }
            at = end;
        }
        Ok(())
    }
}
