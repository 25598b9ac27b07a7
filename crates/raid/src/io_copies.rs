//! I/O of the copies family (RAID0, RAID1, RAID10): each logical chunk
//! lives whole on one or more members.

use std::io;
use std::sync::atomic::Ordering;

use crate::core::{array_failed, Core};
use crate::recent::Origin;

impl Core {
    /// Reads `buf` from logical chunk `chunk` at `within` bytes into it,
    /// from one readable copy, taking turns among copies so that reads
    /// spread over the mirrors.
    pub fn read_chunk_copies(&self, chunk: u64, within: u64, buf: &mut [u8]) -> io::Result<()> {
        let places = self.geo.copies_of(chunk);
        let turn = self.read_turn.fetch_add(1, Ordering::Relaxed);
        let region_rows = self.region_rows();
        for i in 0..places.len() {
            let place = places[(turn + i) % places.len()];
            let Some(m) = self.slots.read()[place.member].clone() else {
                continue;
            };
            if !m.readable(place.row, region_rows) {
                continue;
            }
            match m.read(buf, place.row * self.geo.chunk + within) {
                Ok(()) => return Ok(()),
                Err(e) => self.fail_member(place.member, &m, &e),
            }
        }
        Err(array_failed())
    }

    /// Writes `buf` to every live copy of logical chunk `chunk`, its stripe
    /// lock held by the caller. Fails only if no copy that can be read
    /// back took it.
    pub fn write_chunk_copies(
        &self,
        chunk: u64,
        within: u64,
        buf: &[u8],
        fua: bool,
    ) -> io::Result<()> {
        let region_rows = self.region_rows();
        let mut kept = 0;
        for place in self.geo.copies_of(chunk) {
            let Some(m) = self.slots.read()[place.member].clone() else {
                continue;
            };
            if m.is_failed() {
                continue;
            }
            match m.write(buf, place.row * self.geo.chunk + within, fua) {
                Ok(()) if m.readable(place.row, region_rows) => kept += 1,
                Ok(()) => {}
                Err(e) => self.fail_member(place.member, &m, &e),
            }
        }
        if kept == 0 {
            return Err(array_failed());
        }
        Ok(())
    }

    /// Brings `slot`'s copy at member row `row` up to date from another
    /// copy. The caller holds the row's stripe lock.
    pub fn recover_copy(&self, slot: usize, row: u64) -> io::Result<()> {
        let place = crate::geometry::Place { member: slot, row };
        let chunk = self.geo.stripe_of_place(place);
        if chunk >= self.geo.logical_chunks() {
            return Ok(()); // the tail of an odd RAID10 holds no data
        }
        let mut buf = vec![0u8; self.geo.chunk as usize];
        let region_rows = self.region_rows();
        let mut found = false;
        for other in self.geo.copies_of(chunk) {
            if other.member == slot {
                continue;
            }
            let Some(m) = self.slots.read()[other.member].clone() else {
                continue;
            };
            if !m.readable(other.row, region_rows) {
                continue;
            }
            match m.read_for(Origin::Background, &mut buf, other.row * self.geo.chunk) {
                Ok(()) => {
                    found = true;
                    break;
                }
                Err(e) => self.fail_member(other.member, &m, &e),
            }
        }
        if !found {
            return Err(array_failed());
        }
        let target = self.slots.read()[slot].clone().ok_or_else(array_failed)?;
        target.write_for(Origin::Background, &buf, row * self.geo.chunk, false)
    }

    /// Makes every copy of logical chunk `chunk` equal to the first
    /// readable one (resync after an unclean stop). Lock held by caller.
    pub fn resync_copies(&self, chunk: u64) -> io::Result<()> {
        let places = self.geo.copies_of(chunk);
        if places.len() < 2 {
            return Ok(());
        }
        let mut buf = vec![0u8; self.geo.chunk as usize];
        let region_rows = self.region_rows();
        let mut source = None;
        for p in &places {
            let Some(m) = self.slots.read()[p.member].clone() else {
                continue;
            };
            if !m.readable(p.row, region_rows) {
                continue;
            }
            match m.read_for(Origin::Background, &mut buf, p.row * self.geo.chunk) {
                Ok(()) => {
                    source = Some(p.member);
                    break;
                }
                Err(e) => self.fail_member(p.member, &m, &e),
            }
        }
        let Some(source) = source else {
            return Err(array_failed());
        };
        for p in &places {
            if p.member == source {
                continue;
            }
            let Some(m) = self.slots.read()[p.member].clone() else {
                continue;
            };
            if m.is_failed() {
                continue;
            }
            if let Err(e) = m.write_for(Origin::Background, &buf, p.row * self.geo.chunk, false) {
                self.fail_member(p.member, &m, &e);
            }
        }
        Ok(())
    }
}
