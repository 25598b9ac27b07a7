//! Rebuild of a RAID5/6 member in large steps: a batch of rows is read
//! from every other member at once, one call each, and the batch's
//! rebuilt chunks go to the new member in one call while the next batch
//! is being read. A row at a time, the reads of a rebuild would queue one
//! behind another and leave the members mostly idle.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use crate::core::{array_failed, Core};
use crate::geometry::Place;
use crate::geometry::Role;
use crate::gf;
use crate::locks::StripeGuard;
use crate::member::{Member, SyncState, Zeroing};
use crate::recent::Origin;

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
    /// Whether `slot` can be rebuilt in batches: its other members are
    /// each in sync or gone, so that one read of a member serves every
    /// row of a batch.
    pub fn rebuilds_in_batches(&self, slot: usize) -> bool {
        self.geo.level != crate::geometry::Level::Raid0
            && self.members().iter().enumerate().all(|(s, m)| {
                s == slot
                    || m.as_ref().is_none_or(|m| {
                        matches!(*m.state.read(), SyncState::InSync | SyncState::Failed)
                    })
            })
    }

    /// Locks the stripes of `slot`'s member rows `rows`, reads them from
    /// the other members and computes `slot`'s chunks of them. `None`: a
    /// member failed on the way.
    pub fn read_batch(&self, slot: usize, rows: Range<u64>) -> io::Result<Option<Batch<'_>>> {
        if !self.geo.is_parity() {
            return self.read_copies_batch(slot, rows);
        }
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
                            m.read_for(Origin::Background, &mut buf, rows.start * g.chunk)
                                .map(|()| buf)
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

    /// Writes a batch to the member being rebuilt in `slot`, then unlocks
    /// its stripes (writes that follow reach the member too); false if
    /// it failed. Its rows count as done once every batch before them is.
    pub fn write_batch(&self, slot: usize, target: &Member, batch: Batch<'_>) -> bool {
        if target.is_failed() {
            return false;
        }
        if let Err(e) = self.write_chunks(target, &batch) {
            self.fail_member(slot, target, &e);
            return false;
        }
        drop(batch.guards);
        true
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
                target.zero_own(
                    Origin::Background,
                    Zeroing::Discard,
                    offset,
                    ((end - at) * chunk) as u64,
                )?;
            } else {
                target.write_own(
                    Origin::Background,
                    &batch.chunks[at * chunk..end * chunk],
                    offset,
                    false,
                )?;
            }
            at = end;
        }
        Ok(())
    }

    /// [`Core::read_batch`] of a mirror level: each chunk of `slot`'s rows
    /// comes from another in-sync copy, consecutive ones on the same
    /// member in one read, each source member read on its own thread.
    fn read_copies_batch(&self, slot: usize, rows: Range<u64>) -> io::Result<Option<Batch<'_>>> {
        let g = self.geo;
        let guards = self.lock_member_rows(slot, rows.clone());
        let members = self.members();
        // (source member, its first row, first chunk of the batch, chunks)
        let mut runs: Vec<(usize, u64, usize, usize)> = Vec::new();
        for (i, row) in rows.clone().enumerate() {
            let k = g.stripe_of_place(Place { member: slot, row });
            if k >= g.logical_chunks() {
                continue; // the tail of an odd RAID10 holds no data
            }
            let src = g
                .copies_of(k)
                .into_iter()
                .find(|p| {
                    p.member != slot && members[p.member].as_ref().is_some_and(|m| m.is_in_sync())
                })
                .ok_or_else(array_failed)?;
            match runs.last_mut() {
                Some(r) if r.0 == src.member && r.1 + r.3 as u64 == src.row && r.2 + r.3 == i => {
                    r.3 += 1
                }
                _ => runs.push((src.member, src.row, i, 1)),
            }
        }
        let chunk = g.chunk as usize;
        let mut chunks = vec![0u8; (rows.end - rows.start) as usize * chunk];
        // Each run's part of the buffer, grouped by source member.
        let mut by_member: Vec<Vec<(u64, &mut [u8])>> =
            (0..g.members).map(|_| Vec::new()).collect();
        let mut rest: &mut [u8] = &mut chunks;
        let mut at = 0;
        for &(member, src_row, first, n) in &runs {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((first - at) * chunk);
            let (part, tail) = tail.split_at_mut(n * chunk);
            by_member[member].push((src_row, part));
            rest = tail;
            at = first + n;
        }
        let failed: Vec<(usize, io::Error)> = std::thread::scope(|scope| {
            let handles: Vec<_> = by_member
                .into_iter()
                .enumerate()
                .filter(|(_, parts)| !parts.is_empty())
                .map(|(member, parts)| {
                    let m = members[member].clone().expect("in sync");
                    scope.spawn(move || {
                        for (src_row, part) in parts {
                            if let Err(e) = m.read_for(Origin::Background, part, src_row * g.chunk)
                            {
                                return Some((member, e));
                            }
                        }
                        None
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("rebuild read thread"))
                .collect()
        });
        if let Some((member, e)) = failed.into_iter().next() {
            drop(guards);
            let m = members[member].clone().expect("in sync");
            self.fail_member(member, &m, &e);
            return Ok(None);
        }
        Ok(Some(Batch {
            rows,
            chunks,
            guards,
        }))
    }
}
