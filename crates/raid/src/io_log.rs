//! The array's side of the partial parity log ([`crate::log`]): writing
//! an entry before a partial-row write, flushing (which retires entries),
//! and replaying entries at assembly.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use crate::core::{array_failed, Core};
use crate::gf;
use crate::log::{decode_header, encode_header, Entry, Log, Reservation, SECTOR};
use crate::member::Member;
use crate::recent::Origin;
use crate::superblock::{log_slot_bytes, LOG_OFFSET};

pub enum LogOutcome {
    /// No log on this array.
    NotNeeded,
    Logged(Reservation),
    /// A member failed on the way: try the write again.
    Retry,
}

fn columns_of(mask: u64, d: usize) -> impl Iterator<Item = usize> {
    (0..d).filter(move |c| mask & (1 << c) != 0)
}

impl Core {
    fn slot_offset(&self, slot: u32) -> u64 {
        LOG_OFFSET + 4096 + slot as u64 * log_slot_bytes(self.geo.chunk)
    }

    /// Logs the partial parity of a write of row `row` over the window
    /// `[lo, lo+len)` (whole sectors). `post` holds each column's content
    /// after the write where known; missing ones are read as needed.
    #[allow(clippy::too_many_arguments)]
    pub fn log_write(
        &self,
        row: u64,
        lo: u64,
        len: usize,
        touched: &[Option<(usize, usize, usize)>],
        post: &mut [Option<Vec<u8>>],
        p_new: &[u8],
        q_new: Option<&[u8]>,
        members: &[Option<Arc<Member>>],
    ) -> io::Result<LogOutcome> {
        let Some(log) = &self.log else {
            return Ok(LogOutcome::NotNeeded);
        };
        let g = self.geo;
        let d = g.data_columns();
        let all = (1u64 << d) - 1;
        let (first, sectors) = ((lo / SECTOR) as u32, (len as u64 / SECTOR) as u32);
        let live = log.live_masks(row, first, sectors);
        let masks: Vec<u64> = (0..sectors as usize)
            .map(|i| {
                let (a, b) = (i * SECTOR as usize, (i + 1) * SECTOR as usize);
                let now = touched
                    .iter()
                    .enumerate()
                    .filter(|(_, cv)| cv.is_some_and(|(f, t, _)| f < b && t > a))
                    .fold(0u64, |m, (c, _)| m | 1 << c);
                now | live[i]
            })
            .collect();
        let parity_slots: Vec<usize> = [
            Some(g.p_member(row)),
            (g.level.parity() == 2).then(|| g.q_member(row)),
        ]
        .into_iter()
        .flatten()
        .filter(|s| members[*s].as_ref().is_some_and(|m| !m.is_failed()))
        .collect();
        // A write that rewrites every column of its sectors leaves nothing
        // to protect, nor one with no parity member left to hold an entry
        // (every data column is at hand). Its columns are still recorded:
        // later entries of the row must not count them as untouched.
        let whole = masks.iter().all(|m| *m == all)
            && live.iter().all(|m| *m == 0)
            && !log.has_entry(row, first, sectors);
        if whole || parity_slots.is_empty() {
            let r = log.reserve(false).expect("no slot asked");
            log.committed(&r, row, first, &masks);
            return Ok(LogOutcome::Logged(r));
        }
        let mut pp = vec![0u8; len];
        let mut pq = q_new.map(|_| vec![0u8; len]);
        for (i, mask) in masks.iter().enumerate() {
            let sector = i * SECTOR as usize..(i + 1) * SECTOR as usize;
            let rest = !mask & all;
            let direct = columns_of(rest, d).all(|c| post[c].is_some());
            // Direct: the partial parity of the columns left alone. Else
            // from the new parity minus the written columns.
            let (base, sum_mask) = if direct {
                (None, rest)
            } else {
                (Some(()), *mask)
            };
            for c in columns_of(sum_mask, d) {
                if post[c].is_none() {
                    let slot = g.data_member(row, c);
                    let m = members[slot].as_ref().ok_or_else(array_failed)?;
                    let mut buf = vec![0u8; len];
                    if let Err(e) = m.read(&mut buf, row * g.chunk + lo) {
                        self.fail_member(slot, m, &e);
                        return Ok(LogOutcome::Retry);
                    }
                    post[c] = Some(buf);
                }
            }
            let cols: Vec<Option<&[u8]>> = (0..d)
                .map(|c| {
                    (sum_mask & (1 << c) != 0)
                        .then(|| &post[c].as_ref().expect("read")[sector.clone()])
                })
                .collect();
            let out = &mut pp[sector.clone()];
            for col in cols.iter().flatten() {
                gf::xor_into(out, col);
            }
            if base.is_some() {
                gf::xor_into(out, &p_new[sector.clone()]);
            }
            if let (Some(pq), Some(q_new)) = (pq.as_mut(), q_new) {
                let out = &mut pq[sector.clone()];
                gf::q_of(&cols, out);
                if base.is_some() {
                    gf::xor_into(out, &q_new[sector.clone()]);
                }
            }
        }
        let Some(r) = log.reserve(true) else {
            // Every slot holds an entry a flush has yet to retire.
            self.flush_all()?;
            return Ok(LogOutcome::Retry);
        };
        let entry = Entry {
            seq: r.seq,
            epoch: r.epoch,
            row,
            first_sector: first,
            masks: masks.clone(),
            pp,
            pq,
        };
        let bytes = entry.encode(self.array_id);
        let at = self.slot_offset(r.slot.expect("asked"));
        for slot in parity_slots {
            let m = members[slot].as_ref().expect("alive");
            if let Err(e) = m.dev.write_at(&bytes, at, true) {
                self.fail_member(slot, m, &e);
                log.finished(&r, false);
                return Ok(LogOutcome::Retry);
            }
        }
        log.committed(&r, row, first, &masks);
        Ok(LogOutcome::Logged(r))
    }

    /// Whether a write of `row` since the last flush has a live entry.
    pub fn row_has_live_log(&self, row: u64) -> bool {
        let sectors = (self.geo.chunk / SECTOR) as u32;
        self.log
            .as_ref()
            .is_some_and(|l| l.live_masks(row, 0, sectors).iter().any(|m| *m != 0))
    }

    /// Whether `row` has any entry since the last flush, live or made
    /// stable since: a whole-row write of it then needs an entry too.
    pub fn row_has_entry(&self, row: u64) -> bool {
        let sectors = (self.geo.chunk / SECTOR) as u32;
        self.row_has_live_log(row)
            || self
                .log
                .as_ref()
                .is_some_and(|l| l.has_entry(row, 0, sectors))
    }

    /// Flushes every member; then retires log entries and cleans bitmap
    /// regions the flush made stable.
    pub fn flush_all(&self) -> io::Result<()> {
        let _one = self.log.as_ref().map(|l| l.flush_lock.lock());
        self.bitmap.flush_started();
        let epoch = self.log.as_ref().map(|l| l.begin_flush());
        for (slot, m) in self.members().iter().enumerate() {
            let Some(m) = m else { continue };
            if m.is_failed() {
                continue;
            }
            if let Err(e) = m.flush() {
                self.fail_member(slot, m, &e);
            }
        }
        if !self.survives() {
            return Err(array_failed());
        }
        if let (Some(log), Some(epoch)) = (&self.log, epoch) {
            if log.any_live_through(epoch) {
                self.write_log_header(epoch)?;
                log.retire(epoch);
            }
        }
        self.with_bitmap_writer(|w| self.bitmap.flush_done(w))
    }

    fn write_log_header(&self, retired: u64) -> io::Result<()> {
        let copy = encode_header(self.array_id, retired);
        let mut written = 0;
        for (slot, m) in self.members().iter().enumerate() {
            let Some(m) = m.as_ref().filter(|m| !m.is_failed()) else {
                continue;
            };
            // One copy after the other: a cut tears at most one.
            let r = m
                .dev
                .write_at(&copy, LOG_OFFSET, true)
                .and_then(|()| m.dev.write_at(&copy, LOG_OFFSET + 2048, true));
            match r {
                Ok(()) => written += 1,
                Err(e) => self.fail_member(slot, m, &e),
            }
        }
        if written == 0 {
            return Err(array_failed());
        }
        Ok(())
    }

    /// Writes an empty log (nothing to replay) on every member.
    pub fn init_log(&self) -> io::Result<()> {
        if self.log.is_some() {
            self.write_log_header(0)?;
        }
        Ok(())
    }

    /// At assembly: makes every row with a live entry consistent, rebuilding
    /// missing untouched columns from their partial parity, then voids the
    /// entries. Returns the log to run with and the sectors repaired.
    pub fn replay_log(&self, slots: u32) -> io::Result<(Log, u64)> {
        let g = self.geo;
        let mut retired = 0;
        let mut entries: Vec<Entry> = Vec::new();
        for m in self.members().iter().flatten().filter(|m| m.is_in_sync()) {
            let mut head = vec![0u8; 4096];
            m.dev.read_at(&mut head, LOG_OFFSET)?;
            retired = retired.max(decode_header(&head, self.array_id).unwrap_or(0));
            let mut buf = vec![0u8; log_slot_bytes(g.chunk) as usize];
            for s in 0..slots {
                m.dev.read_at(&mut buf, self.slot_offset(s))?;
                if let Some(e) = Entry::decode(&buf, self.array_id) {
                    entries.push(e);
                }
            }
        }
        let max_epoch = entries
            .iter()
            .map(|e| e.epoch)
            .max()
            .unwrap_or(0)
            .max(retired);
        let max_seq = entries.iter().map(|e| e.seq).max().unwrap_or(0);
        // The newest entry of each sector.
        let mut newest: HashMap<(u64, u32), (u64, usize, usize)> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            if e.epoch <= retired {
                continue;
            }
            for p in 0..e.masks.len() {
                let key = (e.row, e.first_sector + p as u32);
                if newest.get(&key).is_none_or(|(seq, _, _)| *seq < e.seq) {
                    newest.insert(key, (e.seq, i, p));
                }
            }
        }
        let mut repaired = 0;
        for ((row, sector), (_, i, p)) in newest {
            let e = &entries[i];
            let pr = p * SECTOR as usize..(p + 1) * SECTOR as usize;
            let pq = e.pq.as_ref().map(|q| &q[pr.clone()]);
            self.replay_sector(
                row,
                sector as u64 * SECTOR,
                e.masks[p],
                &e.pp[pr.clone()],
                pq,
            )?;
            repaired += 1;
        }
        if repaired > 0 || max_epoch > retired {
            for (slot, m) in self.members().iter().enumerate() {
                if let Some(m) = m.as_ref().filter(|m| !m.is_failed()) {
                    if let Err(e) = m.flush() {
                        self.fail_member(slot, m, &e);
                    }
                }
            }
            self.write_log_header(max_epoch)?;
        }
        Ok((Log::new(slots, max_epoch, max_seq), repaired))
    }

    fn replay_sector(
        &self,
        row: u64,
        lo: u64,
        written: u64,
        pp: &[u8],
        pq: Option<&[u8]>,
    ) -> io::Result<()> {
        let g = self.geo;
        let d = g.data_columns();
        let len = SECTOR as usize;
        let rr = self.region_rows();
        let members = self.members();
        let readable = |slot: usize| members[slot].as_ref().is_some_and(|m| m.readable(row, rr));
        let read = |slot: usize| -> io::Result<Vec<u8>> {
            let mut b = vec![0u8; len];
            members[slot].as_ref().expect("readable").read_for(
                Origin::Background,
                &mut b,
                row * g.chunk + lo,
            )?;
            Ok(b)
        };
        let mut data: Vec<Option<Vec<u8>>> = Vec::with_capacity(d);
        for c in 0..d {
            let slot = g.data_member(row, c);
            data.push(if readable(slot) {
                Some(read(slot)?)
            } else {
                None
            });
        }
        // Missing columns nobody wrote: from the partial parity, with the
        // written columns counting as zeros.
        if (0..d).any(|c| data[c].is_none() && written & (1 << c) == 0) {
            let zeros = vec![0u8; len];
            let cols: Vec<Option<&[u8]>> = (0..d)
                .map(|c| {
                    if written & (1 << c) != 0 {
                        Some(&zeros[..])
                    } else {
                        data[c].as_deref()
                    }
                })
                .collect();
            let rebuilt = self.rebuild_columns(&cols, Some(pp), pq)?;
            for (c, col) in rebuilt {
                data[c] = Some(col);
            }
        }
        // Missing written columns: whatever the parity on disk says.
        if data.iter().any(|c| c.is_none()) {
            let p = readable(g.p_member(row))
                .then(|| read(g.p_member(row)))
                .transpose()?;
            let q = (g.level.parity() == 2 && readable(g.q_member(row)))
                .then(|| read(g.q_member(row)))
                .transpose()?;
            let cols: Vec<Option<&[u8]>> = data.iter().map(|c| c.as_deref()).collect();
            let rebuilt = self.rebuild_columns(&cols, p.as_deref(), q.as_deref())?;
            for (c, col) in rebuilt {
                data[c] = Some(col);
            }
        }
        let cols: Vec<&[u8]> = data
            .iter()
            .map(|c| c.as_deref().expect("complete"))
            .collect();
        let mut p = vec![0u8; len];
        gf::p_of(&cols, &mut p);
        let mut targets = vec![(g.p_member(row), p)];
        if g.level.parity() == 2 {
            let mut q = vec![0u8; len];
            gf::q_of(&cols.iter().map(|c| Some(*c)).collect::<Vec<_>>(), &mut q);
            targets.push((g.q_member(row), q));
        }
        for (slot, bytes) in targets {
            if let Some(m) = members[slot].as_ref().filter(|m| !m.is_failed()) {
                m.write_for(Origin::Background, &bytes, row * g.chunk + lo, false)?;
            }
        }
        Ok(())
    }
}
