//! Logical block provisioning of an array: discards, zeroing and the
//! allocation state of ranges, kept consistent with mirrors and parity.
//!
//! Zeros have zero P and Q, so whole parity rows are zeroed (or
//! discarded) on every member at once, parity included, without a read;
//! parts of rows go through the ordinary parity write path with zeros.
//! The array is thin, and its discards read back as zeros, only when
//! every member's (and spare's) discards read back as zeros.

use std::io;
use std::sync::atomic::Ordering;

use block::{Allocation, BlockDevice, Capabilities};

use crate::array::RaidArray;
use crate::core::array_failed;
use crate::geometry::Level;
use crate::member::Zeroing;

/// Whole rows zeroed under one set of stripe locks.
const ROWS_PER_BATCH: u64 = 1024;

impl RaidArray {
    /// What every member can do with discards: `(discards read back as
    /// zeros, space is allocated on write)`.
    pub(crate) fn member_provisioning(&self) -> (bool, bool) {
        let core = &self.core;
        let mut caps: Vec<Capabilities> = core
            .members()
            .iter()
            .flatten()
            .map(|m| m.dev.capabilities())
            .collect();
        caps.extend(core.spares.lock().iter().map(|s| s.dev.capabilities()));
        let zeroes = caps.iter().all(|c| c.discard && c.discard_zeroes);
        let thin = zeroes && caps.iter().all(|c| c.thin);
        (zeroes, thin)
    }

    /// Makes `[offset, offset+len)` read as zeros the way `how` says.
    pub(crate) fn zero_range(&self, offset: u64, len: u64, how: Zeroing) -> io::Result<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let core = &self.core;
        if !core.survives() {
            return Err(array_failed());
        }
        core.foreground_ops.fetch_add(1, Ordering::Relaxed);
        let g = core.geo;
        let rows = self.member_rows(offset, len);
        let tracked = g.level != Level::Raid0;
        if tracked {
            core.with_bitmap_writer(|w| core.bitmap.begin_write(rows.clone(), w))?;
        }
        let result = if g.is_parity() {
            self.zero_parity(offset, len, how)
        } else {
            self.zero_copies(offset, len, how)
        };
        if tracked {
            core.bitmap.end_write(rows);
        }
        result
    }

    fn zero_parity(&self, offset: u64, len: u64, how: Zeroing) -> io::Result<()> {
        let g = self.core.geo;
        let unit = g.chunk * g.data_columns() as u64;
        // Whole rows waiting to be zeroed together: `[first, end)`.
        let mut run: Option<(u64, u64)> = None;
        for (row, s, e) in self.pieces(offset, len) {
            let base = row * unit;
            if s == base && e == base + unit {
                match run.as_mut() {
                    Some((first, end)) if *end == row && row - *first < ROWS_PER_BATCH => *end += 1,
                    _ => {
                        if let Some(r) = run.replace((row, row + 1)) {
                            self.zero_rows(r, how)?;
                        }
                    }
                }
                continue;
            }
            if let Some(r) = run.take() {
                self.zero_rows(r, how)?;
            }
            let zeros = vec![0u8; (e - s) as usize];
            self.core
                .write_row(row, s - base, e - base, &zeros, false)?;
        }
        match run {
            Some(r) => self.zero_rows(r, how),
            None => Ok(()),
        }
    }

    /// Zeros whole parity rows `[first, end)` on every member, data and
    /// parity alike.
    fn zero_rows(&self, (first, end): (u64, u64), how: Zeroing) -> io::Result<()> {
        let core = &self.core;
        let chunk = core.geo.chunk;
        let _guards: Vec<_> = (first..end).map(|r| core.locks.lock(r)).collect();
        if core.log.is_some() {
            // Entries of earlier partial writes of these rows retire first:
            // replayed over zeroed columns they would make parity wrong.
            core.flush_all()?;
        }
        for (slot, m) in core.members().iter().enumerate() {
            let Some(m) = m.as_ref().filter(|m| !m.is_failed()) else {
                continue;
            };
            if let Err(e) = m.zero(how, first * chunk, (end - first) * chunk) {
                core.fail_member(slot, m, &e);
            }
        }
        if core.log.is_some() {
            // And the zeros are stable before the locks go: a later partial
            // write of these rows logs its untouched columns as on disk.
            core.flush_all()?;
        }
        if !core.survives() {
            return Err(array_failed());
        }
        Ok(())
    }

    fn zero_copies(&self, offset: u64, len: u64, how: Zeroing) -> io::Result<()> {
        let core = &self.core;
        let g = core.geo;
        let region_rows = core.region_rows();
        for (chunk, s, e) in self.pieces(offset, len) {
            let _guard = core.locks.lock(chunk);
            let within = s - chunk * g.chunk;
            let mut kept = 0;
            for place in g.copies_of(chunk) {
                let Some(m) = core.slots.read()[place.member].clone() else {
                    continue;
                };
                if m.is_failed() {
                    continue;
                }
                match m.zero(how, place.row * g.chunk + within, e - s) {
                    Ok(()) if m.readable(place.row, region_rows) => kept += 1,
                    Ok(()) => {}
                    Err(err) => core.fail_member(place.member, &m, &err),
                }
            }
            if kept == 0 {
                return Err(array_failed());
            }
        }
        Ok(())
    }

    /// Logical bytes of one member row when each member row holds
    /// consecutive logical data (every level but RAID10 over an odd number
    /// of members): member row `r` of every member then holds logical
    /// bytes `[r * unit, (r + 1) * unit)`.
    fn row_unit(&self) -> Option<u64> {
        let g = self.core.geo;
        let n = g.members as u64;
        match g.level {
            _ if g.is_parity() => Some(g.chunk * g.data_columns() as u64),
            Level::Raid0 => Some(g.chunk * n),
            Level::Raid1 => Some(g.chunk),
            Level::Raid10 if n.is_multiple_of(2) => Some(g.chunk * n / 2),
            _ => None,
        }
    }

    /// Allocation state of the extent at `offset`: deallocated only where
    /// every member that holds current data for it is, in whole member
    /// rows (a part of a parity row holds the parity of the rest).
    pub(crate) fn allocation_at(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok((Allocation::Mapped, 0));
        }
        let core = &self.core;
        let g = core.geo;
        let rr = core.region_rows();
        let members = core.members();
        let Some(unit) = self.row_unit() else {
            return self.chunk_allocation(offset, len);
        };
        let row = offset / unit;
        let rows = (offset + len).div_ceil(unit) - row;
        let mut extents = Vec::new();
        for m in members.iter().flatten() {
            if !m.is_failed() && m.readable(row, rr) {
                extents.push(m.allocation(row * g.chunk, rows * g.chunk)?);
            }
        }
        let (state, bytes) = combine(&extents);
        let rows = match state {
            Allocation::Mapped => bytes.div_ceil(g.chunk).max(1),
            Allocation::Deallocated => bytes / g.chunk,
        };
        let (state, rows) = if rows == 0 {
            (Allocation::Mapped, 1)
        } else {
            (state, rows)
        };
        Ok((state, (rows * unit - offset % unit).min(len)))
    }

    /// [`RaidArray::allocation_at`] a chunk at a time, from its copies.
    fn chunk_allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        let core = &self.core;
        let g = core.geo;
        let rr = core.region_rows();
        let members = core.members();
        let (chunk, within) = (offset / g.chunk, offset % g.chunk);
        let span = (g.chunk - within).min(len);
        let mut extents = Vec::new();
        for place in g.copies_of(chunk) {
            let Some(m) = members[place.member].as_ref() else {
                continue;
            };
            if !m.is_failed() && m.readable(place.row, rr) {
                extents.push(m.allocation(place.row * g.chunk + within, span)?);
            }
        }
        let (state, bytes) = combine(&extents);
        Ok((state, bytes.clamp(1, span)))
    }
}

/// Members' extents from one point, as one: mapped as far as any member
/// is mapped, else deallocated as far as every member is. Nothing known
/// is mapped.
fn combine(extents: &[(Allocation, u64)]) -> (Allocation, u64) {
    let mapped = extents
        .iter()
        .filter(|e| e.0 == Allocation::Mapped)
        .map(|e| e.1)
        .max();
    match mapped {
        Some(bytes) => (Allocation::Mapped, bytes),
        None => match extents.iter().map(|e| e.1).min() {
            Some(bytes) => (Allocation::Deallocated, bytes),
            None => (Allocation::Mapped, 0),
        },
    }
}

/// Whether `[offset, offset+len)` of `dev` is unallocated throughout on a
/// device whose unallocated blocks read as zeros: never written.
pub(crate) fn reads_as_zeros(dev: &dyn BlockDevice, offset: u64, len: u64) -> bool {
    if !dev.capabilities().discard_zeroes {
        return false;
    }
    let (mut at, end) = (offset, offset + len);
    while at < end {
        match dev.allocation(at, end - at) {
            Ok((Allocation::Deallocated, n)) if n > 0 => at += n,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use block::{BlockDevice, MemDevice};

    use crate::core::RaidOptions;
    use crate::geometry::Level;

    const CHUNK: u64 = 64 << 10;

    fn array(level: Level, n: usize) -> RaidArray {
        let members: Vec<Arc<dyn BlockDevice>> = (0..n)
            .map(|_| Arc::new(MemDevice::new(64 << 20)) as Arc<dyn BlockDevice>)
            .collect();
        let options = RaidOptions {
            chunk: CHUNK,
            assume_clean: true,
            ..RaidOptions::default()
        };
        RaidArray::create(level, members, Vec::new(), options).unwrap()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed | 1)
            .collect()
    }

    /// Discards and zeroing over whole and partial rows read back as
    /// zeros, leave the rest alone, report deallocated whole rows, and
    /// keep parity right: a scrub finds nothing, and with a member
    /// failed every byte still reads back.
    #[test]
    fn discards_keep_parity_and_report_allocation() {
        for (level, n) in [
            (Level::Raid5, 4),
            (Level::Raid6, 5),
            (Level::Raid1, 2),
            (Level::Raid10, 4),
            (Level::Raid0, 3),
        ] {
            let a = array(level, n);
            let caps = a.capabilities();
            assert!(
                caps.thin && caps.discard && caps.discard_zeroes,
                "{level:?}"
            );
            let len = 8 << 20;
            let mut want = pattern(len, level.number() as u8);
            a.write_at(&want, 0, false).unwrap();
            assert_eq!(a.allocation(0, 4096).unwrap().0, Allocation::Mapped);
            // Written space is one extent, not a chunk at a time: GET LBA
            // STATUS walks the device with these.
            let whole = a.allocation(0, len as u64).unwrap();
            assert_eq!(whole, (Allocation::Mapped, len as u64), "{level:?}");
            // Whole member rows, where deallocation shows.
            let unit = match level {
                Level::Raid0 => CHUNK * n as u64,
                Level::Raid10 => CHUNK * n as u64 / 2,
                _ => a.granularity().max(CHUNK),
            };
            // From the middle of one row (or chunk) to the middle of a
            // later one, and a zeroing of a sub-chunk range.
            let (from, to) = (unit / 3, 5 * unit + unit / 2);
            a.discard(from, to - from).unwrap();
            want[from as usize..to as usize].fill(0);
            a.write_zeroes(7 * unit + 4096, 8192).unwrap();
            let z = (7 * unit + 4096) as usize;
            want[z..z + 8192].fill(0);
            let mut back = vec![0u8; len];
            a.read_at(&mut back, 0).unwrap();
            assert!(back == want, "{level:?}: read back after discards");
            // Whole units inside the discard are deallocated.
            let mut at = unit;
            while at < 5 * unit {
                let (state, bytes) = a.allocation(at, 5 * unit - at).unwrap();
                assert_eq!(state, Allocation::Deallocated, "{level:?} at {at}");
                at += bytes;
            }
            assert_eq!(at, 5 * unit, "{level:?}");
            assert_eq!(a.allocation(0, unit).unwrap().0, Allocation::Mapped);
            if level == Level::Raid0 {
                continue;
            }
            let report = a.scrub(false).unwrap();
            assert_eq!(report.mismatches, 0, "{level:?}: scrub after discards");
            a.fail(1).unwrap();
            a.read_at(&mut back, 0).unwrap();
            assert!(back == want, "{level:?}: degraded read after discards");
        }
    }
}
