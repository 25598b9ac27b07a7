//! Full-stripe writes of RAID5/6: a run of whole rows is written with no
//! read at all, as one write per member, every member at once. Member
//! rows are contiguous on each member, so the run's chunks (data, P and
//! Q as they rotate) make one buffer per member.

use std::io;
use std::ops::Range;

use crate::core::{array_failed, Core};
use crate::geometry::Role;
use crate::gf;
use crate::io_log::LogOutcome;
use crate::log::SECTOR;

/// Most member bytes one full-stripe write puts on each member.
pub const RUN_BYTES: u64 = 1 << 20;

impl Core {
    /// Writes whole rows `rows` from `data` (their logical bytes). Falls
    /// back to a row at a time where a member is missing or recovering
    /// there, or a row has entries in the log no flush has retired.
    pub fn write_full_rows(&self, rows: Range<u64>, data: &[u8], fua: bool) -> io::Result<()> {
        let g = self.geo;
        let chunk = g.chunk as usize;
        let d = g.data_columns();
        let unit = chunk * d;
        let guards: Vec<_> = rows.clone().map(|r| self.locks.lock(r)).collect();
        let members = self.members();
        let rr = self.region_rows();
        let healthy = members.iter().all(|m| {
            m.as_ref()
                .is_some_and(|m| !m.is_failed() && rows.clone().all(|r| m.readable(r, rr)))
        });
        if !healthy || rows.clone().any(|r| self.row_has_entry(r)) {
            drop(guards);
            for (i, row) in rows.enumerate() {
                let bytes = &data[i * unit..(i + 1) * unit];
                self.write_row(row, 0, unit as u64, bytes, fua)?;
            }
            return Ok(());
        }
        let n = (rows.end - rows.start) as usize;
        let mut bufs = vec![vec![0u8; n * chunk]; g.members];
        let mut logged = Vec::new();
        let cover: Vec<Option<(usize, usize, usize)>> =
            (0..d).map(|c| Some((0, chunk, c * chunk))).collect();
        for (i, row) in rows.clone().enumerate() {
            let cols: Vec<&[u8]> = (0..d)
                .map(|c| &data[i * unit + c * chunk..i * unit + (c + 1) * chunk])
                .collect();
            let at = i * chunk..(i + 1) * chunk;
            for (s, buf) in bufs.iter_mut().enumerate() {
                let out = &mut buf[at.clone()];
                match g.role_in_row(row, s) {
                    Role::Data(c) => out.copy_from_slice(cols[c]),
                    Role::P => gf::p_of(&cols, out),
                    Role::Q => {
                        let some: Vec<Option<&[u8]>> = cols.iter().map(|c| Some(*c)).collect();
                        gf::q_of(&some, out);
                    }
                }
            }
            // Whole rows need no entry, but the log records their columns
            // as written, for later partial writes of the row.
            let mut post: Vec<Option<Vec<u8>>> = vec![None; d];
            let p = &bufs[g.p_member(row)][at.clone()];
            let q = (g.level.parity() == 2).then(|| &bufs[g.q_member(row)][at.clone()]);
            match self.log_write(row, 0, chunk, &cover, &mut post, p, q, &members)? {
                LogOutcome::Logged(r) => logged.push((row, r)),
                LogOutcome::NotNeeded => {}
                LogOutcome::Retry => unreachable!("a whole row with no live entry reads nothing"),
            }
        }
        let offset = rows.start * g.chunk;
        let results: Vec<io::Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = members
                .iter()
                .zip(&bufs)
                .map(|(m, buf)| {
                    let m = m.as_ref().expect("healthy");
                    scope.spawn(move || m.write(buf, offset, fua))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("member write panicked")))
                })
                .collect()
        });
        for (slot, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                let m = members[slot].as_ref().expect("healthy");
                self.fail_member(slot, m, &e);
            }
        }
        if let Some(log) = &self.log {
            let sectors = (g.chunk / SECTOR) as u32;
            for (row, r) in &logged {
                if fua {
                    log.forget(r, *row, 0, sectors);
                }
                log.finished(r, true);
            }
        }
        drop(guards);
        if !self.survives() {
            return Err(array_failed());
        }
        Ok(())
    }
}
