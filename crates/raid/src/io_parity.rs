//! I/O of the parity family (RAID5, RAID6), one row at a time.
//!
//! A write reads as little as it can: a whole row needs no read at all;
//! a partial one either reads the old data and parity it changes
//! (read-modify-write) or the data it leaves alone (reconstruct-write),
//! whichever is fewer chunk reads. With a member missing from the row it
//! reads everything readable, rebuilds the missing columns, and writes
//! fresh parity. All of it under the row's stripe lock.

use std::io;

use crate::core::{array_failed, Core};
use crate::geometry::Role;
use crate::gf;
use crate::io_log::LogOutcome;
use crate::log::SECTOR;
use crate::member::Member;
use crate::recent::Origin;
use std::sync::Arc;

/// The chunks of one row over the in-chunk byte window `[lo, lo+len)`.
struct Window {
    len: usize,
    data: Vec<Option<Vec<u8>>>,
    p: Option<Vec<u8>>,
    q: Option<Vec<u8>>,
}

/// Part of column `column` a write of logical row bytes `[s, e)` covers,
/// inside a window at `lo` of `len` bytes: `(from, to)` in the window and
/// where that part starts in the write's buffer.
fn coverage(
    chunk: u64,
    column: usize,
    lo: u64,
    len: usize,
    s: u64,
    e: u64,
) -> Option<(usize, usize, usize)> {
    let start = column as u64 * chunk + lo;
    let end = start + len as u64;
    let (a, b) = (start.max(s), end.min(e));
    (a < b).then(|| ((a - start) as usize, (b - start) as usize, (a - s) as usize))
}

/// Sub-chunk window a write of `[s, e)` of a row needs: narrow when it
/// stays inside one chunk.
fn window_of(chunk: u64, s: u64, e: u64) -> (u64, usize) {
    if s / chunk == (e - 1) / chunk {
        (s % chunk, (e - s) as usize)
    } else {
        (0, chunk as usize)
    }
}

impl Core {
    fn row_members(&self, row: u64) -> (Vec<Option<Arc<Member>>>, Vec<bool>) {
        let members = self.members();
        let rr = self.region_rows();
        let readable = members
            .iter()
            .map(|m| m.as_ref().is_some_and(|m| m.readable(row, rr)))
            .collect();
        (members, readable)
    }

    /// Reads the chunks of `row` whose members `want` says, over the
    /// window. `Ok(None)`: a member failed meanwhile, try again.
    fn gather(
        &self,
        row: u64,
        lo: u64,
        len: usize,
        members: &[Option<Arc<Member>>],
        want: &[bool],
        origin: Origin,
    ) -> io::Result<Option<Window>> {
        let g = &self.geo;
        let mut w = Window {
            len,
            data: vec![None; g.data_columns()],
            p: None,
            q: None,
        };
        for (slot, m) in members.iter().enumerate() {
            if !want[slot] {
                continue;
            }
            let m = m.as_ref().expect("wanted members exist");
            let mut buf = vec![0u8; len];
            if let Err(e) = m.read_for(origin, &mut buf, row * g.chunk + lo) {
                self.fail_member(slot, m, &e);
                return Ok(None);
            }
            match g.role_in_row(row, slot) {
                Role::Data(c) => w.data[c] = Some(buf),
                Role::P => w.p = Some(buf),
                Role::Q => w.q = Some(buf),
            }
        }
        Ok(Some(w))
    }

    /// Fills in the data columns `w` lacks from P and Q.
    fn complete(&self, w: &mut Window) -> io::Result<()> {
        let cols: Vec<Option<&[u8]>> = w.data.iter().map(|d| d.as_deref()).collect();
        let rebuilt = self.rebuild_columns(&cols, w.p.as_deref(), w.q.as_deref())?;
        for (c, d) in rebuilt {
            w.data[c] = Some(d);
        }
        Ok(())
    }

    /// The data columns missing from `cols` (`None`), from the others and
    /// P and Q where there are.
    pub fn rebuild_columns(
        &self,
        cols: &[Option<&[u8]>],
        p: Option<&[u8]>,
        q: Option<&[u8]>,
    ) -> io::Result<Vec<(usize, Vec<u8>)>> {
        let missing: Vec<usize> = (0..cols.len()).filter(|c| cols[*c].is_none()).collect();
        let Some(len) = cols
            .iter()
            .flatten()
            .next()
            .map(|c| c.len())
            .or(p.map(|p| p.len()))
        else {
            return Err(array_failed());
        };
        Ok(match (missing.as_slice(), p, q) {
            ([], _, _) => vec![],
            ([x], Some(p), _) => {
                let mut d = p.to_vec();
                for o in cols.iter().flatten() {
                    gf::xor_into(&mut d, o);
                }
                vec![(*x, d)]
            }
            ([x], None, Some(q)) => {
                let mut d = vec![0u8; len];
                gf::recover_data_from_q(cols, q, *x, &mut d);
                vec![(*x, d)]
            }
            ([x, y], Some(p), Some(q)) => {
                let (mut dx, mut dy) = (vec![0u8; len], vec![0u8; len]);
                gf::recover_two_data(cols, p, q, *x, *y, &mut dx, &mut dy);
                vec![(*x, dx), (*y, dy)]
            }
            _ => return Err(array_failed()),
        })
    }

    /// P (and Q) of complete data columns.
    fn parity_of(&self, w: &Window) -> (Vec<u8>, Option<Vec<u8>>) {
        let cols: Vec<&[u8]> = w
            .data
            .iter()
            .map(|d| d.as_deref().expect("complete"))
            .collect();
        let mut p = vec![0u8; w.len];
        gf::p_of(&cols, &mut p);
        let q = (self.geo.level.parity() == 2).then(|| {
            let mut q = vec![0u8; w.len];
            gf::q_of(&cols.iter().map(|c| Some(*c)).collect::<Vec<_>>(), &mut q);
            q
        });
        (p, q)
    }

    /// Reads logical bytes `[s, e)` of parity row `row` into `buf`.
    pub fn read_row(&self, row: u64, s: u64, e: u64, buf: &mut [u8]) -> io::Result<()> {
        let chunk = self.geo.chunk;
        // Straight from the data columns while they are all readable.
        let (members, readable) = self.row_members(row);
        let mut direct_ok = true;
        let mut at = s;
        while at < e {
            let column = (at / chunk) as usize;
            let to = ((column as u64 + 1) * chunk).min(e);
            let slot = self.geo.data_member(row, column);
            let out = &mut buf[(at - s) as usize..(to - s) as usize];
            if !readable[slot] {
                direct_ok = false;
                break;
            }
            let m = members[slot].as_ref().expect("readable members exist");
            if let Err(err) = m.read(out, row * chunk + at % chunk) {
                self.fail_member(slot, m, &err);
                direct_ok = false;
                break;
            }
            at = to;
        }
        if direct_ok {
            return Ok(());
        }
        // Degraded: rebuild from the rest of the row, under its lock so no
        // writer changes parity meanwhile.
        let _guard = self.locks.lock(row);
        for _ in 0..=self.geo.members {
            let (members, readable) = self.row_members(row);
            let (lo, len) = window_of(chunk, s, e);
            let Some(mut w) = self.gather(row, lo, len, &members, &readable, Origin::Foreground)?
            else {
                continue;
            };
            self.complete(&mut w)?;
            for c in 0..w.data.len() {
                if let Some((from, to, pos)) = coverage(chunk, c, lo, len, s, e) {
                    let col = w.data[c].as_ref().expect("complete");
                    buf[pos..pos + (to - from)].copy_from_slice(&col[from..to]);
                }
            }
            return Ok(());
        }
        Err(array_failed())
    }

    /// Writes logical bytes `[s, e)` of parity row `row` from `data`.
    pub fn write_row(&self, row: u64, s: u64, e: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let _guard = self.locks.lock(row);
        if fua && self.row_has_live_log(row) {
            // Parity written now covers earlier unflushed writes of the row;
            // were those lost to a cut, this stable data could not be
            // rebuilt from it. So they become stable first.
            self.flush_all()?;
        }
        for _ in 0..=self.geo.members {
            if let Some(r) = self.try_write_row(row, s, e, data, fua)? {
                return Ok(r);
            }
        }
        Err(array_failed())
    }

    fn try_write_row(
        &self,
        row: u64,
        s: u64,
        e: u64,
        data: &[u8],
        fua: bool,
    ) -> io::Result<Option<()>> {
        let g = self.geo;
        let chunk = g.chunk;
        let (mut lo, mut len) = window_of(chunk, s, e);
        if self.log.is_some() {
            // Log entries cover whole sectors.
            let hi = (lo + len as u64).next_multiple_of(SECTOR);
            lo -= lo % SECTOR;
            len = (hi - lo) as usize;
        }
        let d = g.data_columns();
        let (members, readable) = self.row_members(row);
        let cover: Vec<Option<(usize, usize, usize)>> =
            (0..d).map(|c| coverage(chunk, c, lo, len, s, e)).collect();
        let touched = cover.iter().filter(|c| c.is_some()).count();
        let partial = cover
            .iter()
            .filter(|c| c.is_some_and(|(f, t, _)| t - f < len))
            .count();
        let healthy = readable.iter().all(|r| *r);
        let parity_slots = [
            Some(g.p_member(row)),
            (g.level.parity() == 2).then(|| g.q_member(row)),
        ];

        let mut want = vec![false; g.members];
        let rmw = healthy && touched + g.level.parity() < (d - touched) + partial;
        if !healthy {
            want.copy_from_slice(&readable);
        } else if rmw {
            for (c, cv) in cover.iter().enumerate() {
                if cv.is_some() {
                    want[g.data_member(row, c)] = true;
                }
            }
            for p in parity_slots.into_iter().flatten() {
                want[p] = true;
            }
        } else {
            for (c, cv) in cover.iter().enumerate() {
                let needed = match cv {
                    None => true,
                    Some((f, t, _)) => t - f < len,
                };
                want[g.data_member(row, c)] = needed;
            }
        }
        let Some(mut w) = self.gather(row, lo, len, &members, &want, Origin::Foreground)? else {
            return Ok(None);
        };
        let (p, q) = if rmw {
            let mut p = w.p.take().expect("read");
            let mut q = w.q.take();
            for (c, cv) in cover.iter().enumerate() {
                let Some((from, to, pos)) = *cv else { continue };
                let old = w.data[c].as_ref().expect("read");
                let mut delta = old[from..to].to_vec();
                gf::xor_into(&mut delta, &data[pos..pos + (to - from)]);
                gf::xor_into(&mut p[from..to], &delta);
                if let Some(q) = q.as_mut() {
                    gf::mul_xor_into(&mut q[from..to], &delta, gf::pow2(c));
                }
                // The column as it will be, for the log.
                let col = w.data[c].as_mut().expect("read");
                col[from..to].copy_from_slice(&data[pos..pos + (to - from)]);
            }
            (p, q)
        } else {
            if !healthy {
                self.complete(&mut w)?;
            }
            for (c, cv) in cover.iter().enumerate() {
                let Some((from, to, pos)) = *cv else { continue };
                let col = w.data[c].get_or_insert_with(|| vec![0u8; len]);
                col[from..to].copy_from_slice(&data[pos..pos + (to - from)]);
            }
            self.parity_of(&w)
        };
        let logged = match self.log_write(
            row,
            lo,
            len,
            &cover,
            &mut w.data,
            &p,
            q.as_deref(),
            &members,
        )? {
            LogOutcome::Retry => return Ok(None),
            LogOutcome::NotNeeded => None,
            LogOutcome::Logged(r) => Some(r),
        };
        // Data first, then parity, to every member still taking writes.
        let mut writes: Vec<(usize, u64, &[u8])> = Vec::new();
        for (c, cv) in cover.iter().enumerate() {
            if let Some((from, to, pos)) = *cv {
                let slot = g.data_member(row, c);
                writes.push((
                    slot,
                    row * chunk + lo + from as u64,
                    &data[pos..pos + (to - from)],
                ));
            }
        }
        writes.push((g.p_member(row), row * chunk + lo, &p));
        if let Some(q) = q.as_ref() {
            writes.push((g.q_member(row), row * chunk + lo, q));
        }
        for (slot, offset, bytes) in writes {
            let Some(m) = members[slot].as_ref() else {
                continue;
            };
            if m.is_failed() {
                continue;
            }
            if let Err(err) = m.write(bytes, offset, fua) {
                self.fail_member(slot, m, &err);
            }
        }
        if let (Some(log), Some(r)) = (&self.log, logged) {
            if fua {
                // Stable now; the flush before it left nothing else pending.
                log.forget(&r, row, (lo / SECTOR) as u32, (len as u64 / SECTOR) as u32);
            }
            log.finished(&r, true);
        }
        let (_, readable) = self.row_members(row);
        if readable.iter().filter(|r| !**r).count() > g.level.parity() {
            return Err(array_failed());
        }
        Ok(Some(()))
    }

    /// Rewrites `slot`'s chunk of `row` from the rest of the row (rebuild),
    /// or, with `slot` None, recomputes the row's parity from its data
    /// (resync). The caller holds the row's stripe lock.
    pub fn repair_row(&self, row: u64, slot: Option<usize>) -> io::Result<()> {
        let g = self.geo;
        for _ in 0..=g.members {
            let (members, mut readable) = self.row_members(row);
            if let Some(slot) = slot {
                readable[slot] = false;
            }
            let Some(mut w) = self.gather(
                row,
                0,
                g.chunk as usize,
                &members,
                &readable,
                Origin::Background,
            )?
            else {
                continue;
            };
            self.complete(&mut w)?;
            let (p, q) = self.parity_of(&w);
            let targets: Vec<usize> = match slot {
                Some(s) => vec![s],
                None => [
                    Some(g.p_member(row)),
                    (g.level.parity() == 2).then(|| g.q_member(row)),
                ]
                .into_iter()
                .flatten()
                .collect(),
            };
            for t in targets {
                let Some(m) = members[t].as_ref() else {
                    continue;
                };
                if m.is_failed() {
                    continue;
                }
                let bytes: &[u8] = match g.role_in_row(row, t) {
                    Role::Data(c) => w.data[c].as_ref().expect("complete"),
                    Role::P => &p,
                    Role::Q => q.as_ref().expect("RAID6"),
                };
                if let Err(e) = m.write_for(Origin::Background, bytes, row * g.chunk, false) {
                    self.fail_member(t, m, &e);
                    return Err(e);
                }
            }
            return Ok(());
        }
        Err(array_failed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_coverage() {
        assert_eq!(window_of(4096, 100, 200), (100, 100));
        assert_eq!(window_of(4096, 4000, 4200), (0, 4096));
        // Second column of a write spanning columns 0..2 from byte 4000.
        assert_eq!(coverage(4096, 1, 0, 4096, 4000, 9000), Some((0, 4096, 96)));
        assert_eq!(coverage(4096, 2, 0, 4096, 4000, 9000), Some((0, 808, 4192)));
        assert_eq!(coverage(4096, 0, 100, 100, 100, 200), Some((0, 100, 0)));
        assert_eq!(coverage(4096, 1, 100, 100, 100, 200), None);
    }
}
